// Package tuning names the daemon's control constants that are not policy
// but that an operator may need to change on a host unlike the ones they
// were measured on (a driver slow to report, processes that set up their
// GPU slowly): each with its unit, its bounds and why it has its default.
// `gpuarb daemon --tune NAME=VALUE` sets them; `--tune help` lists them.
package tuning

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
)

// Tunables are the values the daemon runs with. The zero value of a field
// means its default (Filled).
type Tunables struct {
	// MinControlWindow is the shortest span of the shares the arbiter
	// steers by.
	MinControlWindow time.Duration
	// UngroupedGrace is how long a busy tenant may go without a channel
	// group the probes saw before it is paced at the launch gate.
	UngroupedGrace time.Duration
	// UnprobedPeriod is the least freeze period of a tenant with processes
	// the probes do not see.
	UnprobedPeriod time.Duration
	// MeterLag is how far behind the present the meter settles its
	// replay, waiting for events still in the ring buffer.
	MeterLag time.Duration
	// MaxHold bounds one latency hold.
	MaxHold time.Duration
	// SteerReprobe is how long a GPU whose driver refused steering is
	// paced before it is tried again.
	SteerReprobe time.Duration
}

// Tunable describes one field of Tunables.
type Tunable struct {
	Name              string
	Default, Min, Max time.Duration
	Why               string
	field             func(*Tunables) *time.Duration
}

// All are the tunables, in the order help lists them.
var All = []Tunable{
	{"min-control-window", 300 * time.Millisecond, 100 * time.Millisecond, 10 * time.Second,
		"the shortest window of the shares the arbiter steers by (at least 3 policy periods, at most --window): shorter reacts sooner and swings more with a closed loop's bursts; 1 and 2 periods scored no better over the fuzzer's seeds",
		func(t *Tunables) *time.Duration { return &t.MinControlWindow }},
	{"ungrouped-grace", time.Second, 100 * time.Millisecond, time.Minute,
		"how long a busy tenant on a steered GPU may go without a channel group the probes saw before it is paced at the launch gate instead: a process that has just set up its GPU may not be in the table at the next step",
		func(t *Tunables) *time.Duration { return &t.UngroupedGrace }},
	{"unprobed-period", 500 * time.Millisecond, 100 * time.Millisecond, 10 * time.Second,
		"the least freeze period of a tenant whose launches the probes do not see: a freeze reaches only work not yet submitted, so periods must be long beside its queue, yet the meter's window must hold several",
		func(t *Tunables) *time.Duration { return &t.UnprobedPeriod }},
	{"meter-lag", 20 * time.Millisecond, time.Millisecond, time.Second,
		"how far behind the present the meter settles its replay of the GPU's schedule, waiting for events still in the ring buffer (read every 5 ms): longer on a host whose reader falls behind",
		func(t *Tunables) *time.Duration { return &t.MeterLag }},
	{"max-hold", 20 * time.Millisecond, time.Millisecond, time.Second,
		"the longest one latency hold keeps the other tenants' channel groups off a GPU: a latency tenant that launches and does not wait lets them run again after it",
		func(t *Tunables) *time.Duration { return &t.MaxHold }},
	{"steer-reprobe", 10 * time.Second, time.Second, time.Hour,
		"how long a GPU whose driver refused the scheduling controls is paced at the launch gate before it is probed again",
		func(t *Tunables) *time.Duration { return &t.SteerReprobe }},
}

// Defaults are the tunables' defaults.
func Defaults() Tunables {
	var t Tunables
	return t.Filled()
}

// Filled is t with every zero field at its default.
func (t Tunables) Filled() Tunables {
	for _, tn := range All {
		if p := tn.field(&t); *p == 0 {
			*p = tn.Default
		}
	}
	return t
}

// Set sets one tunable from "name=duration" (a Go duration: 250ms, 2s),
// refusing an unknown name or a value out of its bounds.
func (t *Tunables) Set(spec string) error {
	name, value, ok := strings.Cut(spec, "=")
	if !ok {
		return fmt.Errorf("tune %q: want NAME=DURATION (--tune help lists them)", spec)
	}
	for _, tn := range All {
		if tn.Name != name {
			continue
		}
		d, err := time.ParseDuration(value)
		if err != nil {
			return fmt.Errorf("tune %s: %w", name, err)
		}
		if d < tn.Min || d > tn.Max {
			return fmt.Errorf("tune %s: %v out of range %v–%v", name, d, tn.Min, tn.Max)
		}
		*tn.field(t) = d
		return nil
	}
	return fmt.Errorf("tune %q: no such tunable (--tune help lists them)", name)
}

// Help lists the tunables with their defaults, bounds and why.
func Help() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tDEFAULT\tRANGE\tWHAT")
	for _, tn := range All {
		fmt.Fprintf(w, "%s\t%v\t%v–%v\t%s\n", tn.Name, tn.Default, tn.Min, tn.Max, tn.Why)
	}
	_ = w.Flush()
	return b.String()
}
