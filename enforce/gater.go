package enforce

import (
	"context"
	"errors"
	"io/fs"
	"math"
	"os"
	"sync"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/meter"
)

// Gater applies one tenant's duty cycle to its gate: in every period the
// tenant runs for Duty of it from Offset and is frozen for the rest.
// Periods are aligned to a common epoch, so the offsets of all tenants
// stagger as the arbiter planned.
//
// A paced gater (SetRate) instead meters what the tenant submits: it may
// submit GPU work at rate (GPU ns per ns) with a burst of one period.
// Queued work cannot be recalled, so a window gate is blind to a deep
// queue (a tenant frozen for less than its queue takes to drain loses
// nothing); pacing admissions holds the long-run share whatever the queue
// depth. With an Admitter the pacing is exact to the launch: credit is
// turned into an allowance of launches, the launch beyond it holds its
// process, and held processes are released oldest first as credit comes
// in. Without one, the tenant is frozen while its account is in debt,
// which lets a batch of launches through before the freeze lands.
type Gater struct {
	gate   cgroup.Gate
	period time.Duration
	epoch  time.Time
	// Admitter, when set, paces a rate at the launch itself.
	Admitter Admitter
	// LaunchCost returns the GPU ns one launch of the tenant is expected
	// to cost, as the meter models it. Needed with Admitter.
	LaunchCost func() float64
	// Submitted returns what the tenant has submitted so far, as the meter
	// saw and costed it (cumulative). Needed by SetRate without Admitter;
	// with one, it trues the expected launch cost up to the meter's.
	Submitted func() meter.Submitted
	// Meter, when set, is told each frozen interval of the cgroups Frozen
	// lists as a meter.CgroupFrozen effect when it begins (its end
	// unknown) and again when it ends: the meter discounts sync waits that
	// overlap one, also those that return just after the thaw.
	Meter  Observer
	Frozen []uint64
	// OnError reports a failed freeze, thaw or gate operation.
	OnError func(error)

	// clock reads the time the gater acts on (time.Now; a test's stepped
	// clock).
	clock func() time.Time

	// What the stepping goroutine (Run) alone keeps.
	mode     gaterMode
	win      windowPlan      // modeWindows: the next freeze, or the one in force
	frozenAt time.Time       // when the freeze in force began
	acct     account         // a paced mode's credit
	spent    meter.Submitted // a paced mode's Submitted at the last settling
	adm      admission       // modeAdmission: the counts at the last settling

	mu        sync.Mutex
	duty      float64
	offset    float64
	span      float64 // how many GPUs a paced duty spans
	paced     bool
	frozen    bool
	heldSince time.Time // when the launch gate began holding a process (zero: none held)
	thawedAt  time.Time
	throttled time.Duration
	escapes   uint64 // holds ended by someone else, while pacing at the launch gate
	escalated bool   // paced by freezing since escapes reached escapeLimit
	// unthawed is set while its last thaw failed (not for a process or
	// cgroup that is gone): it may still be frozen.
	unthawed bool
	wake     chan struct{}
}

// Admitter admits a tenant's launches up to an allowance; the launch
// beyond it holds its process until Release.
type Admitter interface {
	// Counts returns the launches admitted, the processes held and the
	// holds someone else ended, the held launch running then (a sibling's
	// SIGCONT), so far (all cumulative; an escaped launch counts in
	// admitted once the process passes the gate again).
	Counts() (admitted, holds, escapes uint64, err error)
	// Allow lets admitted reach n (math.MaxUint64: no limit).
	Allow(n uint64) error
	// Held returns the processes held now, oldest first.
	Held() ([]Held, error)
	// Release continues a held process, its held launch running then, and
	// reports whether it did: false when the hold was already gone (the
	// process escaped) or replaced by a newer one.
	Release(Held) (bool, error)
}

// Held is a process held at the launch gate.
type Held struct {
	PID   int
	Since time.Time
	// Launches is how many launches wait in the hold (its threads'): each
	// is charged at the release.
	Launches int
	// Token is the gate's own record of the hold, handed back to Release.
	Token any
}

// paceTick is how often a paced gater settles its account: a freeze lands
// at most this long after the submission that overdrew it, and a held
// launch is released at most this late.
const paceTick = 2 * time.Millisecond

// quietTicks is how many ticks without a launch or a hold make an
// admission pacer quiet: it then settles once a period, or when woken
// (Wake: a process was held; a new rate). A quiet pacer's allowance may lag
// its credit; the launch that finds it short is held, and wakes it. Most
// tenants of a large host are idle; their pacers cost next to nothing.
const quietTicks = 5

// maxDebt bounds a paced tenant's debt to this much wall time at its rate,
// so an overestimated cost never freezes it for longer.
const maxDebt = 2 * time.Second

// escapeLimit is how many holds of a tenant someone else may end (a
// sibling's SIGCONT) before its pacing escalates from the launch gate to
// freezing its cgroup, which no signal undoes.
const escapeLimit = 3

// defaultLaunchCost prices a launch before the meter has seen any of the
// tenant's.
const defaultLaunchCost = float64(time.Millisecond)

// NewGater returns a gater over gate with periods of period since epoch.
func NewGater(gate cgroup.Gate, period time.Duration, epoch time.Time) *Gater {
	return &Gater{gate: gate, period: period, epoch: epoch, duty: 1, span: 1, wake: make(chan struct{}, 1), clock: time.Now}
}

// Set changes the duty cycle from the next period (window gating).
func (g *Gater) Set(duty, offset float64) {
	g.mu.Lock()
	changed := g.duty != duty || g.offset != offset || g.paced
	g.duty, g.offset, g.paced = duty, offset, false
	g.mu.Unlock()
	if changed {
		g.poke()
	}
}

// SetRate paces the tenant's submissions to rate, a fraction of the time
// of each of the gpus GPUs its launches reach (rate × gpus GPU ns per ns
// in all, paid from one account; gpus below 1 counts as 1); a rate of 1
// or more lets it run freely.
func (g *Gater) SetRate(rate float64, gpus int) {
	span := float64(max(gpus, 1))
	g.mu.Lock()
	changed := g.duty != rate || g.span != span || !g.paced
	g.duty, g.span, g.paced = rate, span, true
	g.mu.Unlock()
	if changed {
		g.poke()
	}
}

// Wake makes the gater settle its account now: its launch gate has just
// held a process (the probes report it), which waits until released.
func (g *Gater) Wake() { g.poke() }

func (g *Gater) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// State reports whether the tenant is frozen (or has a process held) now
// and its frozen time so far, a hold in progress included.
func (g *Gater) State() (frozen bool, throttled time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	throttled = g.throttled
	if !g.heldSince.IsZero() {
		throttled += g.clock().Sub(g.heldSince)
	}
	return g.frozen, throttled
}

// Escapes reports how many of the tenant's holds at the launch gate
// someone else ended, and whether that made its pacing escalate from the
// launch gate to freezing its cgroup.
func (g *Gater) Escapes() (escapes uint64, escalated bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.escapes, g.escalated
}

// HeldSince reports whether the gate held the tenant back at any time
// since t: a tenant frozen with its queue drained shows no work, yet
// wants the GPU.
func (g *Gater) HeldSince(t time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.frozen || g.thawedAt.After(t)
}

// gaterMode is which of its three ways a gater acts in.
type gaterMode int

const (
	modeNone      gaterMode = iota // not started, or finished
	modeWindows                    // freezing outside its window of each period
	modePaced                      // freezing while its account is in debt
	modeAdmission                  // pacing launches at the launch gate
)

// Run steps the gater until ctx ends, waiting between steps for the time
// each step asks for, a Wake or a new duty; it leaves the tenant thawed
// and its launch gate open.
func (g *Gater) Run(ctx context.Context) {
	defer g.finish()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		timer.Reset(g.step().Sub(g.clock())) // drops a tick not taken (Go ≥ 1.23 timers)
		select {
		case <-ctx.Done():
		case <-timer.C:
		case <-g.wake:
		}
	}
}

// step settles the gater once, at its clock's now, in the way Set or
// SetRate last asked for (leaving the previous way first: the gate opened,
// the tenant thawed), and returns when it next needs a step. Only Run (or
// a test standing in for it) calls step and finish, from one goroutine.
func (g *Gater) step() time.Time {
	now := g.clock()
	g.mu.Lock()
	duty, offset, span, paced, escalated := g.duty, g.offset, g.span, g.paced, g.escalated
	g.mu.Unlock()
	mode := modeWindows
	switch {
	case paced && g.Admitter != nil && !escalated:
		mode = modeAdmission
	case paced:
		mode = modePaced
	}
	if mode != g.mode {
		g.leave(now)
		g.enter(mode, now)
	}
	switch mode {
	case modeAdmission:
		return g.admit(now, duty*span, duty >= 1)
	case modePaced:
		return g.pace(now, duty*span, duty >= 1)
	default:
		return g.window(now, duty, offset)
	}
}

// finish ends the gater's way of acting: the launch gate opened, whoever
// it holds released, the tenant thawed (a failed thaw tried again).
func (g *Gater) finish() {
	g.leave(g.clock())
	g.mode = modeNone
}

// leave ends the current way of acting.
func (g *Gater) leave(now time.Time) {
	if g.mode == modeAdmission {
		g.openGate(now)
	}
	g.thaw(now)
}

// enter starts a way of acting: a paced one with an empty account, the
// submissions and launch counts so far taken as its baseline.
func (g *Gater) enter(mode gaterMode, now time.Time) {
	g.mode, g.win = mode, windowPlan{}
	switch mode {
	case modePaced:
		g.acct, g.spent = account{last: now}, g.Submitted()
	case modeAdmission:
		g.acct, g.spent = account{last: now}, meter.Submitted{}
		if g.Submitted != nil {
			g.spent = g.Submitted()
		}
		admitted, holds, escaped, err := g.Admitter.Counts()
		g.report(err)
		g.adm = admission{admitted: admitted, released: holds, escaped: escaped, seenAt: now}
	}
}

// minFreeze is the shortest frozen part of a period a window gater keeps:
// below it the tenant runs the whole period (a shorter one is not worth a
// freeze and a thaw).
const minFreeze = time.Millisecond

// windowPlan is a window gater's next freeze, or the freeze in force.
type windowPlan struct {
	planned  bool      // a freeze is planned at freezeAt
	frozen   bool      // the planned freeze began; it ends at thawAt
	freezeAt time.Time // when the planned freeze begins
	thawAt   time.Time // when the freeze in force ends
	duty     float64   // the duty the freeze was planned for
}

// window freezes the tenant for the part of each period outside its
// running window. The frozen part of period k begins at epoch + (k +
// (offset + duty) mod 1) × period and lasts (1 - duty) × period, so it
// may run into the next period. A step plans the next freeze that begins
// at or after now (none while the frozen part is under minFreeze: the
// tenant runs until the next period begins); the freeze starts when its
// time comes and runs to its planned end whatever Set says meanwhile; a
// new duty is planned from the next freeze on. It returns when the plan
// next needs a step.
func (g *Gater) window(now time.Time, duty, offset float64) time.Time {
	w, p := &g.win, g.period
	switch {
	case w.frozen && now.Before(w.thawAt):
		return w.thawAt
	case w.frozen:
		g.thaw(now)
		*w = windowPlan{}
	case w.planned && !now.Before(w.freezeAt):
		g.freeze(now) // a freeze that fails is undone at once; the window still ends at thawAt
		w.frozen, w.planned = true, false
		w.thawAt = w.freezeAt.Add(time.Duration((1 - w.duty) * float64(p)))
		return w.thawAt
	}
	start := g.epoch.Add(now.Sub(g.epoch) / p * p)
	if duty >= 1 || time.Duration((1-duty)*float64(p)) < minFreeze {
		w.planned = false
		return start.Add(p)
	}
	freezeAt := start.Add(time.Duration(math.Mod(offset+duty, 1) * float64(p)))
	if freezeAt.Before(now) {
		freezeAt = freezeAt.Add(p)
	}
	*w = windowPlan{planned: true, freezeAt: freezeAt, duty: duty}
	return freezeAt
}

// pace settles a tenant paced by freezing: submissions are charged as
// the meter costs them, and it is frozen while its balance (credit at
// rate, GPU ns per ns) is negative, unless free.
func (g *Gater) pace(now time.Time, rate float64, free bool) time.Time {
	s := g.Submitted()
	g.acct.settle(now, rate, g.period, max(s.NS-g.spent.NS, 0))
	g.spent = s
	frozen := g.isFrozen()
	switch {
	case (free || g.acct.balance >= 0) && frozen:
		g.thaw(now)
	case !free && g.acct.balance < 0 && !frozen:
		g.freeze(now)
	}
	return now.Add(paceTick)
}

// admission is what an admission pacer knew at its last settling.
type admission struct {
	admitted, released, escaped uint64 // the Admitter's counts
	allowed                     uint64 // the allowance last written
	wrote                       bool   // allowed was written
	quiet                       int    // settlings in a row without a launch or a hold
	// owed are the launches let through that the meter has not seen yet,
	// charged at the expected cost each (owedNS in all) until it does.
	owed   uint64
	owedNS float64
	// seenNS and seenN are the meter's cost of the launches it saw and
	// their number, each decayed by costWindow since, as of seenAt.
	seenNS, seenN float64
	seenAt        time.Time
}

// admit settles a tenant paced at its launch gate: credit accrues at its
// rate up to one period's worth; each launch the gate lets through (each
// admitted one, each held one as it is released) is charged at once at
// the expected launch cost, and once the meter has seen it that charge
// is exchanged for the meter's own cost of it (Submitted): in the long
// run the tenant pays what the meter costs its work, whatever its mix of
// kernels, and the expected cost only sizes the allowance and bridges
// the meter's lag. The allowance lets through what the balance pays for,
// and held processes wait (oldest first) until it pays for their launch.
// A launch whose hold someone else ended is charged when the gate counts
// it; at escapeLimit such escapes the tenant is paced by freezing instead
// (escalated: the next step, at once). It returns the next settling:
// after paceTick, or after a period once quiet.
func (g *Gater) admit(now time.Time, rate float64, free bool) time.Time {
	a := &g.adm
	n, h, e, err := g.Admitter.Counts()
	if err != nil {
		g.report(err)
		return now.Add(paceTick)
	}
	if e != a.escaped {
		g.mu.Lock()
		g.escapes += e - a.escaped
		g.escalated = g.escapes >= escapeLimit
		escalate := g.escalated
		g.mu.Unlock()
		a.escaped = e
		if escalate {
			return now
		}
	}
	exchanged := g.trueUp(now)
	cost := g.expectedCost()
	// The probes count a launch as it passes the gate and take the count
	// back where they hold it: a count read between the two is one too
	// high and the next one lower. The launch read then is owed already,
	// so launches are owed from the highest count read (a difference
	// from a lower one would wrap): the next launch admitted is not.
	var admitted uint64
	if n > a.admitted {
		admitted, a.admitted = n-a.admitted, n
	}
	g.acct.settle(now, rate, g.period, exchanged+g.owe(admitted, cost))
	idle := admitted == 0
	var held []Held
	if h != a.released || g.holding() {
		held, err = g.Admitter.Held()
		g.report(err)
		a.released = h
	}
	for len(held) > 0 && (free || g.acct.balance >= 0) {
		released, err := g.Admitter.Release(held[0])
		g.report(err)
		if released {
			g.acct.charge(g.owe(uint64(max(held[0].Launches, 1)), cost), rate)
			idle = false // a tenant whose every launch is held and released is busy
		}
		held = held[1:]
	}
	allow := uint64(math.MaxUint64)
	if !free {
		allow = n // held processes go first
		if len(held) == 0 && g.acct.balance > 0 {
			allow = n + uint64(g.acct.balance/cost)
		}
	}
	if !a.wrote || allow != a.allowed {
		g.report(g.Admitter.Allow(allow))
		a.allowed, a.wrote = allow, true
	}
	g.noteHeld(len(held) > 0, now)
	if len(held) == 0 && (free || idle) {
		a.quiet++
	} else {
		a.quiet = 0
	}
	if a.quiet >= quietTicks {
		return now.Add(max(g.period, paceTick))
	}
	return now.Add(paceTick)
}

// trueUp returns what to charge, at now, for the launches the meter saw
// since the last settling: its cost of each, in exchange for the expected
// cost it was owed at (the launches seen beyond those owed, from
// processes the gate did not count, are charged at the meter's cost
// alone); and it learns the meter's mean cost of a launch (expectedCost).
// A meter that forgot the tenant (no contexts left) starts its counts
// again: nothing is seen or charged for that settling.
func (g *Gater) trueUp(now time.Time) float64 {
	a := &g.adm
	if g.Submitted == nil {
		return 0
	}
	s := g.Submitted()
	seen, spent := s.Launches-g.spent.Launches, s.NS-g.spent.NS
	if s.Launches < g.spent.Launches || s.NS < g.spent.NS {
		seen, spent = 0, 0
	}
	g.spent = s
	decay := math.Exp(-float64(now.Sub(a.seenAt)) / float64(costWindow))
	a.seenAt = now
	a.seenNS, a.seenN = a.seenNS*decay+spent, a.seenN*decay+float64(seen)
	settled := a.owedNS // what the seen launches were owed at
	if seen < a.owed {
		settled = a.owedNS * float64(seen) / float64(a.owed)
	}
	a.owed -= min(seen, a.owed)
	a.owedNS = max(a.owedNS-settled, 0)
	return spent - settled
}

// costWindow is how far back the meter's costs of a tenant's launches
// count towards the cost the gate expects of its next one.
const costWindow = time.Second

// expectedCost is the GPU ns the gate expects the tenant's next launch to
// cost: the meter's mean cost of its launches seen in about the last
// costWindow, or, before the meter has seen one, its LaunchCost. It sizes
// the allowance and what a launch is owed at; the meter's cost of the
// launch replaces it once seen.
func (g *Gater) expectedCost() float64 {
	if a := &g.adm; a.seenN >= 1 && a.seenNS > 0 {
		return a.seenNS / a.seenN
	}
	if cost := g.LaunchCost(); cost > 0 {
		return cost
	}
	return defaultLaunchCost
}

// owe charges n launches let through at the expected cost until the
// meter sees them, and returns that charge.
func (g *Gater) owe(n uint64, cost float64) float64 {
	g.adm.owed += n
	g.adm.owedNS += float64(n) * cost
	return float64(n) * cost
}

// openGate lets every launch through and releases whoever is held.
func (g *Gater) openGate(now time.Time) {
	g.report(g.Admitter.Allow(math.MaxUint64))
	held, err := g.Admitter.Held()
	g.report(err)
	for _, h := range held {
		_, err := g.Admitter.Release(h)
		g.report(err)
	}
	g.noteHeld(false, now)
}

func (g *Gater) holding() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.heldSince.IsZero()
}

func (g *Gater) isFrozen() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.frozen
}

// noteHeld keeps the state and throttled time of a launch-gated tenant:
// frozen while any of its processes is held.
func (g *Gater) noteHeld(held bool, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case held && g.heldSince.IsZero():
		g.heldSince, g.frozen = now, true
	case !held && !g.heldSince.IsZero():
		g.throttled += now.Sub(g.heldSince)
		g.heldSince, g.frozen, g.thawedAt = time.Time{}, false, now
	}
}

func (g *Gater) report(err error) {
	if err != nil && g.OnError != nil {
		g.OnError(err)
	}
}

// account is a paced tenant's credit, in GPU ns, shared by both ways of
// pacing (at the launch gate and by freezing): it accrues at the rate (GPU
// ns per ns) up to one period's worth, is charged what the tenant
// submits, and owes at most maxDebt's worth.
type account struct {
	balance float64
	last    time.Time // when credit last accrued
}

// settle accrues the credit since the last settling, then charges spent.
// Credit beyond one period's worth is lost before the charge: a quiet
// pacer settles seldom, and must not hand out more than a busy one.
func (a *account) settle(now time.Time, rate float64, period time.Duration, spent float64) {
	a.balance = math.Min(a.balance+rate*float64(now.Sub(a.last)), rate*float64(period))
	a.last = now
	a.charge(spent, rate)
}

// charge takes ns from the balance, down to the most debt rate allows.
func (a *account) charge(ns, rate float64) {
	a.balance = math.Max(a.balance-ns, -rate*float64(maxDebt))
}

// freeze stops the tenant from now. A freeze that fails, or that the
// kernel does not confirm in time, is undone at once: the tenant runs on
// (nothing is left half-frozen for a thaw that would never come), and the
// error is reported.
func (g *Gater) freeze(now time.Time) {
	g.noteFrozen(now, time.Time{})
	if err := g.gate.Freeze(); err != nil {
		thawErr := g.gate.Thaw()
		g.noteThaw(thawErr)
		g.report(errors.Join(err, thawErr))
		g.noteFrozen(now, g.clock())
		return
	}
	g.frozenAt = now
	g.mu.Lock()
	g.frozen = true
	g.mu.Unlock()
}

// thaw resumes the tenant if it is frozen and accounts the time from its
// freeze (or the failed thaw before) to the thaw's return.
func (g *Gater) thaw(now time.Time) {
	g.mu.Lock()
	was := g.frozen
	g.frozen = false
	g.mu.Unlock()
	if !was {
		return
	}
	err := g.gate.Thaw()
	g.noteThaw(err)
	g.report(err)
	to := g.clock()
	from := g.frozenAt
	if from.IsZero() || from.After(now) {
		from = now
	}
	g.frozenAt = to
	g.mu.Lock()
	g.throttled += to.Sub(from)
	g.thawedAt = to
	g.mu.Unlock()
	g.noteFrozen(from, to)
}

// Observer takes the meter's inputs (meter.Meter).
type Observer interface{ Observe(ioctlspy.Event) }

// noteFrozen tells the meter that the tenant's cgroups were frozen from
// from to to (zero: still frozen).
func (g *Gater) noteFrozen(from, to time.Time) {
	if g.Meter == nil {
		return
	}
	now, mono := g.clock(), meter.MonotonicNow()
	f, e := mono-uint64(now.Sub(from)), uint64(math.MaxUint64)
	if !to.IsZero() {
		e = mono - uint64(now.Sub(to))
	}
	for _, id := range g.Frozen {
		g.Meter.Observe(meter.Freeze(id, f, e))
	}
}

// noteThaw records whether a thaw failed with the tenant still there; it
// then counts as frozen, so that the next thaw (the window's, or Run's
// at its end) tries again.
func (g *Gater) noteThaw(err error) {
	gone := errors.Is(err, os.ErrProcessDone) || errors.Is(err, fs.ErrNotExist)
	g.mu.Lock()
	g.unthawed = err != nil && !gone
	g.frozen = g.frozen || g.unthawed
	g.mu.Unlock()
}

// Unthawed reports whether the gater's last thaw failed: the tenant may
// still be frozen, so whoever retires the gater keeps it in the ledger
// for the next ThawAll.
func (g *Gater) Unthawed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.unthawed
}
