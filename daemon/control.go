package daemon

import (
	"context"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/gpuarb/gpuarb/arbiter"
	"github.com/gpuarb/gpuarb/classify"
	"github.com/gpuarb/gpuarb/control"
	"github.com/gpuarb/gpuarb/enforce"
	"github.com/gpuarb/gpuarb/gpusched"
	"github.com/gpuarb/gpuarb/meter"
	"github.com/gpuarb/gpuarb/policy"
)

// tenant is one arbitrated tenant: a named policy entry, or a cgroup that
// no entry names (default rules).
type tenant struct {
	name   string
	rules  policy.Rules
	cgroup string // cgroup v2 path, "" for a pid tenant
	pid    int    // pid tenant: the root of the process tree

	cgroupIDs map[uint64]bool // cgroups its processes were seen in
	anyPID    int             // one of its processes
	decisions map[int]arbiter.Decision
	totals    map[int]meter.Totals // per GPU, cumulative: the Prometheus counters
	lastSeen  time.Time
	// act holds it to its decisions (pauser, launch gate, freeze).
	act *enforce.Tenant
	// unprobed are its processes that use the GPU through a driver no
	// probe sees (Daemon.meterUnprobed): it is held by pausing its groups
	// or freezing it, never paced at the launch gate, which they pass.
	unprobed []int
}

// controlWindow is the span of the shares the arbiter steers by: long
// enough to average over a hog's deep queue and a closed loop's bursts,
// short enough to react within a second, and never longer than the meter
// keeps (tuning: min-control-window).
func (d *Daemon) controlWindow() time.Duration {
	return min(max(3*d.period(), d.cfg.Tuning.MinControlWindow), d.cfg.Window)
}

func (d *Daemon) period() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.policy.Period
}

// control runs one control period: measure (the meter, the channel groups
// the probes saw), decide (control.Step, the arbiter), act (the GPU's own
// scheduler where it can be steered, else the launch gate or the freeze).
// What talks to the driver or waits for a gater runs without the daemon's
// lock.
func (d *Daemon) control(ctx context.Context) {
	now := time.Now()
	window := d.controlWindow()
	d.mu.Lock()
	cfg, enforcing := d.policy, d.enforcing
	pidStarts := maps.Clone(d.pidStarts)
	heldBack := map[string]bool{}
	for name, t := range d.tenants {
		heldBack[name] = t.act.HeldSince(now.Add(-window))
	}
	d.mu.Unlock()
	var roots []int
	for _, t := range cfg.Tenants {
		if t.PID != 0 {
			roots = append(roots, t.PID)
		}
	}
	trees := d.pidTrees(roots)
	cl := classify.New(cfg, d.mount, d.resolver, pidStarts, func(root int) []int { return trees[root] })
	unprobed := d.meterUnprobed()
	_, short := d.meter.Contexts(window)
	_, long := d.meter.Contexts(d.cfg.Window)
	res := control.Step(control.Input{Window: window, Settled: d.cfg.Window, Short: short, Long: long, Assign: cl.Assign,
		HeldBack: func(name string) bool { return heldBack[name] }})
	memory := d.syncMemory(cfg, trees, res.Tenants)
	groups, refused := d.groupsOf(res)
	d.driverMem.Ask(groups, func(name string) []uint32 { return res.Tenants[name].LivePIDs() })
	for i, in := range res.Inputs {
		if n := len(groups[in.Name][in.GPU]); n > 0 {
			res.Inputs[i].Groups = n
		}
	}
	actuation, gpuSlices, unsteered := d.actuations(cfg, res, groups)
	for k := range refused {
		unsteered[k] = true
	}
	for i, in := range res.Inputs {
		u := actuation[in.GPU] == arbiter.Scheduler && unsteered[tenantGPU{in.Name, in.GPU}]
		res.Inputs[i].Unsteered = u
		res.Tenants[in.Name].GPUs[in.GPU].Unsteered = u // what status shows
	}
	unprobedOf := map[string][]int{} // per tenant, sorted
	for name, ct := range res.Tenants {
		for _, m := range ct.Members {
			if unprobed[m.PID] && !m.Exited {
				unprobedOf[name] = append(unprobedOf[name], int(m.PID))
			}
		}
		slices.Sort(unprobedOf[name])
	}
	for i := range res.Inputs {
		res.Inputs[i].Unprobed = len(unprobedOf[res.Inputs[i].Name]) > 0
	}
	snap := d.meter.Snapshot()
	latencyIDs := d.latencyCgroupIDs(cfg)

	d.mu.Lock()
	if d.policy != cfg || d.enforcing != enforcing {
		// The policy changed while this step classified by the old one:
		// acting on it would gate tenants by entries that are gone (a
		// removed cgroup, refused and then never gated again). The next
		// period steps by the new one.
		d.mu.Unlock()
		return
	}
	var released []func()
	d.arb.SetWindows(int(math.Ceil(float64(window)/float64(cfg.Period))), int(math.Ceil(float64(d.cfg.Window)/float64(cfg.Period))))
	for gpu, sl := range gpuSlices {
		d.arb.SetSlices(gpu, arbiter.Slices{Base: arbiter.Nanoseconds(sl.Base), Min: arbiter.Nanoseconds(sl.Min)})
	}
	decisions := d.arb.Step(res.Inputs, func(gpu int) arbiter.Actuation { return actuation[gpu] })
	var seen []enforce.Member
	for name, ct := range res.Tenants {
		t := d.tenants[name]
		if t != nil && (t.pid != ct.PID || ct.PID == 0 && t.cgroup != ct.Cgroup) {
			// The name now stands for another cgroup or process (a policy
			// entry pointed elsewhere before the old tenant retired): its
			// gates still hold the old one, so it starts afresh.
			released = append(released, t.act.Release())
			t = nil
		}
		if t == nil {
			t = &tenant{name: name, cgroupIDs: map[uint64]bool{}, totals: map[int]meter.Totals{}, act: enforce.NewTenant(name, d.env)}
			d.tenants[name] = t
		}
		t.rules, t.cgroup, t.pid, t.lastSeen = ct.Rules, ct.Cgroup, ct.PID, now
		t.decisions = map[int]arbiter.Decision{}
		for _, id := range ct.CgroupIDs {
			t.cgroupIDs[id] = true
		}
		t.unprobed = unprobedOf[name]
		for _, m := range ct.Members {
			seen = append(seen, enforce.Member{PID: m.PID, Cgroup: m.CgroupID, Tenant: t.act, ByCgroup: t.cgroup != ""})
			if !m.Exited {
				t.anyPID = int(m.PID)
			}
		}
		if ct.LaunchNS > 0 {
			t.act.LaunchCost.Store(math.Float64bits(ct.LaunchNS))
		}
		var all []gpusched.Group
		for _, gs := range groups[name] {
			all = append(all, gs...)
		}
		t.act.Groups.Store(&all)
	}
	// The step's own assignment: classifying again could name another
	// tenant (a pid tenant's tree changes as processes exit).
	owner := map[uint32]*tenant{}
	for name, ct := range res.Tenants {
		for _, m := range ct.Members {
			owner[m.PID] = d.tenants[name]
		}
	}
	for _, c := range long {
		t := owner[c.PID]
		if t == nil {
			continue
		}
		tot := t.totals[c.GPU]
		tot.Add(d.counted.delta(c))
		t.totals[c.GPU] = tot
	}
	d.counted.forgetAbsent(long)
	for _, dec := range decisions {
		d.tenants[dec.Name].decisions[dec.GPU] = dec
	}
	plan := map[int][]enforce.TenantGroups{}
	var steps []tenantStep
	for name, t := range d.tenants {
		if now.Sub(t.lastSeen) > 2*d.cfg.Window {
			released = append(released, t.act.Release())
			delete(d.tenants, name)
			continue
		}
		step := d.stepOf(t, cfg.Period)
		if t.pid != 0 {
			// A pid tenant's tree changes as it forks.
			step.tree = slices.Collect(maps.Keys(cl.Trees[t.pid]))
			t.act.Tree.Store(&step.tree)
		}
		scheduled := false
		decs := make([]arbiter.Decision, 0, len(t.decisions))
		for gpu, dec := range t.decisions {
			if dec.Scheduled {
				scheduled = true
				plan[gpu] = append(plan[gpu], enforce.TenantGroups{Decision: dec, Groups: groups[name][gpu]})
			}
			decs = append(decs, dec)
		}
		g := arbiter.Gate(decs, res.Inputs)
		if !enforcing {
			g.Duty = 1
		}
		if len(t.unprobed) > 0 {
			// Its unprobed processes' launches pass the launch gate
			// unseen: freeze it for the rest of each period instead.
			g.Paced = false
		}
		step.decision.Scheduled, step.decision.Duty, step.decision.Offset, step.decision.Paced, step.decision.GPUs = scheduled, g.Duty, g.Offset, g.Paced, g.GPUs
		steps = append(steps, step)
	}
	d.publish(res, snap, actuation, memory)
	urgentCgroups := d.latencyCgroups(latencyIDs)
	d.mu.Unlock()
	for _, f := range released {
		f()
	}
	var finish []func()
	for _, step := range steps {
		finish = append(finish, d.apply(ctx, step))
	}
	d.wakers.Store(enforce.NewWakers(seen))
	for _, f := range finish {
		f()
	}
	if enforcing {
		d.steer.Apply(plan)
	}
	d.hold.SetPlan(enforce.PlanHolds(enforcing && d.cfg.LatencyHolds != enforce.HoldOff, actuation, gpuSlices, res, groups, urgentCgroups))
	live := map[uint32]bool{}
	for _, c := range long {
		if !c.Exited {
			live[c.PID] = true
		}
	}
	d.steer.Forget(live)
	d.saveObjects()
}

// groupsOf are the channel groups of every tenant's processes per GPU, as
// the probes saw their RM allocations, but those of processes whose
// controls the driver refused: refused names the tenants that have any
// (paced at the launch gate instead).
func (d *Daemon) groupsOf(res control.Result) (_ map[string]map[int][]gpusched.Group, refused map[tenantGPU]bool) {
	out := map[string]map[int][]gpusched.Group{}
	refused = map[tenantGPU]bool{}
	if d.spy == nil {
		return out, refused
	}
	tbl := d.spy.Table()
	for name, t := range res.Tenants {
		for _, m := range t.Members {
			if m.Exited {
				continue
			}
			p, ok := tbl.Process(m.PID)
			if !ok {
				continue
			}
			for _, g := range p.Groups() {
				if d.steer.Refused(g.PID) {
					refused[tenantGPU{name, int(g.GPU)}] = true
					continue
				}
				if out[name] == nil {
					out[name] = map[int][]gpusched.Group{}
				}
				out[name][int(g.GPU)] = append(out[name][int(g.GPU)], g)
			}
		}
	}
	return out, refused
}

// actuations picks how each GPU's tenants are held to their shares: the
// policy's timeslice mode by freezing; otherwise the GPU's own scheduler
// when this host and the GPU allow it and the policy does not declare the
// GPU non-preemptive, else pacing at the launch gate. A tenant with work
// on a steered GPU whose channel groups gpuarb has not seen for
// the ungrouped-grace tunable (a process that set up its GPU before the daemon
// started) is unsteered: paced at the launch gate, the others steered
// (so is one whose process's controls the driver refused: the caller
// adds those, groupsOf names them). bounds are the steered GPUs'
// timeslices (gpusched.Slices), as far as they could be read.
func (d *Daemon) actuations(cfg *policy.Config, res control.Result, groups map[string]map[int][]gpusched.Group) (_ map[int]arbiter.Actuation, bounds map[int]gpusched.Slices, _ map[tenantGPU]bool) {
	now := time.Now()
	seen := map[tenantGPU]bool{}
	out := map[int]arbiter.Actuation{}
	bounds = map[int]gpusched.Slices{}
	unsteered := map[tenantGPU]bool{}
	why := map[int]string{}
	for _, in := range res.Inputs {
		gpu := in.GPU
		if _, done := out[gpu]; done && out[gpu] != arbiter.Scheduler {
			continue
		}
		_, preemptive := cfg.Scheduling(gpu)
		switch {
		case cfg.ModeOf(gpu) == policy.ModeWindows:
			out[gpu] = arbiter.Windows
		case !preemptive:
			out[gpu], why[gpu] = arbiter.Pacing, "the policy declares the GPU non-preemptive: a running kernel outlasts any timeslice"
		case d.steer.Off != "":
			out[gpu], why[gpu] = arbiter.Pacing, d.steer.Off
		case in.Busy && in.Contexts > 0 && len(groups[in.Name][gpu]) == 0:
			// Just arrived, its groups may not be in the table yet; after
			// the grace, paced at the launch gate.
			unsteered[tenantGPU{in.Name, gpu}] = d.ungrouped(tenantGPU{in.Name, gpu}, now, seen)
			if _, done := out[gpu]; !done {
				out[gpu] = arbiter.Scheduler
			}
		case len(groups[in.Name][gpu]) > 0:
			probe := groups[in.Name][gpu][0]
			if r := d.steer.GPUState(gpu, probe); r != "" {
				out[gpu], why[gpu] = arbiter.Pacing, r
				break
			}
			if _, done := out[gpu]; !done {
				out[gpu] = arbiter.Scheduler
			}
			if _, read := bounds[gpu]; !read {
				if sl, ok := d.steer.SlicesOf(gpu, probe); ok {
					bounds[gpu] = sl
				}
			}
		default:
			if _, done := out[gpu]; !done {
				out[gpu] = arbiter.Scheduler
			}
		}
	}
	d.mu.Lock()
	d.steerWhy = why
	d.mu.Unlock()
	for k := range d.ungroupedSince {
		if !seen[k] {
			delete(d.ungroupedSince, k) // it has its groups now, or left
		}
	}
	return out, bounds, unsteered
}

// tenantGPU names a tenant on one GPU.
type tenantGPU struct {
	name string
	gpu  int
}

// ungrouped notes in seen that a tenant is busy on a GPU without a known
// channel group and tells whether that has lasted the ungrouped grace.
func (d *Daemon) ungrouped(k tenantGPU, now time.Time, seen map[tenantGPU]bool) bool {
	seen[k] = true
	since, ok := d.ungroupedSince[k]
	if !ok {
		d.ungroupedSince[k] = now
		return false
	}
	return now.Sub(since) >= d.cfg.Tuning.UngroupedGrace
}
