package enforce

import (
	"math"
	"time"
)

// Shown is what a tenant's status row says of it before its actuators are
// asked: the state the control step found ("running", "idle", ...), its
// duty, and how its GPU is steered.
type Shown struct {
	State     string
	Duty      float64
	Enforcing bool // enforcement is on (not observe-only, not thawed)
	// OnScheduler: its GPU's own scheduler is steered; SteeredAway: its
	// channel groups run other than the driver would (a timeslice not the
	// GPU's base, or paused part of each period).
	OnScheduler, SteeredAway bool
	Unprobed                 bool // it has processes the probes do not see
}

// LiveState names what holds the tenant back now, with the time its
// actuators have held it back so far (ns).
func (t *Tenant) LiveState(s Shown) (string, uint64) {
	state := s.State
	var throttled time.Duration
	pauser, gater := t.Pauser(), t.Gater()
	switch {
	case pauser != nil:
		var paused bool
		paused, throttled = pauser.State()
		if s.State == "running" && s.SteeredAway {
			state = "steered"
		}
		if paused {
			state = "paused"
		}
	case gater != nil:
		var stopped bool
		stopped, throttled = gater.State()
		_, escalated := gater.Escapes()
		// Escalated, or with unprobed processes, it is frozen in windows.
		atGate := t.AtLaunchGate() && !escalated && !s.Unprobed
		switch {
		case stopped && atGate:
			state = "held" // a process held at the launch gate
		case stopped:
			state = "frozen"
		case s.Duty < 1 && s.Enforcing && atGate:
			state = "paced"
		case s.Duty < 1 && s.Enforcing:
			state = "throttled"
		}
	case s.OnScheduler && s.State == "running" && s.Enforcing && s.SteeredAway:
		state = "steered"
	}
	return state, uint64(math.Max(0, float64(throttled)))
}

// PacedBy names what holds a tenant whose GPU's scheduler is not steered
// to its share: the launch gate, or freezes (unprobed: it has processes
// whose launches the probes do not see).
func (t *Tenant) PacedBy(unprobed bool) string {
	g := t.Gater()
	switch {
	case unprobed:
		return "freeze (launches unseen)"
	case g != nil && !t.AtLaunchGate():
		return "freeze"
	case g != nil:
		if _, escalated := g.Escapes(); escalated {
			return "freeze (launch gate escaped)"
		}
	}
	return "launch gate"
}
