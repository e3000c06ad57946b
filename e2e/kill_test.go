package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/e2e/fakegpu"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

// killRuns is how many times each actuator mode's daemon is SIGKILLed at a
// random moment: a failure that shows in one kill of five passes twenty
// with probability 0.8^20, about 1%.
const killRuns = 20

// killAfterEnv, set to a duration (9s), makes each run of
// TestNothingStaysHeldAfterSIGKILL last that long before its kill and
// holds tenant a to its target over the seconds before it (issue 62's bar
// run); unset, a run lasts 1.5–3.5 s, long enough for the daemon to hold
// someone, and the test repeats kills rather than measures shares.
const killAfterEnv = "GPUARB_E2E_KILL_AFTER"

// Issue 62: once the daemon is gone nothing may stop or freeze a tenant,
// and whatever it held runs again at once. Tenant a (four processes) and
// b (one), closed loops of 1 ms kernels with a sync every 4 launches at
// weights 100:300, started after the daemon, which is SIGKILLed at a
// random moment, killRuns times in each actuator mode, each daemon started
// on the state the last one left (it resumes what that one held, then
// arbitrates): 1 s after each kill no process of either tenant is
// stopped, no cgroup frozen, no channel group paused or left with
// gpuarb's timeslice; the slowest release is logged.
func TestNothingStaysHeldAfterSIGKILL(t *testing.T) {
	for _, mode := range []struct {
		name string
		args []string
	}{{"launch gate", []string{"--gpu-scheduler", "off"}}, {"steered", nil}} {
		t.Run(mode.name, func(t *testing.T) { killAtRandom(t, mode.args...) })
	}
}

func killAtRandom(t *testing.T, daemonArgs ...string) {
	runFor, barRun := time.Duration(0), false
	if v := os.Getenv(killAfterEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 5*time.Second {
			t.Fatalf("%s=%q: want a duration of at least 5s", killAfterEnv, v)
		}
		runFor, barRun = d, true
	}
	gpu := testutil.StartFakeGPU(t)
	cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "a"), "b": testutil.NewCgroup(t, "b")}
	loop := func() []string {
		return []string{"loop", "--kernels-ms", "1", "--sync-every", "4", "--duration", "3600"}
	}
	dir := t.TempDir()
	pol := fmt.Sprintf("tenants:\n  - {name: a, cgroup: %s, weight: 100}\n  - {name: b, cgroup: %s, weight: 300}\n",
		cgs["a"].Rel, cgs["b"].Rel)
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	var slowest time.Duration
	heldAtKill, groupsAtKill := 0, 0
	var shares []float64
	for run := range killRuns {
		d := startDaemonIn(t, gpu, dir, daemonArgs...)
		// Started after the daemon, whose probes see their channel groups
		// (steered) or their launches (the gate) from the first.
		var procs []*testutil.Proc
		for range 4 {
			procs = append(procs, testutil.Start(t, cgs["a"], gpu.Workload(t, loop()...)))
		}
		procs = append(procs, testutil.Start(t, cgs["b"], gpu.Workload(t, loop()...)))
		wait := 1500*time.Millisecond + rand.N(2*time.Second)
		if barRun {
			wait = runFor
			windows := trueShares(t, gpu, cgs, wait-4*time.Second, 4)
			a := median(col(windows, func(w map[string]float64) float64 { return w["a"] / (w["a"] + w["b"]) }))
			shares = append(shares, a)
			if a < 0.22 || a > 0.28 {
				t.Errorf("run %d: a took %.1f%% of the GPU before the kill, want 25%% ± 3 pp", run+1, 100*a)
			}
		} else {
			time.Sleep(wait)
		}
		before := heldState(t, gpu, cgs)
		if err := d.Proc.Cmd.Process.Kill(); err != nil { // started by this test
			t.Fatal(err)
		}
		killed := time.Now()
		heldAtKill += len(before.stopped)
		groupsAtKill += before.paused + before.sliced
		for {
			st := heldState(t, gpu, cgs)
			if st.none() {
				break
			}
			if time.Since(killed) > time.Second {
				t.Fatalf("run %d (killed %v after the daemon answered): 1 s after SIGKILL %s", run+1, wait, st)
			}
			time.Sleep(time.Millisecond)
		}
		took := time.Since(killed)
		slowest = max(slowest, took)
		if err := d.Proc.Wait(t, 5*time.Second); err == nil {
			t.Fatalf("run %d: the daemon exited cleanly after SIGKILL", run+1)
		}
		t.Logf("run %d: killed %v after the daemon answered, %d processes stopped, %d channel groups paused and %d steered then; all running as before %v after",
			run+1, wait.Round(time.Millisecond), len(before.stopped), before.paused, before.sliced, took.Round(time.Microsecond))
		for _, p := range procs {
			p.Stop()
		}
	}
	t.Logf("%d kills: slowest release %v; %d processes stopped and %d channel groups paused or steered at the kills; a's share before the kills %s",
		killRuns, slowest, heldAtKill, groupsAtKill, pcts(shares))
	if heldAtKill+groupsAtKill == 0 {
		t.Errorf("nothing was held at any of the %d kills: the test did not test a release", killRuns)
	}
}

// held is what holds a tenant back at one instant: its processes stopped,
// its cgroups frozen, its channel groups paused (taken off the runlist) or
// given another timeslice than the GPU's own (simulatedSlice).
type held struct {
	stopped []int
	frozen  []string
	paused  int
	sliced  int
}

// simulatedSlice is the simulated GPU's timeslice, what a channel group
// has until gpuarb steers it (fakegpud serve's default).
const simulatedSlice = 1024

func (h held) none() bool {
	return len(h.stopped) == 0 && len(h.frozen) == 0 && h.paused == 0 && h.sliced == 0
}

func (h held) String() string {
	return fmt.Sprintf("stopped processes %v, frozen cgroups %v, paused channel groups %d, channel groups with gpuarb's timeslices %d",
		h.stopped, h.frozen, h.paused, h.sliced)
}

// heldState reads what holds the tenants of cgs back now.
func heldState(t *testing.T, gpu *testutil.FakeGPU, cgs map[string]*testutil.Cgroup) held {
	t.Helper()
	var h held
	for name, cg := range cgs {
		data, err := os.ReadFile(filepath.Join(cg.Path, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			if cgroup.Stopped(pid) {
				h.stopped = append(h.stopped, pid)
			}
		}
		if frozen, err := cgroup.V2Frozen(cg.Path); err != nil || frozen {
			h.frozen = append(h.frozen, fmt.Sprintf("%s (%v)", name, err))
		}
	}
	st, err := fakegpu.ReadStats(gpu.Socket, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.GPUs {
		for _, c := range g.Contexts {
			if c.Alive && c.Disabled > 0 {
				h.paused++
			}
			if c.Alive && c.TimesliceUS != simulatedSlice {
				h.sliced++
			}
		}
	}
	return h
}
