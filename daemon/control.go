package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpuarb/gpuarb/arbiter"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
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

// pidTrees returns the processes of the pid tenants rooted at roots: what
// the probes follow for each, which is every process forked below a
// followed one, followed at its fork however a double fork reparents it,
// until its exit. /proc's tree below a root is read only while it can add
// something the probes do not follow: from a tenant's first step until a
// read finds no live process they do not follow (what was forked before
// its root was followed), and again once the probes have missed forks
// (their table was full). Otherwise a step costs one read of the probes'
// table, however fast the tenant forks. Without probes, /proc's tree.
// Called by the control loop (under stepMu), which owns treesWalked.
func (d *Daemon) pidTrees(roots []int) map[int][]int {
	out := make(map[int][]int, len(roots))
	if len(roots) == 0 {
		return out
	}
	if d.probes == nil {
		for _, root := range roots {
			out[root] = cgroup.Descendants(root)
		}
		return out
	}
	unfollowed, err := d.probes.UnfollowedForks()
	if err != nil {
		d.log.Warn("follow pid tenants", "err", err)
	}
	walks := map[int][]int{}
	for _, root := range roots {
		if at, walked := d.treesWalked[root]; !walked || unfollowed > at {
			walks[root] = cgroup.Descendants(root)
		}
	}
	// Read after the walks: a process a followed one forked before a walk
	// read it is in the table by now.
	trees, err := d.probes.Trees()
	if err != nil {
		d.log.Warn("follow pid tenants", "err", err)
	}
	followed := map[int]bool{} // for any root: a process stays with the first
	for _, pids := range trees {
		for _, p := range pids {
			followed[p] = true
		}
	}
	for _, root := range roots {
		out[root] = trees[root]
		walk, ok := walks[root]
		if !ok {
			continue
		}
		var missing []int
		for _, p := range walk {
			if !followed[p] && !cgroup.Gone(p) { // one that ended since the walk left the table
				missing = append(missing, p)
			}
		}
		if len(missing) == 0 {
			d.treesWalked[root] = unfollowed
			continue
		}
		if err := d.probes.Follow(root, missing); err != nil {
			d.log.Warn("follow pid tenant", "pid", root, "err", err)
		}
		// One that ended before it was followed left its entry behind
		// (the probes drop a process at its exit): its pid may name
		// another process next.
		var gone []int
		for _, p := range missing {
			if cgroup.Gone(p) {
				gone = append(gone, p)
			} else {
				out[root] = append(out[root], p)
			}
		}
		if err := d.probes.Drop(gone); err != nil {
			d.log.Warn("follow pid tenant", "pid", root, "err", err)
		}
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

// minControlWindow is the shortest control window: three periods of
// 100 ms. Windows of one and two periods scored no better over the fuzz
// seeds (docs/benchmark-history.md §6).
const minControlWindow = 300 * time.Millisecond

// controlWindow is the span of the shares the arbiter steers by: long
// enough to average over a hog's deep queue and a closed loop's bursts,
// short enough to react within a second, and never longer than the meter
// keeps.
func (d *Daemon) controlWindow() time.Duration {
	return min(max(3*d.period(), minControlWindow), d.cfg.Window)
}

func (d *Daemon) period() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.policy.Period
}

// assign is the classifier as control.Step takes it.
func (c *classifier) assign(pid uint32, cgroupID uint64) control.Assignment {
	name, rules, cg, root := c.classify(pid, cgroupID)
	return control.Assignment{Name: name, Rules: rules, Cgroup: cg, PID: root}
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
	cl := newClassifier(cfg, d.mount, d.resolver, pidStarts, func(root int) []int { return trees[root] })
	unprobed := d.meterUnprobed()
	_, short := d.meter.Contexts(window)
	_, long := d.meter.Contexts(d.cfg.Window)
	res := control.Step(control.Input{Window: window, Settled: d.cfg.Window, Short: short, Long: long, Assign: cl.assign,
		HeldBack: func(name string) bool { return heldBack[name] }})
	groups, refused := d.groupsOf(res)
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

	d.mu.Lock()
	if d.policy != cfg || d.enforcing != enforcing {
		// The policy changed while this step classified by the old one:
		// acting on it would gate tenants by entries that are gone (a
		// removed cgroup, refused and then never gated again). The next
		// period steps by the new one.
		d.mu.Unlock()
		return
	}
	var finish []func()
	d.arb.SetWindows(int(math.Ceil(float64(window)/float64(cfg.Period))), int(math.Ceil(float64(d.cfg.Window)/float64(cfg.Period))))
	for gpu, sl := range gpuSlices {
		d.arb.SetSlices(gpu, arbiter.Slices(sl))
	}
	decisions := d.arb.Step(res.Inputs, func(gpu int) arbiter.Actuation { return actuation[gpu] })
	var seen []member
	for name, ct := range res.Tenants {
		t := d.tenants[name]
		if t != nil && (t.pid != ct.PID || ct.PID == 0 && t.cgroup != ct.Cgroup) {
			// The name now stands for another cgroup or process (a policy
			// entry pointed elsewhere before the old tenant retired): its
			// gates still hold the old one, so it starts afresh.
			finish = append(finish, t.act.Release())
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
			seen = append(seen, member{m.PID, m.CgroupID, t})
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
	for name, t := range d.tenants {
		if now.Sub(t.lastSeen) > 2*d.cfg.Window {
			finish = append(finish, t.act.Release())
			delete(d.tenants, name)
			continue
		}
		if t.pid != 0 {
			// A pid tenant's tree changes as it forks.
			tree := slices.Collect(maps.Keys(cl.trees[t.pid]))
			t.act.Tree.Store(&tree)
			if err := t.act.SetTreeMembers(tree); err != nil {
				d.log.Warn("launch gate", "tenant", name, "err", err)
			}
		}
		duty, offset, paced, scheduled := 1.0, 0.0, true, false
		for gpu, dec := range t.decisions {
			if dec.Scheduled {
				scheduled = true
				plan[gpu] = append(plan[gpu], enforce.TenantGroups{Decision: dec, Groups: groups[name][gpu]})
			}
			if dec.Duty < duty {
				duty, offset, paced = dec.Duty, dec.Offset, dec.Paced && !dec.Scheduled
			}
		}
		if !enforcing {
			duty = 1
		}
		if len(t.unprobed) > 0 {
			// Its unprobed processes' launches pass the launch gate
			// unseen: freeze it for the rest of each period instead.
			paced = false
		}
		finish = append(finish, d.actOn(ctx, t, scheduled, duty, offset, paced, cfg.Period))
	}
	d.wakers.Store(newWakers(seen))
	d.publish(res, snap, actuation)
	urgentCgroups := d.latencyCgroups(cfg)
	d.mu.Unlock()
	for _, f := range finish {
		f()
	}
	if enforcing {
		d.steerSlices(plan, groups)
	}
	d.hold.SetPlan(enforce.PlanHolds(enforcing && d.cfg.LatencyHolds != enforce.HoldOff, actuation, gpuSlices, res, groups, urgentCgroups))
	live := map[uint32]bool{}
	for _, c := range long {
		if !c.Exited {
			live[c.PID] = true
		}
	}
	d.steer.Forget(live)
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
// ungroupedGrace (a process that set up its GPU before the daemon
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
		case cfg.ModeOf(gpu) == policy.ModeTimeslice:
			out[gpu] = arbiter.Windows
		case !preemptive:
			out[gpu], why[gpu] = arbiter.Pacing, "the policy declares the GPU non-preemptive: a running kernel outlasts any timeslice"
		case d.steer.Off != "":
			out[gpu], why[gpu] = arbiter.Pacing, d.steer.Off
		case in.Busy && in.Processes > 0 && len(groups[in.Name][gpu]) == 0:
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

// unprobedPeriod is the least period of the freeze windows of a tenant
// with unprobed processes on a GPU gpuarb cannot steer. A freeze reaches
// only what it has not submitted yet: the work it queued before runs on
// within the freeze, unseen, so freezes must be long beside its queue,
// yet the meter's window (1 s) must hold several periods or the share it
// steers by swings with their phase. At 500 ms a hog of 1 ms kernels 8 to
// 16 deep gets 26% for 25 (TestUnprobedGPUProcessIsHeld); one of 20 ms
// kernels 16 deep keeps its unarbitrated 50% whatever the duty. The GPU's own
// scheduler, where it can be steered, reaches queued work.
const unprobedPeriod = 500 * time.Millisecond

// ungroupedGrace is how long a busy tenant may go without a channel group
// the probes saw before it is paced at the launch gate instead of steered:
// a process that has just set up its GPU may not be in the table at the
// next control step.
const ungroupedGrace = time.Second

// tenantGPU names a tenant on one GPU.
type tenantGPU struct {
	name string
	gpu  int
}

// ungrouped notes in seen that a tenant is busy on a GPU without a known
// channel group and tells whether that has lasted ungroupedGrace.
func (d *Daemon) ungrouped(k tenantGPU, now time.Time, seen map[tenantGPU]bool) bool {
	seen[k] = true
	since, ok := d.ungroupedSince[k]
	if !ok {
		d.ungroupedSince[k] = now
		return false
	}
	return now.Sub(since) >= ungroupedGrace
}

// steerSlices gives the channel groups of the GPUs in scheduler mode their
// timeslices. A process whose control the driver refuses is paced at the
// launch gate from the next step, and a GPU where it refuses a quorum of
// processes and accepts none is not steered at all (steering.noteRefused).
func (d *Daemon) steerSlices(plan map[int][]enforce.TenantGroups, groups map[string]map[int][]gpusched.Group) {
	for gpu, ts := range plan {
		byKey := map[enforce.GroupKey]gpusched.Group{}
		for _, t := range ts {
			for _, g := range t.Groups {
				byKey[enforce.KeyOf(g)] = g
			}
		}
		want := map[enforce.GroupKey]enforce.SliceWant{}
		for _, t := range ts {
			if t.Decision.Timeslice == 0 {
				continue // idle: its groups keep theirs
			}
			for _, g := range t.Groups {
				want[enforce.KeyOf(g)] = enforce.SliceWant{Slice: t.Decision.Timeslice, Target: t.Decision.Target}
			}
		}
		if err := d.steer.SetSlices(want, byKey); err != nil && !enforce.IsRefusal(err) { // refusals are logged as noted
			d.log.Debug("gpu scheduler: timeslices", "gpu", gpu, "err", err)
		}
	}
}

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
	byPID    map[uint32]*arbiter.Gater
	byCgroup map[uint64]*arbiter.Gater
}

func newWakers(seen []member) *wakers {
	w := &wakers{byPID: map[uint32]*arbiter.Gater{}, byCgroup: map[uint64]*arbiter.Gater{}}
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

// gateFor makes the gate of a tenant, refusing what must never be stopped.
func (d *Daemon) gateFor(t *tenant) (cgroup.Gate, error) {
	if t.pid != 0 {
		if pidStart(t.pid) != d.pidStarts[t.pid] {
			return nil, fmt.Errorf("pid %d is no longer the process attached", t.pid)
		}
		return cgroup.NewSignalGate(t.pid, func() []int {
			if tree := t.act.Tree.Load(); tree != nil {
				return *tree
			}
			return nil
		}, d.ledger)
	}
	if strings.HasPrefix(t.cgroup, "cgroup:") {
		return nil, errors.New("its cgroup path is unknown")
	}
	if d.mode.Freeze {
		return cgroup.NewV2Gate(d.mount, t.cgroup)
	}
	if d.mode.V1Freezer {
		// Legacy hosts: the v1 freezer cgroup of one of its processes.
		rel, err := cgroup.V1ProcessPath(t.anyPID, "freezer")
		if err != nil {
			return nil, err
		}
		return cgroup.NewV1Gate(rel)
	}
	return nil, errors.New("no cgroup freezer on this host")
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
	if d.probes == nil {
		return nil, errors.New("no probes")
	}
	var cgroups []uint64
	var pids []int
	if t.pid != 0 {
		pids = d.pidTrees([]int{t.pid})[t.pid]
	} else {
		id, err := cgroup.ID(filepath.Join(d.mount, t.cgroup))
		if err != nil {
			return nil, err
		}
		cgroups = []uint64{id}
	}
	lg, err := d.probes.NewLaunchGate()
	if err != nil {
		return nil, err
	}
	if err := lg.SetMembers(cgroups, pids); err != nil {
		return nil, errors.Join(err, lg.Close())
	}
	return lg, nil
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
