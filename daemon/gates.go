package daemon

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/classify"
	"github.com/gpuarb/gpuarb/enforce"
	"github.com/gpuarb/gpuarb/policy"
)

// tenantStep is a control step's decision for one tenant with what its
// actuators need of the tenant, read under the daemon's lock and applied
// after it.
type tenantStep struct {
	act      *enforce.Tenant
	name     string
	decision enforce.Decision
	pid      int    // a pid tenant's root
	tree     []int  // a pid tenant's processes
	pinned   uint64 // the start time its pid was pinned to
	cgroup   string // a cgroup tenant's path
	anyPID   int
	unprobed bool // it has processes the probes do not see
	// cgroupIDs are its cgroups, whose submitted work and freezes the
	// meter counts.
	cgroupIDs []uint64
}

// stepOf reads what tenant t's actuators need. Called with d.mu held.
func (d *Daemon) stepOf(t *tenant, period time.Duration) tenantStep {
	return tenantStep{act: t.act, name: t.name, decision: enforce.Decision{Period: period},
		pid: t.pid, pinned: d.pidStarts[t.pid], cgroup: t.cgroup, anyPID: t.anyPID, unprobed: len(t.unprobed) > 0,
		cgroupIDs: slices.Collect(maps.Keys(t.cgroupIDs))}
}

// apply passes a tenant's decision to its actuators: in scheduler mode a
// pauser over its channel groups; otherwise, below duty 1, the launch gate
// or freeze gater (a tenant with unprobed processes at a period of at
// least the unprobed-period tunable: a freeze reaches only what it has not
// submitted yet, so its periods must be long beside its queue). It returns the wait for the actuators it ended.
// Called without d.mu: it writes the ledger and the launch gate's maps.
func (d *Daemon) apply(ctx context.Context, s tenantStep) func() {
	if s.pid != 0 {
		if err := s.act.SetTreeMembers(s.tree); err != nil {
			d.log.Warn("launch gate", "tenant", s.name, "err", err)
		}
	}
	dec := s.decision
	if !dec.Scheduled && s.unprobed {
		dec.Period = max(dec.Period, d.cfg.Tuning.UnprobedPeriod)
	}
	return s.act.Apply(ctx, dec, enforce.GateMakers{
		Gate:      func() (cgroup.Gate, error) { return d.gateFor(s) },
		Launch:    func() (*bpf.LaunchGate, error) { return d.newLaunchGate(s) },
		CgroupIDs: func() []uint64 { return s.cgroupIDs },
	})
}

// gateFor makes the freeze gate of a tenant, refusing what must never be
// stopped.
func (d *Daemon) gateFor(s tenantStep) (cgroup.Gate, error) {
	return enforce.FreezeGate(enforce.GateTarget{PID: s.pid, Attached: s.pid == 0 || classify.PIDStart(s.pid) == s.pinned,
		Tree: s.act.Tree.Load, Cgroup: s.cgroup, AnyPID: s.anyPID}, d.mode, d.mount, d.ledger)
}

// latencyCgroupIDs are the cgroups of the latency tenants the policy
// names by cgroup, as far as they exist.
func (d *Daemon) latencyCgroupIDs(cfg *policy.Config) []uint64 {
	var ids []uint64
	for _, t := range cfg.Tenants {
		if t.Rules.Priority != policy.Latency || t.Cgroup == "" {
			continue
		}
		if id, err := cgroup.ID(filepath.Join(d.mount, classify.NormalizeCgroup(t.Cgroup, d.mount))); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// latencyCgroups are the latency tenants' cgroups, whose processes hold
// the others at a launch before a step has seen them (holdPlan): a cgroup
// tenant's own (named, latencyCgroupIDs), and every cgroup a latency
// tenant's processes were seen in. Called with d.mu held.
func (d *Daemon) latencyCgroups(named []uint64) []uint64 {
	ids := map[uint64]bool{}
	for _, id := range named {
		ids[id] = true
	}
	for _, t := range d.tenants {
		if t.rules.Priority == policy.Latency {
			for id := range t.cgroupIDs {
				ids[id] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(ids))
}

// newLaunchGate makes the launch gate of a tenant: its cgroup (and what is
// below it), or the processes of its tree.
func (d *Daemon) newLaunchGate(s tenantStep) (*bpf.LaunchGate, error) {
	var pids []int
	if s.pid != 0 {
		pids = d.pidTrees([]int{s.pid})[s.pid]
	}
	return enforce.NewProbesLaunchGate(d.probes, d.mount, s.cgroup, pids)
}

// stopAllGates resumes every tenant: gaters and pausers end, timeslices
// are restored.
func (d *Daemon) stopAllGates() {
	// No hold starts after this; one under way ends within maxHold, or
	// here, where enforce.Steering.PutBackAll resumes its groups.
	if d.hold != nil {
		d.hold.SetPlan(&enforce.HoldPlan{})
	}
	d.mu.Lock()
	var finish []func()
	for _, t := range d.tenants {
		finish = append(finish, t.act.Release())
	}
	d.mu.Unlock()
	for _, f := range finish {
		f()
	}
	if err := d.steer.PutBackAll(); err != nil {
		d.log.Warn("gpu scheduler: putting channel groups back", "err", err)
	}
}
