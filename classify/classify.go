// Package classify assigns processes to tenants by the policy: a pid
// tenant's process tree, a cgroup or container tenant's cgroup, or else
// the default tenant of the process's own cgroup, and names and labels
// those default tenants.
package classify

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/control"
	"github.com/gpuarb/gpuarb/policy"
)

// Classifier assigns processes to tenants for one control step.
type Classifier struct {
	cfg      *policy.Config
	mount    string
	resolver *cgroup.Resolver
	// Trees are the pid tenants' processes: root -> its process tree.
	Trees map[int]map[int]bool
}

// New classifies by cfg, with the cgroup v2 mount and a resolver of cgroup
// ids to paths (nil: ids only). pinned pins its pid tenants to their
// processes by start time: a pid tenant whose process is gone, its pid
// perhaps another's by now, holds no process. tree lists a pid tenant's
// processes.
func New(cfg *policy.Config, mount string, r *cgroup.Resolver, pinned map[int]uint64, tree func(root int) []int) *Classifier {
	c := &Classifier{cfg: cfg, mount: mount, resolver: r, Trees: map[int]map[int]bool{}}
	for _, t := range cfg.Tenants {
		if t.PID != 0 && pinned[t.PID] != 0 && PIDStart(t.PID) == pinned[t.PID] {
			c.Trees[t.PID] = map[int]bool{}
			for _, p := range tree(t.PID) {
				c.Trees[t.PID][p] = true
			}
		}
	}
	return c
}

// PIDStart is the start time of the process pid names, 0 (no process
// starts at 0) when there is none.
func PIDStart(pid int) uint64 {
	start, err := cgroup.StartTime(pid)
	if err != nil {
		return 0
	}
	return start
}

// Classify returns the tenant a process belongs to: a pid tenant whose
// tree holds it, a cgroup or container tenant whose cgroup holds it, or the
// default tenant of its own cgroup.
func (c *Classifier) Classify(pid uint32, cgroupID uint64) (name string, rules policy.Rules, cgPath string, rootPID int) {
	path := ""
	if c.resolver != nil {
		path = c.resolver.Path(cgroupID)
	}
	for _, t := range c.cfg.Tenants {
		switch {
		case t.PID != 0 && c.Trees[t.PID][int(pid)]:
			return t.Name, t.Rules, "", t.PID
		case t.Cgroup != "" && path != "" && Under(path, NormalizeCgroup(t.Cgroup, c.mount)):
			return t.Name, t.Rules, NormalizeCgroup(t.Cgroup, c.mount), 0
		case t.ContainerID != "" && path != "" && strings.Contains(path, t.ContainerID):
			return t.Name, t.Rules, path, 0
		}
	}
	name = DefaultName(path, cgroupID)
	if path == "" {
		path = fmt.Sprintf("cgroup:%d", cgroupID)
	}
	return name, c.cfg.Defaults, path, 0
}

// NormalizeCgroup accepts a path as in /proc/PID/cgroup or a full path
// under the cgroup mount, and returns the former.
func NormalizeCgroup(p, mount string) string {
	if mount != "" {
		if rel, ok := strings.CutPrefix(p, mount); ok && (rel == "" || rel[0] == '/') {
			p = rel
		}
	}
	return "/" + strings.Trim(p, "/")
}

// Under tells whether cgroup path is dir or below it.
func Under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// Assign is the classifier as control.Step takes it.
func (c *Classifier) Assign(pid uint32, cgroupID uint64) control.Assignment {
	name, rules, cg, root := c.Classify(pid, cgroupID)
	return control.Assignment{Name: name, Rules: rules, Cgroup: cg, PID: root}
}

// containerID matches the 64-hex container ids runtimes put in cgroup
// paths: /docker/<id>, docker-<id>.scope, cri-containerd-<id>.scope,
// crio-<id>.scope, libpod-<id>.scope, /kubepods/.../<id>.
var containerID = regexp.MustCompile(`(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$`)

// DefaultName names the tenant of a cgroup no policy entry names: its path,
// or "cgroup id N" where the path is unknown. Such a name is one cgroup's
// alone, and no other tenant's can equal it: the names of policy entries,
// attachments and workloads have neither '/' nor spaces.
func DefaultName(cgroupPath string, cgroupID uint64) string {
	if cgroupPath == "" {
		return fmt.Sprintf("cgroup id %d", cgroupID)
	}
	return cgroupPath
}

// Label is what the tables show of a default tenant: its container (the
// short id) or, for other cgroups, its systemd unit or path. Two tenants
// may share a label: it is for display only, never a key.
func Label(cgroupPath string) string {
	if m := containerID.FindStringSubmatch(cgroupPath); m != nil {
		return m[1][:12]
	}
	if cgroupPath == "" {
		return "?"
	}
	if cgroupPath == "/" {
		return "/"
	}
	// A systemd unit reads better without its parents: user.slice/... -> unit.
	base := path.Base(cgroupPath)
	if strings.HasSuffix(base, ".service") || strings.HasSuffix(base, ".scope") {
		return base
	}
	return cgroupPath
}

// PodCgroup tells whether a cgroup path lies under the kubelet's pods
// (cgroupfs "/kubepods/...", systemd "/kubepods.slice/...").
func PodCgroup(cgroupPath string) bool {
	first, _, _ := strings.Cut(strings.TrimPrefix(cgroupPath, "/"), "/")
	return first == "kubepods" || first == "kubepods.slice"
}
