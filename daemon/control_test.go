package daemon

import (
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/policy"
)

// The control window is one period, at least minControlWindow and at
// most the meter's window: the arbiter sees a workload's phase change
// within a period.
func TestControlWindowIsOnePeriod(t *testing.T) {
	for _, tc := range []struct{ period, meter, want time.Duration }{
		{100 * time.Millisecond, time.Second, 100 * time.Millisecond},
		{10 * time.Millisecond, time.Second, minControlWindow},
		{400 * time.Millisecond, time.Second, 400 * time.Millisecond},
		{5 * time.Second, time.Second, time.Second},
	} {
		d := &Daemon{cfg: Config{Window: tc.meter}, policy: &policy.Config{Period: tc.period}}
		if got := d.controlWindow(); got != tc.want {
			t.Errorf("period %v, meter window %v: control window %v, want %v", tc.period, tc.meter, got, tc.want)
		}
	}
}
