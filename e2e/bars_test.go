package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// missFunc reports a bar a measured run missed, in t.Errorf's form.
type missFunc func(format string, args ...any)

// measureTwice runs a measured scenario as the subtest "run 1" and
// asserts its bars. The scenario reports each bar it misses with miss;
// everything else it checks (setup, status, what is left behind) fails it
// at once, as usual. A run that misses a bar runs once more, from
// scratch, as "run 2", and that run's misses fail it, and the test: its
// log (the daemon's status where the scenario logs it before a miss)
// prints with them, as a passing run's does not without -v.
//
// Every bar is a median of a few 1 s windows of the simulator's truth,
// taken on a 2-vCPU VM whose host stalls for tens of milliseconds at
// times, with the daemon, the simulator and the tenants sharing those
// CPUs. CI runs have missed single bars that way — the unsteered tenant
// beside steered ones at 28.7% for 25 ± 3, the non-preemptive pair 9.6%
// unfair, the lone hog's limit at 31.9% for 31 — each passing every run
// made right after it (4 of 4, 18 of 18, 3 of 3). A regression misses
// twice; a stall, rarely.
func measureTwice(t *testing.T, scenario func(t *testing.T, miss missFunc)) {
	t.Helper()
	var missed []string
	t.Run("run 1", func(t *testing.T) {
		scenario(t, func(format string, args ...any) { missed = append(missed, fmt.Sprintf(format, args...)) })
	})
	if t.Failed() || len(missed) == 0 {
		return
	}
	t.Logf("run 1 missed: %s; once more", strings.Join(missed, "; "))
	t.Run("run 2", func(t *testing.T) { scenario(t, t.Errorf) })
}

// actuatorModes are the daemon's arguments for each actuator mode: the
// GPU's own scheduler steered, and the launch gate and freezes that hold
// a tenant where steering is refused.
var actuatorModes = []struct {
	name string
	args []string
}{{"steered", nil}, {"launch gate", []string{"--gpu-scheduler", "off"}}}

// inEachMode runs a measured scenario as a subtest per actuator mode
// (measureTwice), handing it the daemon's arguments for the mode.
func inEachMode(t *testing.T, scenario func(t *testing.T, miss missFunc, daemonArgs []string)) {
	t.Helper()
	for _, mode := range actuatorModes {
		t.Run(mode.name, func(t *testing.T) {
			measureTwice(t, func(t *testing.T, miss missFunc) { scenario(t, miss, mode.args) })
		})
	}
}
