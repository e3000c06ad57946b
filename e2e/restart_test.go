package e2e

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/internal/testutil"
)

// Issue 58 item 2: a daemon restarted while tenants run (an upgrade, a
// DaemonSet roll, a crash) steers them again as soon as it answers, as
// exactly as before: it knows the channel groups of the processes that
// were running before it started, and which context each of their threads
// uses. Closed loops of 1 ms kernels (a sync every 4): tenant a of two
// processes and b of one at weights 100:300, the first daemon stopped
// (SIGINT) or killed (SIGKILL), steered and on the launch gate (the GPU's
// scheduler not steered); a of one process with a context per thread
// (4) beside b of one context at 100:100, steered; and the first case with
// deep queues, steered: 10 ms kernels synced every 200, 2 s of work a
// burst, so that neither launches for seconds after the restart and the
// new daemon knows their queues only from the one before (backlogs.json).
func TestRestartedDaemonSteersRunningTenants(t *testing.T) {
	for _, tc := range []struct {
		name          string
		killed        bool
		threads, deep bool
		args          []string
	}{
		{"stopped", false, false, false, nil},
		{"killed", true, false, false, nil},
		{"killed, launch gate", true, false, false, []string{"--gpu-scheduler", "off"}},
		{"context per thread", true, true, false, nil},
		{"killed, deep queues", true, false, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) { restartedDaemonHolds(t, tc.killed, tc.threads, tc.deep, tc.args...) })
	}
}

func restartedDaemonHolds(t *testing.T, killed, threads, deep bool, args ...string) {
	measureTwice(t, func(t *testing.T, miss missFunc) {
		gpu := testutil.StartFakeGPU(t)
		dir := t.TempDir()
		cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "restart-a"), "b": testutil.NewCgroup(t, "restart-b")}
		loop := []string{"loop", "--kernels-ms", "1", "--sync-every", "4", "--duration", "40"}
		if deep {
			loop = []string{"loop", "--kernels-ms", "10", "--sync-every", "200", "--duration", "40"}
		}
		runs := [][]string{loop, loop}
		weightB, want := "300", 0.25
		if threads {
			runs, weightB, want = [][]string{append(loop, "--threads", "4")}, "100", 0.5
		}
		pol := "tenants:\n  - {name: a, cgroup: " + cgs["a"].Rel + ", weight: 100}\n  - {name: b, cgroup: " + cgs["b"].Rel + ", weight: " + weightB + "}\n"
		if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(pol), 0o644); err != nil {
			t.Fatal(err)
		}
		first := startDaemonIn(t, gpu, dir, args...)
		for _, r := range runs {
			testutil.Start(t, cgs["a"], gpu.Workload(t, r...))
		}
		testutil.Start(t, cgs["b"], gpu.Workload(t, loop...))
		before := col(trueShares(t, gpu, cgs, 4*time.Second, 3), func(w map[string]float64) float64 { return w["a"] })
		if killed {
			first.Proc.Stop()
		} else {
			first.Proc.Interrupt(10 * time.Second)
		}
		second := startDaemonIn(t, gpu, dir, args...)
		start := time.Now()
		after := col(trueShares(t, gpu, cgs, time.Second, 4), func(w map[string]float64) float64 { return w["a"] })
		st, err := second.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("a for %.0f%%: %s before the restart, %s in the 4 s from 1 s after the new daemon answered (%v)",
			100*want, pcts(before), pcts(after), time.Since(start).Round(time.Second))
		actuator := "gpu scheduler"
		if len(args) > 0 {
			actuator = "launch gate"
		}
		for _, name := range []string{"a", "b"} {
			if row := tenantByName(st, name); row == nil || row.Actuator != actuator {
				logStatus(t, second)
				miss("tenant %s after the restart: %+v, want actuator %s", name, row, actuator)
			}
		}
		if m := median(after); math.Abs(m-want) > 0.03 || strings.Contains(pcts(after), "NaN") {
			miss("a's median after the restart %.1f%%, want %.0f ± 3", 100*m, 100*want)
		}
	})
}
