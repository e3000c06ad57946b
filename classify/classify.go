// Package classify assigns processes to tenants by the policy: a pid
// tenant's process tree, a cgroup or container tenant's cgroup, or else
// the default tenant of the process's own cgroup, and names and labels
// those default tenants.
package classify

import (
	"fmt"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
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

// Reshaped tells whether a policy change touches the tenant name (of
// cgroup path cg, for a default tenant): its entry was
// added, removed or changed, or what applies to every tenant changed
// (period, defaults, GPUs). A tenant no entry names (a cgroup gpuarb found
// by itself) is touched only by an entry, added or changed, that now
// selects its processes: others come and go (containers start and stop)
// while it stays gated.
func Reshaped(old, cfg *policy.Config, name, cg, mount string, pidCgroups map[int]string) bool {
	if old.Period != cfg.Period || !reflect.DeepEqual(old.Defaults, cfg.Defaults) || !reflect.DeepEqual(old.GPUs, cfg.GPUs) {
		return true
	}
	was, inOld := old.Tenant(name)
	is, inNew := cfg.Tenant(name)
	if inOld || inNew {
		return inOld != inNew || !reflect.DeepEqual(was, is)
	}
	for _, e := range cfg.Tenants {
		if prev, ok := old.Tenant(e.Name); ok && reflect.DeepEqual(prev, e) {
			continue
		}
		if selectsDefault(e, cg, mount, pidCgroups) {
			return true
		}
	}
	return false
}

// selectsDefault tells whether entry e may take processes of the default
// tenant of cgroup path cg: a cgroup entry at or above it, a container
// entry whose id it names, a pid entry whose root runs at, above or below
// it (its tree may be anywhere under the root's cgroup; pidCgroups has
// the roots' cgroups, ReadPIDTenants). A cgroup gpuarb shows by id only
// (no path), or a root whose cgroup is unknown, is taken to be selected.
func selectsDefault(e policy.Tenant, cg, mount string, pidCgroups map[int]string) bool {
	if !strings.HasPrefix(cg, "/") {
		return true
	}
	switch {
	case e.Cgroup != "":
		return Under(cg, NormalizeCgroup(e.Cgroup, mount))
	case e.ContainerID != "":
		return strings.Contains(cg, e.ContainerID)
	case e.PID != 0:
		root, ok := pidCgroups[e.PID]
		return !ok || Under(cg, root) || Under(root, cg)
	}
	return true
}

// PIDTenants are what the host says of a policy's pid tenants: the cgroup
// and start time of the process each pid names (none when it has none).
type PIDTenants struct {
	Cgroups map[int]string
	Starts  map[int]uint64
}

// ReadPIDTenants reads cfg's pid tenants' processes.
func ReadPIDTenants(cfg *policy.Config) PIDTenants {
	host := PIDTenants{Cgroups: map[int]string{}, Starts: map[int]uint64{}}
	for _, t := range cfg.Tenants {
		if t.PID == 0 {
			continue
		}
		if cg, err := cgroup.ProcessPath(t.PID); err == nil {
			host.Cgroups[t.PID] = cg
		}
		host.Starts[t.PID] = PIDStart(t.PID)
	}
	return host
}

// Selected are the processes or cgroups a policy entry holds: a pid
// tenant's tree; a cgroup tenant's cgroup (with what is below it, while it
// exists) and the cgroups its processes were seen in (seen: a container
// tenant's, found by its id).
func Selected(t policy.Tenant, tree []int, seen []uint64, mount string) (pids []int, cgroups []uint64) {
	if t.PID != 0 {
		return tree, nil
	}
	if t.Cgroup != "" && mount != "" {
		if id, err := cgroup.ID(filepath.Join(mount, NormalizeCgroup(t.Cgroup, mount))); err == nil {
			cgroups = append(cgroups, id)
		}
	}
	for _, id := range seen {
		if !slices.Contains(cgroups, id) {
			cgroups = append(cgroups, id)
		}
	}
	return nil, cgroups
}
