package enforce

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/ioctlspy"
)

// fakeLaunches is a launch gate with one process that launches as fast as
// the gate lets it: beyond the allowance it is held until released.
type fakeLaunches struct {
	mu                       sync.Mutex
	admitted, holds, allowed uint64
	escapes                  uint64 // holds ended by a sibling's SIGCONT (escape)
	launched                 int    // launches that ran, held ones included once released
	held                     bool
	settled                  int // calls of Counts: how often the pacer settled
}

// escape is a sibling's SIGCONT: the held launch runs, and the gate
// counts it as the BPF gate does when the process passes again.
func (f *fakeLaunches) escape() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held {
		f.held = false
		f.escapes++
		f.admitted++
		f.launched++
	}
}

func (f *fakeLaunches) launch() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held {
		return
	}
	if f.admitted < f.allowed {
		f.admitted++
		f.launched++
		return
	}
	f.holds++
	f.held = true
}

func (f *fakeLaunches) Counts() (uint64, uint64, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settled++
	return f.admitted, f.holds, f.escapes, nil
}

func (f *fakeLaunches) Allow(n uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allowed = n
	return nil
}

func (f *fakeLaunches) Held() ([]Held, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.held {
		return nil, nil
	}
	return []Held{{PID: 42}}, nil
}

func (f *fakeLaunches) Release(Held) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.held {
		return false, nil // escaped meanwhile
	}
	f.held = false
	f.launched++ // the held launch runs now
	return true, nil
}

type nopGate struct{}

func (nopGate) Freeze() error         { return nil }
func (nopGate) Thaw() error           { return nil }
func (nopGate) Target() cgroup.Target { return cgroup.Target{} }

// startPacer runs a gater pacing a fakeLaunches at rate, launches costing
// cost; end stops it and waits.
func startPacer(period time.Duration, rate, cost float64) (f *fakeLaunches, g *Gater, end func()) {
	f = &fakeLaunches{allowed: math.MaxUint64}
	g = NewGater(nopGate{}, period, time.Now())
	g.Admitter = f
	g.LaunchCost = func() float64 { return cost }
	g.SetRate(rate)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	return f, g, func() { cancel(); <-done }
}

// Paced at a rate, a tenant that would launch without end gets that rate
// of GPU time at the meter's launch cost, and is left free of the gate.
func TestAdmissionPacesLaunches(t *testing.T) {
	const (
		rate = 0.25
		cost = float64(time.Millisecond)
		run  = time.Second
	)
	f, g, end := startPacer(100*time.Millisecond, rate, cost)
	start := time.Now()
	for time.Since(start) < run {
		f.launch()
		time.Sleep(50 * time.Microsecond)
	}
	end()
	elapsed := time.Since(start)
	f.mu.Lock()
	defer f.mu.Unlock()
	// rate × run / cost = 250 launches, plus at most one period's burst
	// (the bound pacing guarantees); a loaded host wakes the gater late,
	// which loses credit (183 of 250 once on this 2-vCPU VM under make
	// test), so the floor only tells pacing from a gate that never opens.
	if got := float64(f.launched) * cost / float64(elapsed); got < 0.6*rate || got > 1.2*rate+0.1*rate {
		t.Errorf("%d launches of 1 ms in %v: %.3f of the GPU, want %.2f (-40%%, +30%%)", f.launched, elapsed, got, rate)
	}
	if f.holds < 100 {
		t.Errorf("held %d times: the gate did not pace at the launch", f.holds)
	}
	if f.held || f.allowed != math.MaxUint64 {
		t.Errorf("after the gater ended: held %v, allowance %d", f.held, f.allowed)
	}
	// Held some 35-48% of the run here (the gate notices a hold at its
	// next settle); a loaded host notices later still.
	frozen, throttled := g.State()
	if frozen || throttled < run/8 {
		t.Errorf("state after run: frozen %v, throttled %v, want at least %v (held a large part of the time)", frozen, throttled, run/8)
	}
}

// An idle tenant's pacer settles about once a period, not every tick; a
// process held at its gate wakes it (Wake, as the daemon does on the
// probes' report) and is released at once.
func TestQuietAdmission(t *testing.T) {
	const (
		rate   = 0.25
		cost   = float64(time.Millisecond)
		period = 100 * time.Millisecond
	)
	f, g, end := startPacer(period, rate, cost)
	defer end()

	time.Sleep(500 * time.Millisecond)
	f.mu.Lock()
	settled := f.settled
	f.mu.Unlock()
	if busy := int(500 * time.Millisecond / paceTick); settled > busy/5 {
		t.Errorf("idle for 500 ms, the pacer settled %d times (every tick would be %d)", settled, busy)
	}
	// One period's credit pays for 25 launches; the 26th is held.
	for i := 0; i < 26; i++ {
		f.launch()
	}
	f.mu.Lock()
	held, launched := f.held, f.launched
	f.mu.Unlock()
	if !held || launched != 25 {
		t.Fatalf("after 26 launches with 25 ms of credit: held %v, %d ran", held, launched)
	}
	woken := time.Now()
	g.Wake()
	for {
		f.mu.Lock()
		held = f.held
		f.mu.Unlock()
		if !held {
			break
		}
		if time.Since(woken) > period/2 {
			t.Fatalf("held %v after Wake: the quiet pacer did not settle", time.Since(woken))
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("idle: %d settlings in 500 ms; released %v after Wake", settled, time.Since(woken))
}

// countingGate counts how long it was frozen.
type countingGate struct {
	mu     sync.Mutex
	frozen time.Duration
	since  time.Time
}

func (c *countingGate) Freeze() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.since = time.Now()
	return nil
}

func (c *countingGate) Thaw() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen += time.Since(c.since)
	return nil
}

func (c *countingGate) Target() cgroup.Target { return cgroup.Target{} }

// A window gater told its (unchanged) duty every period, as the daemon does
// every control step, freezes only its window: being told does not make it
// freeze early.
func TestWindowsHoldTheirDutyWhenToldAgain(t *testing.T) {
	gate := &countingGate{}
	g := NewGater(gate, 20*time.Millisecond, time.Now())
	g.Set(0.9, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	start := time.Now()
	for time.Since(start) < 500*time.Millisecond {
		time.Sleep(5 * time.Millisecond)
		g.Set(0.9, 0)
	}
	cancel()
	<-done
	if frac := float64(gate.frozen) / float64(time.Since(start)); frac > 0.2 {
		t.Errorf("frozen %.2f of the time at duty 0.9, want about 0.1", frac)
	}
}

// Issue 18, item 3: a tenant whose holds a sibling keeps ending (SIGCONT)
// is charged for the escaped launches, and after escapeLimit of them is
// paced by freezing its cgroup, which no signal undoes: its rate holds
// where the launch gate alone would have let it run free.
func TestEscapesFromTheLaunchGateEscalateToFreezing(t *testing.T) {
	const (
		rate = 0.25
		cost = float64(time.Millisecond)
	)
	f := &fakeLaunches{allowed: math.MaxUint64}
	gate := &countingGate{}
	g := NewGater(gate, 100*time.Millisecond, time.Now())
	g.Admitter = f
	g.LaunchCost = func() float64 { return cost }
	g.Submitted = func() float64 {
		f.mu.Lock()
		defer f.mu.Unlock()
		return float64(f.launched) * cost
	}
	g.SetRate(rate)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	start := time.Now()
	for time.Since(start) < time.Second {
		f.launch()
		f.escape() // the sibling, at once
		time.Sleep(50 * time.Microsecond)
	}
	cancel()
	<-done
	escapes, escalated := g.Escapes()
	if escapes < escapeLimit || !escalated {
		t.Fatalf("%d escapes, escalated %v; want at least %d and escalated", escapes, escalated, escapeLimit)
	}
	if gate.frozen < 200*time.Millisecond {
		t.Errorf("frozen %v of 1 s: pacing did not move to freezing", gate.frozen)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.allowed != math.MaxUint64 || f.held {
		t.Errorf("after escalating: allowance %d, held %v; want the launch gate open", f.allowed, f.held)
	}
}

// The account both pacers keep: credit accrues at the rate up to one
// period's worth, and that cap comes before the charge (a quiet second
// does not pay for a burst of launches); debt stops at maxDebt's worth.
func TestAccountCapsCreditBeforeTheChargeAndBoundsDebt(t *testing.T) {
	t0 := time.Now()
	period := 100 * time.Millisecond
	a := account{last: t0}
	a.settle(t0.Add(time.Second), 0.5, period, 0) // 500 ms of credit accrued, 50 ms kept
	if want := 0.5 * float64(period); a.balance != want {
		t.Fatalf("after a quiet second: balance %.0f ns, want %.0f", a.balance, want)
	}
	a.settle(t0.Add(2*time.Second), 0.5, period, float64(300*time.Millisecond))
	if want := float64(50*time.Millisecond - 300*time.Millisecond); a.balance != want {
		t.Fatalf("a second's credit capped before 300 ms of launches: balance %.0f ns, want %.0f", a.balance, want)
	}
	a.charge(float64(time.Hour), 0.5)
	if want := -0.5 * float64(maxDebt); a.balance != want {
		t.Fatalf("debt %.0f ns, want at most %.0f", a.balance, want)
	}
}

// stuckGate freezes, and then cannot thaw (its cgroup.freeze not
// writable) until fixed.
type stuckGate struct {
	mu     sync.Mutex
	broken bool
}

func (s *stuckGate) Freeze() error { return nil }

func (s *stuckGate) Thaw() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken {
		return errors.New("write cgroup.freeze: device or resource busy")
	}
	return nil
}

func (s *stuckGate) Target() cgroup.Target { return cgroup.Target{} }

// setBroken makes the gate's thaws fail or not.
func (s *stuckGate) setBroken(broken bool) {
	s.mu.Lock()
	s.broken = broken
	s.mu.Unlock()
}

// runFor runs g at a 20% duty for d.
func runFor(g *Gater, d time.Duration) {
	g.Set(0.2, 0)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	g.Run(ctx)
}

// A gater whose last thaw failed says so (Unthawed), so that its tenant
// stays in the ledger, and tries again at the next thaw; a thaw that
// succeeds clears it.
func TestGaterReportsAFailedThaw(t *testing.T) {
	gate := &stuckGate{}
	for _, broken := range []bool{true, false} {
		gate.setBroken(broken)
		g := NewGater(gate, 20*time.Millisecond, time.Now())
		runFor(g, 100*time.Millisecond)
		if g.Unthawed() != broken {
			t.Errorf("thaw failing %v: Unthawed %v", broken, g.Unthawed())
		}
		if frozen, _ := g.State(); frozen != broken {
			t.Errorf("thaw failing %v: frozen %v after Run, want it counted frozen while its thaw fails", broken, frozen)
		}
	}
	// Fixed, the next thaw succeeds: a gater left counting a failed thaw
	// retries it when it runs again.
	gate.setBroken(true)
	g := NewGater(gate, 20*time.Millisecond, time.Now())
	runFor(g, 100*time.Millisecond)
	gate.setBroken(false)
	runFor(g, 10*time.Millisecond)
	if frozen, _ := g.State(); g.Unthawed() || frozen {
		t.Errorf("after a thaw that succeeds: Unthawed %v, frozen %v", g.Unthawed(), frozen)
	}
}

// unconfirmedGate is a cgroup whose freeze the kernel never confirms (a
// task in uninterruptible sleep): every Freeze fails with ErrNotFrozen.
type unconfirmedGate struct {
	mu             sync.Mutex
	freezes, thaws int
	frozenUnthawed bool
}

func (u *unconfirmedGate) Freeze() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.freezes++
	u.frozenUnthawed = true
	return cgroup.ErrNotFrozen
}

func (u *unconfirmedGate) Thaw() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.thaws++
	u.frozenUnthawed = false
	return nil
}

func (u *unconfirmedGate) Target() cgroup.Target { return cgroup.Target{} }

// Issue 18 item 11: a freeze that fails is undone at once — the tenant is
// never left half-frozen waiting for the window's end — reported, and the
// meter's pause is closed where it began; the gater does not call the
// tenant frozen.
func TestFailedFreezeIsUndoneAndReported(t *testing.T) {
	gate := &unconfirmedGate{}
	g := NewGater(gate, 20*time.Millisecond, time.Now())
	var mu sync.Mutex
	var errs, opened, closed int
	g.OnError = func(error) { mu.Lock(); errs++; mu.Unlock() }
	g.Meter, g.Frozen = observerFunc(func(ev ioctlspy.Event) {
		mu.Lock()
		defer mu.Unlock()
		if ev.Hdr().End == math.MaxUint64 {
			opened++
		} else {
			closed++
		}
	}), []uint64{7}
	g.Set(0.2, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	var sawFrozen bool
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; time.Sleep(time.Millisecond) {
		frozen, _ := g.State()
		sawFrozen = sawFrozen || frozen
	}
	cancel()
	<-done
	gate.mu.Lock()
	defer gate.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d freezes, %d thaws, %d errors, pauses opened %d closed %d", gate.freezes, gate.thaws, errs, opened, closed)
	if gate.freezes < 5 || gate.frozenUnthawed || gate.thaws < gate.freezes {
		t.Errorf("%d freezes, %d thaws, left frozen %v: want every failed freeze undone", gate.freezes, gate.thaws, gate.frozenUnthawed)
	}
	if errs < gate.freezes {
		t.Errorf("%d errors reported for %d failed freezes", errs, gate.freezes)
	}
	if opened != closed {
		t.Errorf("meter pauses opened %d, closed %d", opened, closed)
	}
	if sawFrozen {
		t.Error("the gater called the tenant frozen though no freeze held")
	}
}

// observerFunc is a function as an Observer.
type observerFunc func(ioctlspy.Event)

func (f observerFunc) Observe(ev ioctlspy.Event) { f(ev) }
