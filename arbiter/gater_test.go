package arbiter

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
)

// fakeLaunches is a launch gate with one process that launches as fast as
// the gate lets it: beyond the allowance it is held until released.
type fakeLaunches struct {
	mu                       sync.Mutex
	admitted, holds, allowed uint64
	launched                 int // launches that ran, held ones included once released
	held                     bool
	settled                  int // calls of Counts: how often the pacer settled
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

func (f *fakeLaunches) Counts() (uint64, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settled++
	return f.admitted, f.holds, nil
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

func (f *fakeLaunches) Release(Held) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = false
	f.launched++ // the held launch runs now
	return nil
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
	g.Launches = f
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
	stop := time.Now().Add(run)
	for time.Now().Before(stop) {
		f.launch()
		time.Sleep(50 * time.Microsecond)
	}
	end()
	f.mu.Lock()
	defer f.mu.Unlock()
	// rate × run / cost = 250 launches, plus at most one period's burst.
	if f.launched < 225 || f.launched > 300 {
		t.Errorf("%d launches in %v at rate %.2f of 1 ms each, want about 250", f.launched, run, rate)
	}
	if f.holds < 100 {
		t.Errorf("held %d times: the gate did not pace at the launch", f.holds)
	}
	if f.held || f.allowed != math.MaxUint64 {
		t.Errorf("after the gater ended: held %v, allowance %d", f.held, f.allowed)
	}
	frozen, throttled := g.State()
	if frozen || throttled < run/4 {
		t.Errorf("state after run: frozen %v, throttled %v (held a large part of the time)", frozen, throttled)
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
