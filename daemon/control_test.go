package daemon

import (
	"slices"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/policy"
)

// The control window is three periods, at least minControlWindow and at
// most the meter's window.
func TestControlWindowSpansThreePeriods(t *testing.T) {
	for _, tc := range []struct{ period, meter, want time.Duration }{
		{100 * time.Millisecond, time.Second, 300 * time.Millisecond},
		{10 * time.Millisecond, time.Second, minControlWindow},
		{200 * time.Millisecond, time.Second, 600 * time.Millisecond},
		{500 * time.Millisecond, time.Second, time.Second},
	} {
		d := &Daemon{cfg: Config{Window: tc.meter}, policy: &policy.Config{Period: tc.period}}
		if got := d.controlWindow(); got != tc.want {
			t.Errorf("period %v, meter window %v: control window %v, want %v", tc.period, tc.meter, got, tc.want)
		}
	}
}

// The shorter control windows are a third and two thirds of the control
// window in whole periods, without repeats and never the window itself.
func TestShorterWindows(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		window, period time.Duration
		want           []time.Duration
	}{
		{300 * ms, 100 * ms, []time.Duration{100 * ms, 200 * ms}},
		{300 * ms, 10 * ms, []time.Duration{100 * ms, 200 * ms}},
		{600 * ms, 200 * ms, []time.Duration{200 * ms, 400 * ms}},
		{time.Second, 500 * ms, []time.Duration{500 * ms}},
		{300 * ms, 300 * ms, nil},
		{300 * ms, 0, nil},
	} {
		if got := shorterWindows(tc.window, tc.period); !slices.Equal(got, tc.want) {
			t.Errorf("window %v, period %v: %v, want %v", tc.window, tc.period, got, tc.want)
		}
	}
}
