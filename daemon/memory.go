package daemon

import (
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/classify"
	"github.com/gpuarb/gpuarb/control"
	"github.com/gpuarb/gpuarb/enforce"
	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/policy"
)

// memoryTarget is where a policy tenant's GPU memory limit applies
// (classify.Selected); ok is false for a tenant without a limit, or one
// none of whose processes can be named yet. Reads the cgroup filesystem:
// called without d.mu.
func (d *Daemon) memoryTarget(t policy.Tenant, tree []int, seen []uint64) (enforce.MemoryTarget, bool) {
	if t.MemoryLimit.IsZero() {
		return enforce.MemoryTarget{}, false
	}
	pids, cgroups := classify.Selected(t, tree, seen, d.mount)
	return enforce.MemoryTarget{Limit: t.MemoryLimit, PIDs: pids, Cgroups: cgroups}, len(pids)+len(cgroups) > 0
}

// syncMemory holds exactly the policy's limited tenants to their GPU
// memory limits (cfg, with the pid tenants' trees; a container tenant by
// the cgroups found holds its processes), and every other cgroup to the
// defaults' limit. It returns what each limited tenant the step found
// holds and what the limits did: a default tenant's from its cgroup's
// charges. Called under stepMu, without d.mu.
func (d *Daemon) syncMemory(cfg *policy.Config, trees map[int][]int, found map[string]*control.Tenant) map[string]enforce.MemoryUsage {
	targets := map[string]enforce.MemoryTarget{}
	for _, t := range cfg.Tenants {
		var seen []uint64
		if ct := found[t.Name]; ct != nil && t.PID == 0 {
			seen = ct.CgroupIDs
		}
		if target, ok := d.memoryTarget(t, trees[t.PID], seen); ok {
			targets[t.Name] = target
		}
	}
	if err := d.memory.Sync(targets); err != nil {
		d.log.Warn("GPU memory limits", "err", err)
	}
	usage := d.memory.Usage()
	if d.probes == nil {
		return usage
	}
	if err := d.probes.SetDefaultMemoryLimit(uint64(cfg.Defaults.MemoryLimit.Bytes), cfg.Defaults.MemoryLimit.Share); err != nil {
		d.log.Warn("GPU memory limits", "err", err)
	}
	byCgroup, err := d.probes.DefaultMemoryUsage()
	if err != nil {
		d.log.Warn("GPU memory limits", "err", err)
		return usage
	}
	for name, ct := range found {
		if _, listed := cfg.Tenant(name); listed || cfg.Defaults.MemoryLimit.IsZero() {
			continue
		}
		u := enforce.MemoryUsage{Limit: cfg.Defaults.MemoryLimit, Charged: map[int]uint64{}, Kills: map[int]uint64{}}
		for _, id := range ct.CgroupIDs {
			for gpu, b := range byCgroup[id].Charged {
				u.Charged[gpu] += b
			}
			for gpu, n := range byCgroup[id].Kills {
				u.Kills[gpu] += n
			}
		}
		usage[name] = u
	}
	if err := d.probes.ForgetMemoryCgroups(func(id uint64) bool { return d.resolver != nil && d.resolver.Path(id) == "" }); err != nil {
		d.log.Warn("GPU memory limits", "err", err)
	}
	return usage
}

// limitMemoryNow holds cfg's GPU memory limits at once, before processes
// allocate: a new policy's limits hold from its change (or the daemon's
// start), not from the next control step (late for a container's first
// allocations). A limit the change removed goes at that step. Called
// under stepMu (or before the control loop runs), without d.mu.
func (d *Daemon) limitMemoryNow(cfg *policy.Config) {
	if d.probes != nil {
		if err := d.probes.SetDefaultMemoryLimit(uint64(cfg.Defaults.MemoryLimit.Bytes), cfg.Defaults.MemoryLimit.Share); err != nil {
			d.log.Warn("GPU memory limits", "err", err)
		}
	}
	for _, t := range cfg.Tenants {
		if !t.MemoryLimit.IsZero() {
			d.limitTenantMemory(t)
		}
	}
}

// limitTenantMemory makes or updates one policy tenant's limit.
func (d *Daemon) limitTenantMemory(t policy.Tenant) {
	var tree []int
	if t.PID != 0 {
		tree = d.pidTrees([]int{t.PID})[t.PID]
	}
	target, ok := d.memoryTarget(t, tree, nil)
	if !ok {
		return
	}
	if err := d.memory.Set(t.Name, target); err != nil {
		d.log.Warn("GPU memory limit", "tenant", t.Name, "err", err)
	}
}

// noteOOMKill logs a process the probes killed at an allocation past its
// tenant's GPU memory limit: a slot's tenant, or under the defaults' limit
// the default tenant of its cgroup.
func (d *Daemon) noteOOMKill(e *ioctlspy.MemoryAllocated) {
	h := e.Hdr()
	tenant := d.memory.Owner(e.LimitSlot)
	if e.LimitSlot == uint32(bpf.MemorySlots) {
		path := ""
		if d.resolver != nil {
			path = d.resolver.Path(h.CgroupID)
		}
		tenant = classify.DefaultName(path, h.CgroupID)
	}
	d.log.Warn("GPU memory limit: process killed at an allocation past it", "tenant", tenant,
		"pid", h.PID, "comm", h.Comm, "gpu", e.GPU, "bytes", e.Bytes, "charged", e.Charged, "limit", e.Limit)
}
