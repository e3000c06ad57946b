package daemon

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/enforce"
	"github.com/gpuarb/gpuarb/policy"
)

// actOn passes a tenant's decision to its actuators: in scheduler mode a
// pauser over its channel groups; otherwise, below duty 1, the launch gate
// or freeze gater (a tenant with unprobed processes at a period of at
// least unprobedPeriod). It returns what must run once the daemon's lock
// is released. Called with d.mu held.
func (d *Daemon) actOn(ctx context.Context, t *tenant, scheduled bool, duty, offset float64, paced bool,
	period time.Duration) func() {
	if !scheduled && len(t.unprobed) > 0 {
		period = max(period, unprobedPeriod)
	}
	return t.act.Apply(ctx, enforce.Decision{Scheduled: scheduled, Duty: duty, Offset: offset, Paced: paced, Period: period},
		enforce.Gates{
			Gate:   func() (cgroup.Gate, error) { return d.gateFor(t) },
			Launch: func() (*bpf.LaunchGate, error) { return d.newLaunchGate(t) },
			CgroupIDs: func() []uint64 {
				return slices.Collect(maps.Keys(t.cgroupIDs))
			},
		})
}

// member is a process a control step found, with its tenant.
type member struct {
	pid    uint32
	cgroup uint64
	tenant *tenant
}

// wakers finds the gater to wake when a process is held at a launch gate:
// by its pid, or (a process the meter has not seen yet) by its cgroup.
type wakers struct {
	byPID    map[uint32]*enforce.Gater
	byCgroup map[uint64]*enforce.Gater
}

func newWakers(seen []member) *wakers {
	w := &wakers{byPID: map[uint32]*enforce.Gater{}, byCgroup: map[uint64]*enforce.Gater{}}
	for _, m := range seen {
		g := m.tenant.act.Gater()
		if g == nil {
			continue
		}
		w.byPID[m.pid] = g
		if m.tenant.cgroup != "" {
			w.byCgroup[m.cgroup] = g
		}
	}
	return w
}

// wake wakes the gater of a process just held.
func (w *wakers) wake(pid uint32, cgroupID uint64) {
	g := w.byPID[pid]
	if g == nil {
		g = w.byCgroup[cgroupID]
	}
	if g != nil {
		g.Wake()
	}
}

// gateFor makes the freeze gate of a tenant, refusing what must never be
// stopped.
func (d *Daemon) gateFor(t *tenant) (cgroup.Gate, error) {
	return enforce.FreezeGate(enforce.GateTarget{PID: t.pid, Attached: t.pid == 0 || pidStart(t.pid) == d.pidStarts[t.pid],
		Tree: t.act.Tree.Load, Cgroup: t.cgroup, AnyPID: t.anyPID}, d.mode, d.mount, d.ledger)
}

// latencyCgroups are the latency tenants' cgroups, whose processes hold
// the others at a launch before a step has seen them (holdPlan): a cgroup
// tenant's own (while it exists), and every cgroup a latency tenant's
// processes were seen in. Called with d.mu held.
func (d *Daemon) latencyCgroups(cfg *policy.Config) []uint64 {
	ids := map[uint64]bool{}
	for _, t := range cfg.Tenants {
		if t.Rules.Priority != policy.Latency || t.Cgroup == "" {
			continue
		}
		if id, err := cgroup.ID(filepath.Join(d.mount, normalizeCgroup(t.Cgroup, d.mount))); err == nil {
			ids[id] = true
		}
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
func (d *Daemon) newLaunchGate(t *tenant) (*bpf.LaunchGate, error) {
	var pids []int
	if t.pid != 0 {
		pids = d.pidTrees([]int{t.pid})[t.pid]
	}
	return enforce.NewProbesLaunchGate(d.probes, d.mount, t.cgroup, pids)
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
