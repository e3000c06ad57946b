package daemon

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gpuarb/gpuarb/arbiter"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
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
	syncP99MS map[int]float64
	launchNS  map[int]float64
	totals    map[int]meter.Totals // per GPU, cumulative: the Prometheus counters
	lastSeen  time.Time

	// launchCost is the GPU ns of one of its launches (float64 bits) as
	// the last control step priced it, read by its gater without the
	// daemon's lock.
	launchCost atomic.Uint64
	gater      *arbiter.Gater
	launches   *bpf.LaunchGate // nil: paced by freezing
	cancel     context.CancelFunc
	done       chan struct{}
	target     cgroup.Target
	refused    bool // no gate could be made (logged once)
}

// classifier assigns processes to tenants for one control step.
type classifier struct {
	cfg      *policy.Config
	mount    string
	resolver *cgroup.Resolver
	trees    map[int]map[int]bool // pid tenant root -> its process tree
}

func newClassifier(cfg *policy.Config, mount string, r *cgroup.Resolver) *classifier {
	c := &classifier{cfg: cfg, mount: mount, resolver: r, trees: map[int]map[int]bool{}}
	for _, t := range cfg.Tenants {
		if t.PID != 0 {
			c.trees[t.PID] = processTree(t.PID)
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
	if path == "" {
		path = fmt.Sprintf("cgroup:%d", cgroupID)
	}
	return TenantName(path), c.cfg.Defaults, path, 0
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

// processTree returns pid and its descendants as a set.
func processTree(pid int) map[int]bool {
	tree := map[int]bool{}
	for _, p := range cgroup.Descendants(pid) {
		tree[p] = true
	}
	return tree
}

// backloggedFraction is the part of the control window a process must
// have had work on the GPU or queued for it to count as backlogged.
const backloggedFraction = 0.9

// minActive is the shortest time on the GPU over which a process can
// count as backlogged.
const minActive = 20 * time.Millisecond

// controlWindow is the span of the shares the arbiter steers by: long
// enough to average over a hog's deep queue, short enough to react
// within a second, and never longer than the meter keeps.
func (d *Daemon) controlWindow() time.Duration {
	return min(max(3*d.period(), 300*time.Millisecond), d.cfg.Window)
}

func (d *Daemon) period() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.policy.Period
}

type aggKey struct {
	name string
	gpu  int
}

// control runs one control period: measure, decide, gate.
func (d *Daemon) control(ctx context.Context) {
	d.mu.Lock()
	cfg, enforcing := d.policy, d.enforcing
	d.mu.Unlock()
	cl := newClassifier(cfg, d.mount, d.resolver)
	window := d.controlWindow()
	_, short := d.meter.Contexts(window)
	_, long := d.meter.Contexts(d.cfg.Window)

	inputs := map[aggKey]*arbiter.Input{}
	costs := map[aggKey]*launchCosts{}
	var seen []member
	waits := map[aggKey][]uint64{}
	syncs := map[aggKey]int{}
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range long {
		name, rules, cg, pid := cl.classify(c.PID, c.CgroupID)
		k := aggKey{name, c.GPU}
		if inputs[k] == nil {
			inputs[k] = &arbiter.Input{Name: name, GPU: c.GPU, Rules: rules, Costed: true}
		}
		inputs[k].SettledShare += c.Share
		inputs[k].Costed = inputs[k].Costed && (c.Learned || c.Exited)
		waits[k] = append(waits[k], c.SyncWait...)
		syncs[k] += c.Syncs
		t := d.tenants[name]
		if t == nil {
			t = &tenant{name: name, cgroupIDs: map[uint64]bool{}, totals: map[int]meter.Totals{}}
			d.tenants[name] = t
		}
		t.rules, t.cgroup, t.pid, t.lastSeen = rules, cg, pid, now
		t.cgroupIDs[c.CgroupID] = true
		seen = append(seen, member{c.PID, c.CgroupID, t})
		if !c.Exited {
			t.anyPID = int(c.PID)
			if c.LaunchNS > 0 {
				if costs[k] == nil {
					costs[k] = &launchCosts{}
				}
				costs[k].add(c)
			}
		}
		tot := t.totals[c.GPU]
		tot.Add(d.counted.delta(c))
		t.totals[c.GPU] = tot
	}
	d.counted.forgetAbsent(long)
	for _, c := range short {
		name, _, _, _ := cl.classify(c.PID, c.CgroupID)
		in := inputs[aggKey{name, c.GPU}]
		if in == nil {
			continue
		}
		in.Share += c.Share
		in.Busy = in.Busy || c.Busy || c.Launches > 0
		in.Queued += float64(c.BacklogNS) / float64(window)
		// Running or waiting for the GPU nearly all the window, or all the
		// time since it appeared: a tenant that has just arrived wants its
		// share at once, not after a window.
		active := max(c.ActiveNS, uint64(minActive))
		in.Backlogged = in.Backlogged || float64(c.GPUNS+c.QueueNS) >= backloggedFraction*float64(active)
		if !c.Exited {
			in.Processes++
		}
	}
	var list []arbiter.Input
	for k, in := range inputs {
		in.LaunchNS = costs[k].mean()
		if t := d.tenants[k.name]; t != nil && t.gater != nil && t.gater.HeldSince(now.Add(-window)) {
			in.Busy, in.Held = true, true // held back, so its queue may be empty: it has work
		}
		in.SyncP99MS = p99(waits[k]) / 1e6
		in.FPS = float64(syncs[k]) / d.cfg.Window.Seconds()
		list = append(list, *in)
	}
	tenantCosts := map[string]launchCosts{} // over all its GPUs
	for k, c := range costs {
		all := tenantCosts[k.name]
		all.sum, all.n = all.sum+c.sum, all.n+c.n
		tenantCosts[k.name] = all
	}
	d.arb.SetSettle(int(math.Ceil(float64(d.cfg.Window) / float64(cfg.Period))))
	decisions := d.arb.Step(list, cfg.ModeOf)
	for _, t := range d.tenants {
		t.decisions = map[int]arbiter.Decision{}
		t.syncP99MS = map[int]float64{}
		t.launchNS = map[int]float64{}
	}
	for _, dec := range decisions {
		t := d.tenants[dec.Name]
		t.decisions[dec.GPU] = dec
		t.syncP99MS[dec.GPU] = inputs[aggKey{dec.Name, dec.GPU}].SyncP99MS
		t.launchNS[dec.GPU] = inputs[aggKey{dec.Name, dec.GPU}].LaunchNS
	}
	for name, t := range d.tenants {
		if now.Sub(t.lastSeen) > 2*d.cfg.Window {
			d.stopGate(t)
			delete(d.tenants, name)
			continue
		}
		if c, ok := tenantCosts[name]; ok {
			t.launchCost.Store(math.Float64bits(c.mean()))
		}
		if t.launches != nil && t.pid != 0 {
			// A pid tenant's tree changes as it forks.
			if err := t.launches.SetMembers(nil, cgroup.Descendants(t.pid)); err != nil {
				d.log.Warn("launch gate", "tenant", name, "err", err)
			}
		}
		duty, offset, paced := 1.0, 0.0, true
		for _, dec := range t.decisions {
			if dec.Duty < duty {
				duty, offset, paced = dec.Duty, dec.Offset, dec.Paced
			}
		}
		if !enforcing {
			duty = 1
		}
		if duty < 1 && t.gater == nil && !t.refused {
			d.startGate(ctx, t, cfg.Period)
		}
		switch {
		case t.gater == nil:
		case paced:
			t.gater.SetRate(duty)
		default:
			t.gater.Set(duty, offset)
		}
	}
	d.wakers.Store(newWakers(seen))
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
		if m.tenant.gater == nil {
			continue
		}
		w.byPID[m.pid] = m.tenant.gater
		if m.tenant.cgroup != "" {
			w.byCgroup[m.cgroup] = m.tenant.gater
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

// launchCosts averages the launch costs of a tenant's processes, each
// weighted by its launches in the window (one without recent launches
// still counts a little).
type launchCosts struct{ sum, n float64 }

func (l *launchCosts) add(c meter.ContextStats) {
	w := float64(c.Launches) + 1e-3
	l.sum += w * c.LaunchNS
	l.n += w
}

// mean is the weighted mean cost, 0 when none of them has launched.
func (l *launchCosts) mean() float64 {
	if l == nil || l.n == 0 {
		return 0
	}
	return l.sum / l.n
}

func p99(xs []uint64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]uint64(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[int(math.Ceil(0.99*float64(len(s))))-1])
}

// gateFor makes the gate of a tenant, refusing what must never be stopped.
func (d *Daemon) gateFor(t *tenant) (cgroup.Gate, error) {
	if t.pid != 0 {
		return cgroup.NewSignalGate(t.pid)
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

// startGate records the tenant in the ledger (before any freeze) and
// starts its gater. Called with d.mu held.
func (d *Daemon) startGate(ctx context.Context, t *tenant, period time.Duration) {
	g, err := d.gateFor(t)
	if err == nil {
		err = d.ledger.Add(g.Target())
	}
	if err != nil {
		t.refused = true
		d.log.Warn("tenant cannot be throttled", "tenant", t.name, "err", err)
		return
	}
	t.target = g.Target()
	t.gater = arbiter.NewGater(g, period, d.epoch)
	ids := make([]uint64, 0, len(t.cgroupIDs))
	for id := range t.cgroupIDs {
		ids = append(ids, id)
	}
	t.gater.Submitted = func() float64 { return d.meter.SubmittedNS(ids) }
	if lg, err := d.newLaunchGate(t); err != nil {
		d.log.Warn("no launch gate: the tenant is paced by freezing", "tenant", t.name, "err", err)
	} else {
		t.launches = lg
		t.gater.Launches = launchGate{gate: lg, meter: d.meter}
		t.gater.LaunchCost = func() float64 { return math.Float64frombits(t.launchCost.Load()) }
	}
	t.gater.OnFreeze = func(from, to time.Time) {
		mono := meter.MonotonicNow()
		f, e := mono-uint64(time.Since(from)), uint64(math.MaxUint64)
		if !to.IsZero() {
			e = mono - uint64(time.Since(to))
		}
		for _, id := range ids {
			d.meter.Paused(id, f, e)
		}
	}
	name := t.name
	t.gater.OnError = func(err error) { d.log.Warn("gate", "tenant", name, "err", err) }
	gctx, cancel := context.WithCancel(ctx)
	t.cancel, t.done = cancel, make(chan struct{})
	go func(g *arbiter.Gater, done chan struct{}) {
		defer close(done)
		g.Run(gctx)
	}(t.gater, t.done)
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
		pids = cgroup.Descendants(t.pid)
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

// stopGate ends a tenant's gater (which thaws it and releases what its
// launch gate holds) and forgets its target. Called with d.mu held.
func (d *Daemon) stopGate(t *tenant) {
	if t.gater == nil {
		return
	}
	t.cancel()
	<-t.done
	if err := t.launches.Close(); err != nil {
		d.log.Warn("launch gate", "tenant", t.name, "err", err)
	}
	t.launches = nil
	if err := d.ledger.Remove(t.target); err != nil {
		d.log.Warn("ledger", "err", err)
	}
	t.gater, t.cancel, t.done = nil, nil, nil
}

// stopAllGates thaws every tenant.
func (d *Daemon) stopAllGates() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range d.tenants {
		d.stopGate(t)
		t.refused = false
	}
}

// startGuardian starts the thaw guardian: a process outside the daemon's
// session that holds the read end of a pipe and thaws everything in the
// ledger when the pipe closes — when the daemon exits in any way.
func (d *Daemon) startGuardian() error {
	if len(d.cfg.Guardian) == 0 {
		return nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("guardian pipe: %w", err)
	}
	cmd := exec.Command(d.cfg.Guardian[0], d.cfg.Guardian[1:]...)
	cmd.ExtraFiles = []*os.File{r} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("start guardian: %w", err)
	}
	r.Close()
	d.guardianPipe = w
	go func() { _ = cmd.Wait() }()
	d.log.Info("thaw guardian started", "pid", cmd.Process.Pid)
	return nil
}

// Guard is the thaw guardian's body: it waits until the daemon is gone —
// fd (its pipe) closes, or the daemon process (pid, started at start)
// has exited — and resumes everything it may have left stopped
// (ThawLeftovers). The pid is watched because an exiting process releases
// its files last-in-first-out after every probe link is torn down (each
// uprobe waits for a grace period): the pipe closes up to a second after
// the daemon died, while ThawLeftovers first opens every launch gate, so
// probes still attached hold nobody.
func Guard(fd *os.File, pid int, start uint64, ledger, pinPath string) ([]string, error) {
	closed := make(chan struct{})
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := fd.Read(buf); err != nil {
				close(closed)
				return
			}
		}
	}()
	tick := time.NewTicker(guardPoll)
	defer tick.Stop()
	for !cgroup.Exited(pid, start) {
		select {
		case <-closed:
			return ThawLeftovers(ledger, pinPath)
		case <-tick.C:
		}
	}
	return ThawLeftovers(ledger, pinPath)
}

// guardPoll is how often the guardian looks at the daemon's process.
const guardPoll = 10 * time.Millisecond
