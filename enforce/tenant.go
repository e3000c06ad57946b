package enforce

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"sync/atomic"
	"time"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/gpusched"
	"github.com/gpuarb/gpuarb/meter"
)

// Env is what every tenant's actuators share.
type Env struct {
	Steer  *Steering
	Ledger *cgroup.Ledger // records every gate before it freezes anyone
	Meter  *meter.Meter   // learns when a tenant was held
	Log    *slog.Logger
	Epoch  time.Time // the gaters' common time origin
}

// Tenant holds one tenant to the control step's decision: in scheduler
// mode by its pauser (a window gater over its channel groups, paused for
// the rest of each period below duty 1), otherwise by its gater (the
// launch gate, or freezing its cgroup or process tree). Apply, Release
// and SetTreeMembers are called one at a time (the daemon's control steps
// and policy changes are serialized), never under the daemon's lock: they
// write the ledger and BPF maps. They start and steer actuators, never
// wait for one, and return the wait for those they end. The readers
// (Gater, Pauser, AtLaunchGate, HeldSince, Errors) may be called from any
// goroutine.
type Tenant struct {
	name string
	env  *Env

	// Groups are its processes' channel groups and Tree a pid tenant's
	// processes, as the last step found them; LaunchCost the GPU ns of one
	// of its launches (float64 bits). Its actuators read them without the
	// daemon's lock.
	Groups     atomic.Pointer[[]gpusched.Group]
	Tree       atomic.Pointer[[]int]
	LaunchCost atomic.Uint64

	pauser      *Gater
	pauserSeen  atomic.Pointer[Gater] // pauser, for the readers
	pauseCancel context.CancelFunc
	pauseDone   chan struct{}

	gater      *Gater
	gaterSeen  atomic.Pointer[Gater] // gater, for the readers
	launches   *bpf.LaunchGate       // nil: paced by freezing
	atLaunches atomic.Bool           // launches != nil, for the readers
	gatePeriod time.Duration
	cancel     context.CancelFunc
	done       chan struct{}
	target     cgroup.Target
	refused    bool // no gate may be made (logged once)
	unrecorded bool // its ledger entry could not be written (logged once)

	// errors are the failed freezes, thaws, pauses and gate operations of
	// its gaters and pausers, kept across their restarts.
	errors errorCount
}

// NewTenant returns the actuators of the tenant name, none started.
func NewTenant(name string, env *Env) *Tenant { return &Tenant{name: name, env: env} }

// Decision is what one control step asks of a tenant's actuators.
type Decision struct {
	// Scheduled: its GPU's scheduler is steered, and its channel groups
	// are paused for the rest of each period below duty 1.
	Scheduled bool
	// Duty is the part of each period it may run, Offset where in the
	// period its run starts; Paced admits its launches at rate Duty
	// instead of windows.
	Duty, Offset float64
	Paced        bool
	// GPUs is how many GPUs a paced Duty spans (0 counts as 1): its
	// launches on all of them are paid from one account, at Duty × GPUs
	// GPU ns per ns.
	GPUs   int
	Period time.Duration
}

// GateMakers make what a tenant's gater acts through, when one starts.
type GateMakers struct {
	// Gate makes its freeze gate, refusing what must never be stopped.
	Gate func() (cgroup.Gate, error)
	// Launch makes its launch gate (an error: it is paced by freezing).
	Launch func() (*bpf.LaunchGate, error)
	// CgroupIDs lists its cgroups, whose submitted work and freezes the
	// meter counts.
	CgroupIDs func() []uint64
}

// Apply starts, steers or stops the tenant's actuators for d. A gater
// whose period changed ends now, and its successor starts at the next
// Apply, once the ended one has left the ledger.
func (t *Tenant) Apply(ctx context.Context, d Decision, g GateMakers) func() {
	defer t.publish()
	var finish []func()
	switch {
	case d.Scheduled:
		finish = append(finish, t.stopGater())
		if t.pauser == nil && d.Duty < 1 {
			t.startPauser(ctx, d.Period)
		}
		if t.pauser != nil {
			t.pauser.Set(d.Duty, d.Offset)
		}
	default:
		finish = append(finish, t.stopPauser())
		switch {
		case t.gater != nil && t.gatePeriod != d.Period:
			finish = append(finish, t.stopGater())
		case d.Duty < 1 && t.gater == nil && !t.refused:
			t.startGate(ctx, d.Period, g)
		}
		switch {
		case t.gater == nil:
		case d.Paced:
			t.gater.SetRate(d.Duty, d.GPUs)
		default:
			t.gater.Set(d.Duty, d.Offset)
		}
	}
	return joined(finish)
}

// Release ends everything that holds the tenant back and lets a refused
// tenant be tried again; it returns the wait for the actuators to end
// (each resumes what it held).
func (t *Tenant) Release() func() {
	defer t.publish()
	t.refused = false
	return joined([]func(){t.stopGater(), t.stopPauser()})
}

// publish shows the readers the actuators Apply or Release left running.
func (t *Tenant) publish() {
	t.gaterSeen.Store(t.gater)
	t.pauserSeen.Store(t.pauser)
	t.atLaunches.Store(t.launches != nil)
}

// HeldSince tells whether an actuator held the tenant back (launch gate,
// freeze or pause) at any time since since.
func (t *Tenant) HeldSince(since time.Time) bool {
	g, p := t.Gater(), t.Pauser()
	return (g != nil && g.HeldSince(since)) || (p != nil && p.HeldSince(since))
}

// Gater is its launch-gate or freeze gater, nil when none runs.
func (t *Tenant) Gater() *Gater { return t.gaterSeen.Load() }

// Pauser is its window gater over its channel groups, nil when none runs.
func (t *Tenant) Pauser() *Gater { return t.pauserSeen.Load() }

// AtLaunchGate tells whether its gater paces it at a launch gate (not by
// freezing).
func (t *Tenant) AtLaunchGate() bool { return t.atLaunches.Load() }

// Errors returns how many operations holding it back failed, and the last.
func (t *Tenant) Errors() (uint64, string) { return t.errors.get() }

// SetTreeMembers makes a pid tenant's launch gate hold exactly the
// processes of its tree.
func (t *Tenant) SetTreeMembers(tree []int) error {
	if t.launches == nil {
		return nil
	}
	return t.launches.SetMembers(nil, tree)
}

// startPauser starts the window gater over its channel groups.
func (t *Tenant) startPauser(ctx context.Context, period time.Duration) {
	gate := newPauseGate(t.env.Steer, t.name, func() []gpusched.Group {
		if gs := t.Groups.Load(); gs != nil {
			return *gs
		}
		return nil
	})
	t.pauser = NewGater(gate, period, t.env.Epoch)
	t.pauser.OnError = func(err error) {
		if onlyGone(err) {
			t.env.Log.Debug("gpu scheduler: pause", "tenant", t.name, "err", err) // its processes ended meanwhile
			return
		}
		t.errors.note(err)
		t.env.Log.Warn("gpu scheduler: pause", "tenant", t.name, "err", err)
	}
	t.pauseCancel, t.pauseDone = runGater(ctx, t.pauser)
}

// stopPauser ends its pauser (which resumes its groups); it returns the
// wait for it to end.
func (t *Tenant) stopPauser() func() {
	if t.pauser == nil {
		return func() {}
	}
	t.pauseCancel()
	done := t.pauseDone
	t.pauser, t.pauseCancel, t.pauseDone = nil, nil, nil
	return func() { <-done }
}

// startGate records the tenant's gate in the ledger (before any freeze)
// and starts its gater. A tenant that must never be stopped is refused
// until Release; one whose ledger entry cannot be written (a full /run)
// is tried again at the next Apply, and logged once until it succeeds.
func (t *Tenant) startGate(ctx context.Context, period time.Duration, gates GateMakers) {
	env := t.env
	g, err := gates.Gate()
	if err != nil {
		t.refused = true
		env.Log.Warn("tenant cannot be throttled", "tenant", t.name, "err", err)
		return
	}
	if err := env.Ledger.Add(g.Target()); err != nil {
		if !t.unrecorded {
			t.unrecorded = true
			t.errors.note(err)
			env.Log.Error("tenant not throttled until its thaw ledger entry can be written", "tenant", t.name, "err", err)
		}
		return
	}
	t.unrecorded = false
	t.target = g.Target()
	t.gater, t.gatePeriod = NewGater(g, period, env.Epoch), period
	ids := gates.CgroupIDs()
	t.gater.Submitted = func() meter.Submitted { return env.Meter.SubmittedBy(ids) }
	if lg, err := gates.Launch(); err != nil {
		env.Log.Warn("no launch gate: the tenant is paced by freezing", "tenant", t.name, "err", err)
	} else {
		t.launches = lg
		t.gater.Admitter = newProbesAdmitter(lg, env.Meter)
		t.gater.LaunchCost = func() float64 { return math.Float64frombits(t.LaunchCost.Load()) }
	}
	t.gater.Meter, t.gater.Frozen = env.Meter, ids
	t.gater.OnError = func(err error) {
		if errors.Is(err, os.ErrProcessDone) || errors.Is(err, fs.ErrNotExist) {
			env.Log.Debug("gate", "tenant", t.name, "err", err) // its processes or cgroup ended meanwhile
			return
		}
		t.errors.note(err)
		env.Log.Warn("gate", "tenant", t.name, "err", err)
	}
	t.cancel, t.done = runGater(ctx, t.gater)
}

// stopGater ends its gater (which thaws it and releases what its launch
// gate holds); it returns the wait for the gater to end and the cleanup
// after it: the launch gate closed, the ledger entry removed unless the
// last thaw failed.
func (t *Tenant) stopGater() func() {
	if t.gater == nil {
		return func() {}
	}
	t.cancel()
	g, done, launches, target, name, env := t.gater, t.done, t.launches, t.target, t.name, t.env
	t.gater, t.cancel, t.done, t.launches = nil, nil, nil, nil
	return func() {
		<-done
		if err := launches.Close(); err != nil {
			env.Log.Warn("launch gate", "tenant", name, "err", err)
		}
		if g.Unthawed() {
			// Kept for the next ThawAll: the guardian's, thaw --all's or
			// the daemon's at its stop.
			env.Log.Error("tenant may still be frozen: its last thaw failed; it stays in the ledger", "tenant", name, "target", target)
			return
		}
		if err := env.Ledger.Remove(target); err != nil {
			env.Log.Warn("ledger", "err", err)
		}
	}
}

// runGater runs g until the returned cancel is called; done closes when
// it has returned.
func runGater(ctx context.Context, g *Gater) (cancel context.CancelFunc, done chan struct{}) {
	gctx, cancel := context.WithCancel(ctx)
	done = make(chan struct{})
	go func() {
		defer close(done)
		g.Run(gctx)
	}()
	return cancel, done
}

// joined runs fs in order.
func joined(fs []func()) func() {
	return func() {
		for _, f := range fs {
			f()
		}
	}
}

// errorCount counts failures and keeps the last one, safe for concurrent
// use (a tenant's gater reports without the daemon's lock).
type errorCount struct {
	n    atomic.Uint64
	last atomic.Pointer[string]
}

func (c *errorCount) note(err error) {
	msg := err.Error()
	c.last.Store(&msg)
	c.n.Add(1)
}

// get returns the count and the last error ("" when none).
func (c *errorCount) get() (uint64, string) {
	n := c.n.Load()
	if p := c.last.Load(); p != nil {
		return n, *p
	}
	return n, ""
}
