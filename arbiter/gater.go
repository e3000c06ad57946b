package arbiter

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
)

// Gater applies one tenant's duty cycle to its gate: in every period the
// tenant runs for Duty of it from Offset and is frozen for the rest.
// Periods are aligned to a common epoch, so the offsets of all tenants
// stagger as the arbiter planned.
type Gater struct {
	gate   cgroup.Gate
	period time.Duration
	epoch  time.Time
	// OnFreeze is told each frozen interval once it ends (the meter
	// discounts sync waits that overlap one).
	OnFreeze func(from, to time.Time)
	// OnError reports a failed freeze or thaw.
	OnError func(error)

	mu        sync.Mutex
	duty      float64
	offset    float64
	frozen    bool
	throttled time.Duration
	wake      chan struct{}
}

// NewGater returns a gater over gate with periods of period since epoch.
func NewGater(gate cgroup.Gate, period time.Duration, epoch time.Time) *Gater {
	return &Gater{gate: gate, period: period, epoch: epoch, duty: 1, wake: make(chan struct{}, 1)}
}

// Set changes the duty cycle from the next period.
func (g *Gater) Set(duty, offset float64) {
	g.mu.Lock()
	g.duty, g.offset = duty, offset
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// State reports whether the tenant is frozen now and its frozen time so
// far.
func (g *Gater) State() (frozen bool, throttled time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.frozen, g.throttled
}

// Run gates until ctx ends, and leaves the tenant thawed.
func (g *Gater) Run(ctx context.Context) {
	defer func() { g.thaw(time.Now()) }()
	for {
		g.mu.Lock()
		duty, offset := g.duty, g.offset
		g.mu.Unlock()
		now := time.Now()
		n := now.Sub(g.epoch) / g.period
		start := g.epoch.Add(n * g.period)
		if duty >= 1 || (1-duty)*float64(g.period) < float64(time.Millisecond) {
			if !g.sleepUntil(ctx, start.Add(g.period)) {
				return
			}
			continue
		}
		f := math.Mod(offset+duty, 1)
		freezeAt := start.Add(time.Duration(f * float64(g.period)))
		if freezeAt.Before(now) {
			freezeAt = freezeAt.Add(g.period)
		}
		if !g.sleepUntil(ctx, freezeAt) {
			return
		}
		from := time.Now()
		if err := g.gate.Freeze(); err != nil && g.OnError != nil {
			g.OnError(err)
		}
		g.mu.Lock()
		g.frozen = true
		g.mu.Unlock()
		thawAt := freezeAt.Add(time.Duration((1 - duty) * float64(g.period)))
		t := time.NewTimer(time.Until(thawAt))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		g.thaw(from)
		if ctx.Err() != nil {
			return
		}
	}
}

// thaw resumes the tenant if it is frozen and accounts the frozen time.
func (g *Gater) thaw(from time.Time) {
	g.mu.Lock()
	was := g.frozen
	g.frozen = false
	g.mu.Unlock()
	if !was {
		return
	}
	if err := g.gate.Thaw(); err != nil && g.OnError != nil {
		g.OnError(err)
	}
	to := time.Now()
	g.mu.Lock()
	g.throttled += to.Sub(from)
	g.mu.Unlock()
	if g.OnFreeze != nil {
		g.OnFreeze(from, to)
	}
}

// sleepUntil waits for t, a Set, or the end of ctx; false when ctx ended.
func (g *Gater) sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
	case <-g.wake:
	}
	return true
}
