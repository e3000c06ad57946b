package daemon

import (
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
