package enforce

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/meter"
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
	// racing makes the first count read after a hold one too high, as the
	// probes' is when read between counting the launch and taking the
	// count back for the hold; overcount is that read still to come.
	racing, overcount bool
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
	f.overcount = f.racing
}

func (f *fakeLaunches) Counts() (uint64, uint64, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settled++
	n := f.admitted
	if f.overcount {
		n++
		f.overcount = false
	}
	return n, f.holds, f.escapes, nil
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

// steppedClock is a clock the test moves; nothing waits on it.
type steppedClock struct{ t time.Time }

func (c *steppedClock) now() time.Time { return c.t }

// stepper does what Gater.Run does, on a stepped clock: it steps the gater
// at the times each step asks for, and at once after a poke (a Set with a
// new duty, SetRate, Wake). No test of the gater sleeps.
type stepper struct {
	g       *Gater
	clk     *steppedClock
	next    time.Time
	started bool
	steps   int
}

// newStepper returns a gater over gate with periods of period from the
// stepped clock's start.
func newStepper(gate cgroup.Gate, period time.Duration) *stepper {
	clk := &steppedClock{t: time.Unix(1_700_000_000, 0)}
	g := NewGater(gate, period, clk.t)
	g.clock = clk.now
	return &stepper{g: g, clk: clk}
}

func (s *stepper) step() {
	s.next = s.g.step()
	s.steps++
	s.started = true
}

// run moves the clock on by d, stepping the gater as Run would; every
// `every` (0: never) it first calls on, what the tenant or the daemon does
// at that moment.
func (s *stepper) run(d, every time.Duration, on func()) {
	end := s.clk.t.Add(d)
	tick := s.clk.t.Add(every)
	if !s.started {
		s.step()
	}
	for {
		select {
		case <-s.g.wake:
			s.step()
			continue
		default:
		}
		at := s.next
		if every > 0 && tick.Before(at) {
			at = tick
		}
		if !at.Before(end) {
			break
		}
		s.clk.t = at
		if every > 0 && !at.Before(tick) {
			on()
			tick = tick.Add(every)
		}
		if !at.Before(s.next) {
			s.step()
		}
	}
	s.clk.t = end
}

// since is the stepped clock's time since its start.
func (s *stepper) since() time.Duration { return s.clk.t.Sub(s.g.epoch) }

// Paced at a rate, a tenant that would launch without end gets that rate
// of GPU time at the meter's launch cost, at most one period's credit
// more, and is left free of the gate. So too where the probes' count of
// admitted launches steps back by one, read as a launch passed that was
// then held (racing): the launch read too early is owed once (owed from
// the step back, the difference wrapped to 2^64 launches and held the
// tenant for maxDebt: 1 launch in 1 s). A rate over two GPUs pays for
// twice the launches, from the one account.
func TestAdmissionPacesLaunches(t *testing.T) {
	const (
		rate   = 0.25
		cost   = float64(time.Millisecond)
		period = 100 * time.Millisecond
		run    = time.Second
	)
	for _, tc := range []struct {
		racing bool
		gpus   int
	}{{false, 1}, {true, 1}, {false, 2}} {
		t.Run(fmt.Sprintf("count read between a launch and its hold %v, %d GPUs", tc.racing, tc.gpus), func(t *testing.T) {
			f := &fakeLaunches{allowed: math.MaxUint64, racing: tc.racing}
			s := newStepper(nopGate{}, period)
			s.g.Admitter, s.g.LaunchCost = f, func() float64 { return cost }
			s.g.SetRate(rate, tc.gpus)
			s.run(run, 50*time.Microsecond, f.launch) // 20 launches a ms: 20 times its rate
			s.g.finish()
			// rate × GPUs × run / cost = 250 launches a GPU, plus one
			// period's burst (25 a GPU).
			want := 250 * tc.gpus
			if f.launched < want-1 || f.launched > want+25*tc.gpus+1 {
				t.Errorf("%d launches of 1 ms in %v: want %d, at most %d more", f.launched, run, want, 25*tc.gpus+1)
			}
			if f.holds < 200 {
				t.Errorf("held %d times: the gate did not pace at the launch", f.holds)
			}
			if f.held || f.allowed != math.MaxUint64 {
				t.Errorf("after the gater ended: held %v, allowance %d", f.held, f.allowed)
			}
			// Held from the settling that finds a hold to the one that releases it.
			frozen, throttled := s.g.State()
			if frozen || tc.gpus == 1 && throttled < run*4/10 {
				t.Errorf("state after run: frozen %v, throttled %v, want at least %v", frozen, throttled, run*4/10)
			}
			t.Logf("%d launches, %d holds, throttled %v, %d settlings", f.launched, f.holds, throttled, s.steps)
		})
	}
}

// Paced at rate 0.25, a tenant that repeats a cycle of launches of
// different costs (8 of 4 ms, then 24 of 20 µs, a training step's shape)
// gets that rate of GPU time as the meter costs it — 1 s in 4 s, at most
// one period's credit and the meter's lag more — however far the launch
// cost the meter expects is off: 50 times too high or too low. The meter
// sees each launch one settling late.
func TestAdmissionPacesACycleOfCosts(t *testing.T) {
	const (
		rate   = 0.25
		period = 100 * time.Millisecond
		run    = 4 * time.Second
	)
	costOf := func(i int) float64 {
		if i%32 < 8 {
			return float64(4 * time.Millisecond)
		}
		return float64(20 * time.Microsecond)
	}
	mean := (8*4e6 + 24*20e3) / 32.0
	for _, expected := range []float64{mean * 50, mean / 50} {
		f := &fakeLaunches{allowed: math.MaxUint64}
		s := newStepper(nopGate{}, period)
		var seen meter.Submitted
		lagging := 0 // the launches the meter sees at the next settling
		s.g.Admitter, s.g.LaunchCost = f, func() float64 { return expected }
		s.g.Submitted = func() meter.Submitted {
			for ; int(seen.Launches) < lagging; seen.Launches++ {
				seen.NS += costOf(int(seen.Launches))
			}
			lagging = f.launched
			return seen
		}
		s.g.SetRate(rate, 1)
		s.run(run, 50*time.Microsecond, f.launch)
		s.g.finish()
		var work float64
		for i := 0; i < f.launched; i++ {
			work += costOf(i)
		}
		if want := rate * float64(run); work < 0.97*want || work > want+rate*float64(period)+float64(8*4*time.Millisecond) {
			t.Errorf("expected cost %.0f µs: %d launches, %.0f ms of GPU time in %v; want %.0f ms, at most %.0f more",
				expected/1e3, f.launched, work/1e6, run, want/1e6, (rate*float64(period)+32e6)/1e6)
		}
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
		idle   = 500 * time.Millisecond
	)
	f := &fakeLaunches{allowed: math.MaxUint64}
	s := newStepper(nopGate{}, period)
	s.g.Admitter, s.g.LaunchCost = f, func() float64 { return cost }
	s.g.SetRate(rate, 1)
	s.run(idle, 0, nil)
	// quietTicks settlings at paceTick, then one a period: 10, not the 250
	// of a pacer that settled every tick.
	if want := 1 + quietTicks + int(idle/period); f.settled > want {
		t.Errorf("idle for %v, the pacer settled %d times, want at most %d", idle, f.settled, want)
	}
	// One period's credit pays for 25 launches; the 26th is held.
	for i := 0; i < 26; i++ {
		f.launch()
	}
	if !f.held || f.launched != 25 {
		t.Fatalf("after 26 launches with 25 ms of credit: held %v, %d ran", f.held, f.launched)
	}
	s.g.Wake()
	s.run(0, 0, nil)
	if f.held || f.launched != 26 {
		t.Errorf("after Wake: held %v, %d ran; want the held launch released at once", f.held, f.launched)
	}
}

// recordingGate records its frozen intervals on a stepped clock.
type recordingGate struct {
	s         *stepper
	frozen    bool
	since     time.Duration
	intervals [][2]time.Duration // since the gater's epoch
}

func (r *recordingGate) Freeze() error {
	r.frozen, r.since = true, r.s.since()
	return nil
}

func (r *recordingGate) Thaw() error {
	if r.frozen {
		r.intervals = append(r.intervals, [2]time.Duration{r.since, r.s.since()})
	}
	r.frozen = false
	return nil
}

func (r *recordingGate) Target() cgroup.Target { return cgroup.Target{} }

func (r *recordingGate) total() (sum time.Duration) {
	for _, iv := range r.intervals {
		sum += iv[1] - iv[0]
	}
	return sum
}

// newRecorded returns a stepper over a recordingGate.
func newRecorded(period time.Duration) (*stepper, *recordingGate) {
	gate := &recordingGate{}
	s := newStepper(gate, period)
	gate.s = s
	return s, gate
}

// A window gater freezes exactly the part of each period outside its
// window [offset, offset+duty), which may run into the next period; its
// first freeze is the first that begins after it starts; a freeze runs to
// its planned end, and a new duty holds from the next one.
func TestWindowsFreezeOutsideTheirWindow(t *testing.T) {
	const p = 20 * time.Millisecond
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	for _, c := range []struct {
		name         string
		duty, offset float64
		want         [][2]time.Duration
	}{
		{"first half", 0.5, 0, [][2]time.Duration{{ms(10), ms(20)}, {ms(30), ms(40)}, {ms(50), ms(60)}}},
		{"second half", 0.5, 0.5, [][2]time.Duration{{0, ms(10)}, {ms(20), ms(30)}, {ms(40), ms(50)}}},
		{"into the next period", 0.5, 0.25, [][2]time.Duration{{ms(15), ms(25)}, {ms(35), ms(45)}, {ms(55), ms(60)}}},
		{"too short to freeze", 0.96, 0, nil},
	} {
		s, gate := newRecorded(p)
		s.g.Set(c.duty, c.offset)
		s.run(3*p, 0, nil)
		s.g.finish()
		if len(gate.intervals) != len(c.want) {
			t.Errorf("%s: frozen %v, want %v", c.name, gate.intervals, c.want)
			continue
		}
		for i := range c.want {
			if gate.intervals[i] != c.want[i] {
				t.Errorf("%s: frozen %v, want %v", c.name, gate.intervals, c.want)
				break
			}
		}
	}

	s, gate := newRecorded(p)
	s.g.Set(0.5, 0)
	s.run(ms(15), 0, nil) // frozen from 10 ms
	s.g.Set(0.75, 0)
	s.run(ms(45), 0, nil)
	s.g.finish()
	want := [][2]time.Duration{{ms(10), ms(20)}, {ms(35), ms(40)}, {ms(55), ms(60)}}
	if len(gate.intervals) != len(want) || gate.intervals[0] != want[0] || gate.intervals[1] != want[1] || gate.intervals[2] != want[2] {
		t.Errorf("duty 0.5, then 0.75 from 15 ms, in a freeze: frozen %v, want %v", gate.intervals, want)
	}
}

// A window gater told its (unchanged) duty often, as the daemon does
// every control step, freezes only its window: being told does not make it
// freeze early or late.
func TestWindowsHoldTheirDutyWhenToldAgain(t *testing.T) {
	s, gate := newRecorded(20 * time.Millisecond)
	s.g.Set(0.9, 0)
	s.run(500*time.Millisecond, 5*time.Millisecond, func() { s.g.Set(0.9, 0) })
	s.g.finish()
	if frac := float64(gate.total()) / float64(s.since()); math.Abs(frac-0.1) > 0.001 {
		t.Errorf("frozen %.3f of the time at duty 0.9, want 0.1", frac)
	}
}

// A tenant whose holds a sibling keeps ending (SIGCONT) is charged for
// the escaped launches, and after escapeLimit of them is paced by
// freezing its cgroup, which no signal undoes: its rate holds where the
// launch gate alone would have let it run free.
func TestEscapesFromTheLaunchGateEscalateToFreezing(t *testing.T) {
	const (
		rate = 0.25
		cost = float64(time.Millisecond)
		run  = time.Second
	)
	f := &fakeLaunches{allowed: math.MaxUint64}
	s, gate := newRecorded(100 * time.Millisecond)
	s.g.Admitter, s.g.LaunchCost = f, func() float64 { return cost }
	s.g.Submitted = func() meter.Submitted {
		return meter.Submitted{NS: float64(f.launched) * cost, Launches: uint64(f.launched)}
	}
	s.g.SetRate(rate, 1)
	type thawed struct {
		at       time.Duration
		launched int
	}
	var thaws []thawed // each thaw, and the launches made by then
	wasFrozen := false
	s.run(run, 50*time.Microsecond, func() {
		if wasFrozen && !gate.frozen {
			thaws = append(thaws, thawed{s.since(), f.launched})
		}
		wasFrozen = gate.frozen
		if !gate.frozen {
			f.launch()
			f.escape() // the sibling, at once
		}
	})
	s.g.finish()
	escapes, escalated := s.g.Escapes()
	if escapes < escapeLimit || !escalated {
		t.Fatalf("%d escapes, escalated %v; want at least %d and escalated", escapes, escalated, escapeLimit)
	}
	// Paced by freezing, a tenant that would take 20 times its rate is
	// frozen most of the time and gets its rate from one thaw to another
	// (each thaw lets a tick's launches through, which its debt then
	// repays).
	if len(thaws) < 3 {
		t.Fatalf("thawed at %v: want at least 3 thaws in %v", thaws, run)
	}
	first, last := thaws[0], thaws[len(thaws)-1]
	got := float64(last.launched-first.launched) * cost / float64(last.at-first.at)
	if math.Abs(got-rate) > 0.01 {
		t.Errorf("%d launches of 1 ms from %v to %v: %.3f of the GPU, want %.2f", last.launched-first.launched, first.at, last.at, got, rate)
	}
	if frozen := gate.total(); frozen < run*8/10 {
		t.Errorf("frozen %v of %v: pacing did not move to freezing", frozen, run)
	}
	if f.allowed != math.MaxUint64 || f.held || gate.frozen {
		t.Errorf("after escalating and ending: allowance %d, held %v, frozen %v; want the launch gate open, thawed", f.allowed, f.held, gate.frozen)
	}
}

// The account both pacers keep: credit accrues at the rate up to one
// period's worth, and that cap comes before the charge (a quiet second
// does not pay for a burst of launches); debt stops at maxDebt's worth.
func TestAccountCapsCreditBeforeTheChargeAndBoundsDebt(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
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
// writable) while broken.
type stuckGate struct{ broken bool }

func (s *stuckGate) Freeze() error { return nil }

func (s *stuckGate) Thaw() error {
	if s.broken {
		return errors.New("write cgroup.freeze: device or resource busy")
	}
	return nil
}

func (s *stuckGate) Target() cgroup.Target { return cgroup.Target{} }

// A gater whose last thaw failed says so (Unthawed), so that its tenant
// stays in the ledger, and tries again at the next thaw; a thaw that
// succeeds clears it.
func TestGaterReportsAFailedThaw(t *testing.T) {
	for _, broken := range []bool{true, false} {
		gate := &stuckGate{broken: broken}
		s := newStepper(gate, 20*time.Millisecond)
		s.g.Set(0.2, 0)
		s.run(100*time.Millisecond, 0, nil)
		s.g.finish()
		if s.g.Unthawed() != broken {
			t.Errorf("thaw failing %v: Unthawed %v", broken, s.g.Unthawed())
		}
		if frozen, _ := s.g.State(); frozen != broken {
			t.Errorf("thaw failing %v: frozen %v after Run, want it counted frozen while its thaw fails", broken, frozen)
		}
	}
	// Fixed, the next thaw succeeds: a gater left counting a failed thaw
	// retries it when it runs again.
	gate := &stuckGate{broken: true}
	s := newStepper(gate, 20*time.Millisecond)
	s.g.Set(0.2, 0)
	s.run(100*time.Millisecond, 0, nil)
	s.g.finish()
	gate.broken = false
	s.run(10*time.Millisecond, 0, nil)
	s.g.finish()
	if frozen, _ := s.g.State(); s.g.Unthawed() || frozen {
		t.Errorf("after a thaw that succeeds: Unthawed %v, frozen %v", s.g.Unthawed(), frozen)
	}
}

// unconfirmedGate is a cgroup whose freeze the kernel never confirms (a
// task in uninterruptible sleep): every Freeze fails with ErrNotFrozen.
type unconfirmedGate struct {
	freezes, thaws int
	frozenUnthawed bool
}

func (u *unconfirmedGate) Freeze() error {
	u.freezes++
	u.frozenUnthawed = true
	return cgroup.ErrNotFrozen
}

func (u *unconfirmedGate) Thaw() error {
	u.thaws++
	u.frozenUnthawed = false
	return nil
}

func (u *unconfirmedGate) Target() cgroup.Target { return cgroup.Target{} }

// A freeze that fails is undone at once — the tenant is never left
// half-frozen waiting for the window's end — reported, and the meter's
// pause is closed where it began; the gater does not call the tenant
// frozen.
func TestFailedFreezeIsUndoneAndReported(t *testing.T) {
	const period, run = 20 * time.Millisecond, 300 * time.Millisecond
	gate := &unconfirmedGate{}
	s := newStepper(gate, period)
	var errs, opened, closed int
	s.g.OnError = func(error) { errs++ }
	s.g.Meter, s.g.Frozen = observerFunc(func(ev ioctlspy.Event) {
		if ev.Hdr().End == math.MaxUint64 {
			opened++
		} else {
			closed++
		}
	}), []uint64{7}
	s.g.Set(0.2, 0)
	var sawFrozen bool
	s.run(run, time.Millisecond, func() {
		frozen, _ := s.g.State()
		sawFrozen = sawFrozen || frozen
	})
	s.g.finish()
	if want := int(run / period); gate.freezes != want || gate.frozenUnthawed || gate.thaws != gate.freezes {
		t.Errorf("%d freezes, %d thaws, left frozen %v: want %d, every failed freeze undone", gate.freezes, gate.thaws, gate.frozenUnthawed, want)
	}
	if errs != gate.freezes {
		t.Errorf("%d errors reported for %d failed freezes", errs, gate.freezes)
	}
	if opened != gate.freezes || closed != opened {
		t.Errorf("meter pauses opened %d, closed %d, for %d freezes", opened, closed, gate.freezes)
	}
	if sawFrozen {
		t.Error("the gater called the tenant frozen though no freeze held")
	}
}

// signalGate tells of each freeze and thaw on a channel.
type signalGate struct{ events chan string }

func (s signalGate) Freeze() error         { s.events <- "freeze"; return nil }
func (s signalGate) Thaw() error           { s.events <- "thaw"; return nil }
func (s signalGate) Target() cgroup.Target { return cgroup.Target{} }

// Run steps the gater on the wall clock until its context ends, and
// leaves the tenant thawed.
func TestRunFreezesOnTheClockAndEndsThawed(t *testing.T) {
	gate := signalGate{events: make(chan string, 16)}
	g := NewGater(gate, 10*time.Millisecond, time.Now())
	g.Set(0.5, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	select {
	case ev := <-gate.events:
		if ev != "freeze" {
			t.Fatalf("first gate operation %q, want freeze", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no freeze within 10 s at duty 0.5 of 10 ms")
	}
	cancel()
	<-done
	var last string
	for len(gate.events) > 0 {
		last = <-gate.events
	}
	if frozen, _ := g.State(); frozen || (last != "" && last != "thaw") {
		t.Errorf("after Run: frozen %v, last operation %q", frozen, last)
	}
}

// observerFunc is a function as an Observer.
type observerFunc func(ioctlspy.Event)

func (f observerFunc) Observe(ev ioctlspy.Event) { f(ev) }
