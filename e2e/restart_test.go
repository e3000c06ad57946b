package e2e

import (
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
// were running before it started. Closed loops of 1 ms kernels (a sync
// every 4), tenant a of two processes and b of one at weights 100:300; the
// first daemon stopped (SIGINT) or killed (SIGKILL); steered, and on the
// launch gate (the GPU's scheduler not steered).
func TestRestartedDaemonSteersRunningTenants(t *testing.T) {
	for _, tc := range []struct {
		name   string
		killed bool
		args   []string
	}{
		{"stopped", false, nil},
		{"killed", true, nil},
		{"killed, launch gate", true, []string{"--gpu-scheduler", "off"}},
	} {
		t.Run(tc.name, func(t *testing.T) { restartedDaemonHolds(t, tc.killed, tc.args...) })
	}
}

func restartedDaemonHolds(t *testing.T, killed bool, args ...string) {
	measureTwice(t, func(t *testing.T, miss missFunc) {
		gpu := testutil.StartFakeGPU(t)
		dir := t.TempDir()
		cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "restart-a"), "b": testutil.NewCgroup(t, "restart-b")}
		pol := "tenants:\n  - {name: a, cgroup: " + cgs["a"].Rel + ", weight: 100}\n  - {name: b, cgroup: " + cgs["b"].Rel + ", weight: 300}\n"
		if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(pol), 0o644); err != nil {
			t.Fatal(err)
		}
		loop := []string{"loop", "--kernels-ms", "1", "--sync-every", "4", "--duration", "40"}
		first := startDaemonIn(t, gpu, dir, args...)
		for _, name := range []string{"a", "a", "b"} {
			testutil.Start(t, cgs[name], gpu.Workload(t, loop...))
		}
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
		t.Logf("a (2 processes) for 25%%: %s before the restart, %s in the 4 s from 1 s after the new daemon answered (%v)",
			pcts(before), pcts(after), time.Since(start).Round(time.Second))
		want := "gpu scheduler"
		if len(args) > 0 {
			want = "launch gate"
		}
		for _, name := range []string{"a", "b"} {
			if row := tenantByName(st, name); row == nil || row.Actuator != want {
				logStatus(t, second)
				miss("tenant %s after the restart: %+v, want actuator %s", name, row, want)
			}
		}
		if m := median(after); m < 0.22 || m > 0.28 || strings.Contains(pcts(after), "NaN") {
			miss("a's median after the restart %.1f%%, want 25 ± 3", 100*m)
		}
	})
}
