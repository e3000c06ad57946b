package daemon

import (
	"fmt"
	"strings"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/control"
	"github.com/gpuarb/gpuarb/meter"
	"github.com/gpuarb/gpuarb/policy"
)

// classifier assigns processes to tenants for one control step.
type classifier struct {
	cfg      *policy.Config
	mount    string
	resolver *cgroup.Resolver
	trees    map[int]map[int]bool // pid tenant root -> its process tree
}

// newClassifier classifies by cfg; pidStarts pins its pid tenants to their
// processes (Daemon.pidStarts): a pid tenant whose process is gone, its
// pid perhaps another's by now, holds no process. tree lists a pid
// tenant's processes (Daemon.pidTrees).
func newClassifier(cfg *policy.Config, mount string, r *cgroup.Resolver, pidStarts map[int]uint64, tree func(root int) []int) *classifier {
	c := &classifier{cfg: cfg, mount: mount, resolver: r, trees: map[int]map[int]bool{}}
	for _, t := range cfg.Tenants {
		if t.PID != 0 && pidStarts[t.PID] != 0 && pidStart(t.PID) == pidStarts[t.PID] {
			c.trees[t.PID] = map[int]bool{}
			for _, p := range tree(t.PID) {
				c.trees[t.PID][p] = true
			}
		}
	}
	return c
}

// classify returns the tenant a process belongs to: a pid tenant whose
// tree holds it, a cgroup or container tenant whose cgroup holds it, or the
// default tenant of its own cgroup.
func (c *classifier) classify(pid uint32, cgroupID uint64) (name string, rules policy.Rules, cgPath string, rootPID int) {
	path := ""
	if c.resolver != nil {
		path = c.resolver.Path(cgroupID)
	}
	for _, t := range c.cfg.Tenants {
		switch {
		case t.PID != 0 && c.trees[t.PID][int(pid)]:
			return t.Name, t.Rules, "", t.PID
		case t.Cgroup != "" && path != "" && under(path, normalizeCgroup(t.Cgroup, c.mount)):
			return t.Name, t.Rules, normalizeCgroup(t.Cgroup, c.mount), 0
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

// normalizeCgroup accepts a path as in /proc/PID/cgroup or a full path
// under the cgroup mount, and returns the former.
func normalizeCgroup(p, mount string) string {
	if mount != "" {
		if rel, ok := strings.CutPrefix(p, mount); ok && (rel == "" || rel[0] == '/') {
			p = rel
		}
	}
	return "/" + strings.Trim(p, "/")
}

func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// pidTrees returns the processes of the pid tenants rooted at roots
// (bpf.TreeFollower). Called by the control loop (under stepMu), which
// owns d.trees.
func (d *Daemon) pidTrees(roots []int) map[int][]int {
	if d.trees == nil {
		d.trees = bpf.NewTreeFollower(d.probes)
	}
	out, err := d.trees.Trees(roots)
	if err != nil {
		d.log.Warn("follow pid tenants", "err", err)
	}
	return out
}

// meterUnprobed hands the meter the live processes that have GPU channel
// groups but map no libcuda the probes could attach to (ioctlspy's
// Unprobed): their launches are unseen, so the meter models each as busy
// whenever it may run. It logs each one once and returns them.
func (d *Daemon) meterUnprobed() map[uint32]bool {
	out := map[uint32]bool{}
	if d.spy == nil {
		return out
	}
	now := meter.MonotonicNow()
	for _, p := range d.spy.Unprobed() {
		if cgroup.Gone(int(p.PID)) {
			continue
		}
		out[p.PID] = true
		d.meter.SetUnprobed(p.PID, p.CgroupID, int(p.Groups()[0].GPU), now)
		if !d.unprobed[p.PID] {
			d.log.Warn("a process uses the GPU through a driver gpuarb does not probe: it is metered as busy whenever it may run and held by pausing its channel groups or freezing it",
				"pid", p.PID, "comm", p.Comm)
		}
	}
	d.unprobed = out
	return out
}

// assign is the classifier as control.Step takes it.
func (c *classifier) assign(pid uint32, cgroupID uint64) control.Assignment {
	name, rules, cg, root := c.classify(pid, cgroupID)
	return control.Assignment{Name: name, Rules: rules, Cgroup: cg, PID: root}
}
