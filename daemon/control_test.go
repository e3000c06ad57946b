package daemon

import (
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/policy"
	"github.com/gpuarb/gpuarb/tuning"
)

// The control window is three periods, at least the min-control-window
// tunable (300 ms unless tuned) and at most the meter's window.
func TestControlWindowSpansThreePeriods(t *testing.T) {
	for _, tc := range []struct{ period, meter, tuned, want time.Duration }{
		{100 * time.Millisecond, time.Second, 0, 300 * time.Millisecond},
		{10 * time.Millisecond, time.Second, 0, 300 * time.Millisecond},
		{10 * time.Millisecond, time.Second, 500 * time.Millisecond, 500 * time.Millisecond},
		{200 * time.Millisecond, time.Second, 0, 600 * time.Millisecond},
		{500 * time.Millisecond, time.Second, 0, time.Second},
	} {
		cfg := Config{Window: tc.meter, Tuning: tuning.Tunables{MinControlWindow: tc.tuned}}
		cfg.setDefaults()
		d := &Daemon{cfg: cfg, policy: &policy.Config{Period: tc.period}}
		if got := d.controlWindow(); got != tc.want {
			t.Errorf("period %v, meter window %v, tuned %v: control window %v, want %v", tc.period, tc.meter, tc.tuned, got, tc.want)
		}
	}
}
