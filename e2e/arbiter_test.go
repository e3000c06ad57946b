package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/arbiter"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/e2e/fakegpu"
	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/policy"
)

// trueShares reads n windows of 1 s of the simulator's ground truth, per
// test cgroup (its descendants included), after settle, on GPU 0.
func trueShares(t *testing.T, gpu *testutil.FakeGPU, cgs map[string]*testutil.Cgroup, settle time.Duration, n int) []map[string]float64 {
	t.Helper()
	return trueSharesOn(t, gpu, 0, cgs, settle, n)
}

// windowsWithEstimates is trueShares over n windows with, at each
// window's end, how far the daemon's estimate of each tenant of cgs
// (matched by cgroup) is off the window's truth.
func windowsWithEstimates(t *testing.T, gpu *testutil.FakeGPU, d runningDaemon, cgs map[string]*testutil.Cgroup, n int) (ws []map[string]float64, errs []float64) {
	t.Helper()
	for i := 0; i < n; i++ {
		w := trueShares(t, gpu, cgs, 0, 1)[0]
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
		for name, cg := range cgs {
			for _, tn := range st.Tenants {
				if tn.Cgroup == cg.Rel {
					errs = append(errs, math.Abs(tn.Share-w[name]))
				}
			}
		}
	}
	return ws, errs
}

// trueSharesOn is trueShares on GPU index.
func trueSharesOn(t *testing.T, gpu *testutil.FakeGPU, index int, cgs map[string]*testutil.Cgroup, settle time.Duration, n int) []map[string]float64 {
	t.Helper()
	time.Sleep(settle)
	if _, err := fakegpu.ReadStats(gpu.Socket, true); err != nil {
		t.Fatal(err)
	}
	var out []map[string]float64
	for i := 0; i < n; i++ {
		time.Sleep(time.Second)
		st, err := fakegpu.ReadStats(gpu.Socket, true)
		if err != nil {
			t.Fatal(err)
		}
		w := map[string]float64{}
		for name, cg := range cgs {
			for _, c := range st.GPUs[index].Contexts {
				if c.Cgroup == cg.Rel || strings.HasPrefix(c.Cgroup, cg.Rel+"/") {
					w[name] += float64(c.BusyNS) / float64(st.ElapsedNS)
				}
			}
		}
		w["busy"] = float64(st.GPUs[index].BusyNS) / float64(st.ElapsedNS)
		out = append(out, w)
	}
	return out
}

func col(ws []map[string]float64, f func(map[string]float64) float64) []float64 {
	var xs []float64
	for _, w := range ws {
		xs = append(xs, f(w))
	}
	return xs
}

func unfairness(w map[string]float64) float64 {
	return math.Abs(w["a"]-w["b"]) / (w["a"] + w["b"])
}

func writePolicy(t *testing.T, cfg string) string {
	t.Helper()
	if _, err := policy.Parse([]byte(cfg)); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Bar 1: tenant a runs 4 GPU processes, b one; equal weights. Held in
// each actuator mode, and metered there: each tenant's estimate within 3
// pp of the truth (median of the windows).
func TestArbiterUnequalProcesses(t *testing.T) {
	inEachMode(t, func(t *testing.T, miss missFunc, daemonArgs []string) {
		gpu := testutil.StartFakeGPU(t)
		d := startDaemon(t, gpu, daemonArgs...)
		cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "four"), "b": testutil.NewCgroup(t, "one")}
		for i := 0; i < 4; i++ {
			testutil.Start(t, cgs["a"], gpu.Workload(t, "hog", "--duration", "20"))
		}
		testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--duration", "20"))
		time.Sleep(4 * time.Second)
		ws, errs := windowsWithEstimates(t, gpu, d, cgs, 6)
		logStatus(t, d)
		requireThrottled(t, d, cgs["a"].Rel)
		requireFair(t, miss, ws, "a", "b", "(unarbitrated: 80/20, 60%)")
		t.Logf("estimates off the truth by %s pp", pcts(errs))
		if m := median(errs); m > 0.03 {
			miss("estimate off the truth by %.1f pp (median), want ≤ 3", 100*m)
		}
	})
}

// requireThrottled asserts that the daemon holds the tenant of cgroup rel
// back towards a target: on the GPU's own scheduler a timeslice shorter
// than the driver's default or a run fraction below 1; at the launch gate
// or by freezing a rate below 1 with held or frozen time accumulated.
func requireThrottled(t *testing.T, d runningDaemon, rel string) {
	t.Helper()
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range st.Tenants {
		if tn.Cgroup != rel {
			continue
		}
		steered := tn.Actuator == "gpu scheduler" && tn.TimesliceUS > 0 &&
			(tn.TimesliceUS < arbiter.BaseSlice.Microseconds() || tn.Duty < 1 && tn.ThrottledNS > 0)
		paced := tn.Actuator != "gpu scheduler" && tn.Duty < 1 && tn.ThrottledNS > 0 &&
			strings.Contains(" throttled frozen held paced ", " "+tn.State+" ")
		// The reason may read on or below target at this instant: a
		// paced tenant's share dips between batches.
		if !(steered || paced) || !strings.Contains(" above target on target below target ", " "+tn.Reason+" ") &&
			!strings.HasPrefix(tn.Reason, "above target") {
			t.Errorf("tenant %s not held back: %+v", tn.Name, tn)
		}
		return
	}
	t.Errorf("no tenant for %s in %+v", rel, st.Tenants)
}

// Bar 3: weights 1:3 and 1:9.
func TestArbiterWeights(t *testing.T) {
	for _, wb := range []int{3, 9} {
		t.Run("1:"+strconv.Itoa(wb), func(t *testing.T) {
			measureTwice(t, func(t *testing.T, miss missFunc) {
				gpu := testutil.StartFakeGPU(t)
				cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "w1"), "b": testutil.NewCgroup(t, "w"+strconv.Itoa(wb))}
				pol := writePolicy(t, "tenants:\n  - {name: a, cgroup: "+cgs["a"].Rel+", weight: 100}\n  - {name: b, cgroup: "+cgs["b"].Rel+", weight: "+strconv.Itoa(100*wb)+"}\n")
				d := startDaemon(t, gpu)
				data, _ := os.ReadFile(pol)
				if err := d.ApplyPolicy(t.Context(), data); err != nil {
					t.Fatal(err)
				}
				testutil.Start(t, cgs["a"], gpu.Workload(t, "hog", "--duration", "20"))
				testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--duration", "20"))
				ws := trueShares(t, gpu, cgs, 4*time.Second, 6)
				want := 1 / float64(1+wb)
				a := col(ws, func(w map[string]float64) float64 { return w["a"] })
				b := col(ws, func(w map[string]float64) float64 { return w["b"] })
				t.Logf("target %.1f%%/%.1f%%, true a %s b %s (unarbitrated 50/50)", 100*want, 100*(1-want), pcts(a), pcts(b))
				logStatus(t, d)
				if e := math.Abs(median(a) - want); e > 0.02 {
					miss("tenant a median %.1f%%, want %.1f ± 2 pp", 100*median(a), 100*want)
				}
				requireThrottled(t, d, cgs["a"].Rel)
			})
		})
	}
}

// Issue 16: a tenant whose process set up its GPU before the daemon
// started (its channel groups never seen) is paced at the launch gate
// while the others stay on the GPU's own scheduler — the GPU does not fall
// back as a whole. Weights 1:1:2 hold within ±3 pp (unarbitrated, a third
// each).
func TestArbiterUnsteeredTenantBesideSteered(t *testing.T) {
	measureTwice(t, unsteeredBesideSteered)
}

func unsteeredBesideSteered(t *testing.T, miss missFunc) {
	gpu := testutil.StartFakeGPU(t)
	cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "early"), "b": testutil.NewCgroup(t, "late1"), "c": testutil.NewCgroup(t, "late2")}
	testutil.Start(t, cgs["a"], gpu.Workload(t, "hog", "--duration", "25"))
	time.Sleep(500 * time.Millisecond) // its channel groups are set up before the daemon starts
	d := startDaemon(t, gpu)
	testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--duration", "25"))
	testutil.Start(t, cgs["c"], gpu.Workload(t, "hog", "--duration", "25"))
	requireOnePacedBesideSteered(t, miss, gpu, d, cgs)
}

// A process whose controls the driver refuses (its RM client is bound to
// a file it has since replaced: GPUWORK_REOPEN_CTL) is that process's
// trouble: its tenant is paced at the launch gate and the others stay
// steered. One such light process among 998 had turned steering off for
// the whole GPU (the hogs beside them got 19.2% and 49.5% for 36.5 each).
func TestRefusedProcessIsPacedBesideSteered(t *testing.T) {
	measureTwice(t, refusedBesideSteered)
}

func refusedBesideSteered(t *testing.T, miss missFunc) {
	gpu := testutil.StartFakeGPU(t)
	cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "refused"), "b": testutil.NewCgroup(t, "steered1"),
		"c": testutil.NewCgroup(t, "steered2")}
	d := startDaemon(t, gpu)
	refused := gpu.Workload(t, "hog", "--duration", "25")
	refused.Env = append(refused.Env, "GPUWORK_REOPEN_CTL=1")
	testutil.Start(t, cgs["a"], refused)
	testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--duration", "25"))
	testutil.Start(t, cgs["c"], gpu.Workload(t, "hog", "--duration", "25"))
	requireOnePacedBesideSteered(t, miss, gpu, d, cgs)
}

// requireOnePacedBesideSteered gives tenants a, b and c (each a hog) the
// weights 100, 100 and 200 and reports a miss where a true share is not
// within ±3 pp of 25, 25 and 50%; it fails unless the GPU is on its own
// scheduler with a alone paced at the launch gate.
func requireOnePacedBesideSteered(t *testing.T, miss missFunc, gpu *testutil.FakeGPU, d runningDaemon,
	cgs map[string]*testutil.Cgroup) {
	t.Helper()
	pol := "tenants:\n  - {name: a, cgroup: " + cgs["a"].Rel + ", weight: 100}\n  - {name: b, cgroup: " + cgs["b"].Rel +
		", weight: 100}\n  - {name: c, cgroup: " + cgs["c"].Rel + ", weight: 200}\n"
	if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
		t.Fatal(err)
	}
	ws := trueShares(t, gpu, cgs, 4*time.Second, 4)
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	logStatus(t, d)
	for name, want := range map[string]float64{"a": 0.25, "b": 0.25, "c": 0.5} {
		got := col(ws, func(w map[string]float64) float64 { return w[name] })
		t.Logf("%s: %s for %.0f%%", name, pcts(got), 100*want)
		if e := math.Abs(median(got) - want); e > 0.03 {
			miss("tenant %s median %.1f%%, want %.0f ± 3 pp", name, 100*median(got), 100*want)
		}
	}
	if len(st.GPUs) != 1 || st.GPUs[0].Actuator != "gpu scheduler" {
		t.Errorf("GPUs %+v, want GPU 0 on its own scheduler", st.GPUs)
	}
	for _, r := range st.Tenants {
		want := "gpu scheduler"
		if r.Name == "a" {
			want = "launch gate (channel groups unknown or refused)"
		}
		if r.Actuator != want || r.Name != "a" && r.TimesliceUS == 0 {
			t.Errorf("tenant %s: actuator %q, timeslice %d µs; want %q", r.Name, r.Actuator, r.TimesliceUS, want)
		}
	}
}

// gpuarb thaw --all while a tenant's channel groups are paused (a 10%
// limit keeps them off the GPU most of each period): the groups run again
// and the meter knows it — its estimate follows the truth while
// enforcement is paused (it kept the group paused in its replay, and read
// the tenant at 0-2% while it took half the GPU).
func TestThawResumesTheMetersPausedGroups(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	cgs := limitedBesideFree(t, gpu, d, "0.1")
	trueShares(t, gpu, cgs, 3*time.Second, 1) // paused most of each period by now
	if err := d.ThawAll(t.Context()); err != nil {
		t.Fatal(err)
	}
	var errs, truth []float64
	for _, w := range trueShares(t, gpu, cgs, 2*time.Second, 3) {
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, tn := range st.Tenants {
			if tn.Cgroup == cgs["a"].Rel {
				errs = append(errs, math.Abs(tn.Share-w["a"]))
			}
		}
		truth = append(truth, w["a"])
	}
	t.Logf("after thaw --all: a's true share %s, estimate off by %s", pcts(truth), pcts(errs))
	if m := median(truth); m < 0.4 {
		t.Errorf("a's median %.1f%% after thaw --all, want about 50%% (its groups still paused?)", 100*m)
	}
	if m := median(errs); len(errs) == 0 || m > 0.03 {
		t.Errorf("estimate off by a median %.1f pp after thaw --all, want ≤ 3", 100*m)
	}
}

// limitedBesideFree starts two 20 s hogs, tenant a limited to limit by the
// policy and b free, and returns their cgroups.
func limitedBesideFree(t *testing.T, gpu *testutil.FakeGPU, d runningDaemon, limit string) map[string]*testutil.Cgroup {
	t.Helper()
	cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "limited"), "b": testutil.NewCgroup(t, "free")}
	testutil.Start(t, cgs["a"], gpu.Workload(t, "hog", "--duration", "20"))
	testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--duration", "20"))
	pol := "tenants:\n  - {name: a, cgroup: " + cgs["a"].Rel + ", limit: " + limit + "}\n"
	if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
		t.Fatal(err)
	}
	return cgs
}

// thaw --all leaves nothing steered, however it falls against the control
// steps: every group is back at its own timeslice and on the runlist, and
// stays so while enforcement is paused. As in the demo, the processes
// start as their tenants register, then everything is thawed: a step that
// had begun before the thaw steered again after it with what it read at
// its start, and those groups were never put back (the demo's baseline ran
// at the arbitrated timeslices in 2 of 6 runs; this test did not catch
// that race in three runs of the old code, it guards the thaw's outcome).
func TestThawAllLeavesNothingSteered(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	cgs := map[string]*testutil.Cgroup{"infer": testutil.NewCgroup(t, "thaw-infer"),
		"a": testutil.NewCgroup(t, "thaw-a"), "b": testutil.NewCgroup(t, "thaw-b")}
	pol := []byte("tenants:\n" +
		"  - {name: infer, cgroup: " + cgs["infer"].Rel + ", priority: latency, slo: {p99_sync_ms: 8}}\n" +
		"  - {name: a, cgroup: " + cgs["a"].Rel + ", weight: 100}\n" +
		"  - {name: b, cgroup: " + cgs["b"].Rel + ", weight: 300}\n")
	// steered lists the live groups whose timeslice differs from the
	// simulated GPU's default, or with channels off the runlist.
	steered := func() (changed []string, live int) {
		st, err := fakegpu.ReadStats(gpu.Socket, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range st.GPUs {
			for _, x := range g.Contexts {
				if !x.Alive {
					continue
				}
				live++
				if x.TimesliceUS != uint64(arbiter.BaseSlice.Microseconds()) || x.Disabled > 0 {
					changed = append(changed, fmt.Sprintf("%s: %d µs, %d channel(s) off", filepath.Base(x.Cgroup), x.TimesliceUS, x.Disabled))
				}
			}
		}
		return changed, live
	}
	const rounds = 6
	left, everSteered := 0, false
	for i := range rounds {
		var procs []*testutil.Proc
		// Several processes a tenant: a step's first steering of their
		// groups (each read, then recorded) is long.
		for name, args := range map[string][]string{"infer": {"infer", "--rate", "200"}, "a": {"hog"}, "b": {"hog"}} {
			for range 2 {
				procs = append(procs, testutil.Start(t, cgs[name], gpu.Workload(t, append(args, "--duration", "1.5")...)))
			}
		}
		// The registrations as the processes set up, a step apart each
		// round, then three periods of enforcement and the thaw.
		time.Sleep(time.Duration(i) * 15 * time.Millisecond)
		for range 3 {
			if err := d.ApplyPolicy(t.Context(), pol); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(300 * time.Millisecond)
		c, live := steered()
		everSteered = everSteered || len(c) > 0
		if err := d.ThawAll(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // three periods with enforcement paused
		if c, _ := steered(); len(c) > 0 {
			left++
			t.Errorf("round %d (%d groups): after thaw --all, still steered: %s", i, live, strings.Join(c, "; "))
		}
		for _, p := range procs {
			_ = p.Wait(t, 5*time.Second)
		}
	}
	if !everSteered {
		t.Fatal("the policy steered nothing: the test cannot tell a thaw from no steering")
	}
	t.Logf("%d of %d thaws left groups steered", left, rounds)
}

// A container that starts or stops (its tenant attached, then detached)
// leaves the other tenants as they run: a limited tenant stays held to its
// limit while others come and go every 200 ms. (Every attach and detach
// had put every tenant back — gates ended, groups resumed — until the next
// step held them again.)
func TestAttachesLeaveTheOthersHeld(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	cgs := limitedBesideFree(t, gpu, d, "0.2")
	comer := testutil.NewCgroup(t, "comer")
	ctx, stop := context.WithCancel(t.Context())
	churned := make(chan int)
	go func() {
		n := 0
		defer func() { churned <- n }()
		for ctx.Err() == nil {
			if _, err := d.Attach(ctx, "container comer", fmt.Appendf(nil, `{"name": "comer", "cgroup": %q, "weight": 300}`, comer.Rel)); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
			if err := d.Detach(ctx, "container comer", "comer"); err != nil {
				return
			}
			n++
			time.Sleep(100 * time.Millisecond)
		}
	}()
	ws := trueShares(t, gpu, cgs, 3*time.Second, 5)
	stop()
	n := <-churned
	a := col(ws, func(w map[string]float64) float64 { return w["a"] })
	t.Logf("a (limit 20%%) while another tenant attached and detached %d times: %s", n, pcts(a))
	if n < 10 {
		t.Fatalf("only %d attach-detach rounds", n)
	}
	if m := median(a); m > 0.21 {
		t.Errorf("limited tenant's median %.1f%% while others came and went, want ≤ 21%%", 100*m)
	}
}

// Bars 4 and 8: a lone hog with a 30% limit stays at or below 31%; without
// a limit it gets at least 95%.
func TestArbiterLimitAndWorkConservation(t *testing.T) {
	measureTwice(t, func(t *testing.T, miss missFunc) {
		alone, capped := limitedLoneHog(t)
		if m := median(alone); m < 0.95 {
			miss("lone tenant got %.1f%%, want ≥ 95%%", 100*m)
		}
		if m := median(capped); m > 0.31 {
			miss("limited tenant median %.1f%%, want ≤ 31%%", 100*m)
		}
		if median(capped) > median(alone)-0.1 {
			miss("the limit did not lower the share: %.1f%% -> %.1f%%", 100*median(alone), 100*median(capped))
		}
	})
}

// limitedLoneHog measures a lone hog's true share per window, alone and
// then attached with a 30% limit, and checks how status shows it.
func limitedLoneHog(t *testing.T) (alone, capped []float64) {
	gpu := testutil.StartFakeGPU(t)
	cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "lone")}
	d := startDaemon(t, gpu)
	testutil.Start(t, cgs["a"], gpu.Workload(t, "hog", "--duration", "30"))
	ws := trueShares(t, gpu, cgs, 2*time.Second, 3)
	alone = col(ws, func(w map[string]float64) float64 { return w["a"] })
	t.Logf("alone, no limit: %s", pcts(alone))
	out, err := exec.Command(testutil.Bin(t, "gpuarb"), "attach", "--socket", d.Socket, "--cgroup", cgs["a"].Path,
		"--name", "capped", "--limit", "30%").CombinedOutput()
	if err != nil {
		t.Fatalf("attach: %v %s", err, out)
	}
	ws = trueShares(t, gpu, cgs, 4*time.Second, 5)
	capped = col(ws, func(w map[string]float64) float64 { return w["a"] })
	t.Logf("limit 30%%: %s", pcts(capped))
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, tn := range st.Tenants {
		if tn.Name == "capped" {
			found = true
			if tn.Limit != 0.3 || tn.TargetShare != 0.3 || tn.Duty >= 1 || tn.ThrottledNS == 0 ||
				!strings.Contains(" throttled frozen held paced paused steered ", " "+tn.State+" ") {
				t.Errorf("status of the capped tenant: %+v", tn)
			}
		}
	}
	if !found {
		t.Errorf("no tenant 'capped' in %+v", st.Tenants)
	}
	return alone, capped
}

// Bar 9: SIGKILL the daemon while it throttles a cgroup tenant and a bare
// pid tenant: both run again within 1 s, and a restarted daemon finds an
// empty ledger. At the launch gate both are held at their launches
// (SIGSTOP); the guardian continues them from the pinned held table.
func TestArbiterGuardianThawsAfterSIGKILL(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu, "--gpu-scheduler", "off")
	cg, inCgroup, pid := holdTwoTenants(t, gpu, d)
	ledger, err := cgroup.ReadLedger(daemonLedger(d.Socket))
	if err != nil || len(ledger) != 2 {
		t.Fatalf("ledger %v %v", ledger, err)
	}
	// The guardian the daemon started is killed first (issue 18 item 8):
	// the daemon starts another, status says so, and that one resumes
	// the tenants below.
	guardianRestarted(t, d)
	if err := d.Proc.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	t.Logf("killed at %d", killed.UnixMicro())
	for cgroup.Stopped(inCgroup) || cgroup.Stopped(pid) {
		if time.Since(killed) > time.Second {
			t.Fatalf("still stopped 1 s after SIGKILL: cgroup tenant %v, pid tenant %v", cgroup.Stopped(inCgroup), cgroup.Stopped(pid))
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("running again %v after SIGKILL", time.Since(killed))
	// They stay running.
	time.Sleep(300 * time.Millisecond)
	if cgroup.Stopped(inCgroup) || cgroup.Stopped(pid) {
		t.Error("stopped again after the guardian released them")
	}
	if f, _ := cgroup.V2Frozen(cg.Path); f {
		t.Error("cgroup frozen after the guardian ran")
	}
	// gpuarb thaw --all without a daemon reads the ledger and the pins.
	out, err := exec.Command(testutil.Bin(t, "gpuarb"), "thaw", "--all", "--socket", d.Socket, "--pin-path", d.PinPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "no daemon") {
		t.Errorf("thaw --all: %v %s", err, out)
	}
}

// holdTwoTenants starts a hog in a cgroup tenant and a bare hog as a pid
// tenant, both limited to 10% at the launch gate, and returns once both
// are held (stopped) at the same instant.
func holdTwoTenants(t *testing.T, gpu *testutil.FakeGPU, d runningDaemon) (cg *testutil.Cgroup, inCgroup, pid int) {
	t.Helper()
	cg = testutil.NewCgroup(t, "guarded")
	inCgroup = testutil.Start(t, cg, gpu.Workload(t, "hog", "--duration", "30")).Cmd.Process.Pid
	pid = testutil.Start(t, nil, gpu.Workload(t, "hog", "--duration", "30")).Cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	pol := "tenants:\n  - {name: c, cgroup: " + cg.Rel + ", limit: 0.1}\n  - {name: p, pid: " + strconv.Itoa(pid) + ", limit: 0.1}\n"
	if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
		t.Fatal(err)
	}
	// The rate is 10%: they are held most of the time.
	deadline := time.Now().Add(10 * time.Second)
	for !(cgroup.Stopped(inCgroup) && cgroup.Stopped(pid)) {
		if time.Now().After(deadline) {
			t.Fatalf("never both held: cgroup tenant stopped %v, pid tenant stopped %v", cgroup.Stopped(inCgroup), cgroup.Stopped(pid))
		}
		time.Sleep(time.Millisecond)
	}
	return cg, inCgroup, pid
}

// Issue 18's bar, the worst case: the daemon and its guardian both
// SIGKILLed while a cgroup tenant and a bare pid tenant are held. Nothing
// is left running to release them; `gpuarb thaw --all` (the systemd unit's
// ExecStopPost; a restarted daemon does the same at its start) reads the
// ledger and the pinned held table, and both run within a second of it.
func TestThawAllAfterDaemonAndGuardianKilled(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu, "--gpu-scheduler", "off")
	cg, inCgroup, pid := holdTwoTenants(t, gpu, d)
	st, err := d.Status(t.Context())
	if err != nil || st.Guardian == nil || st.Guardian.PID == 0 {
		t.Fatalf("guardian: %+v, %v", st.Guardian, err)
	}
	daemon := d.Proc.Cmd.Process.Pid
	// Stopped (by this test, which started it), the daemon neither
	// releases them nor starts another guardian; catch it with both held.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err := syscall.Kill(daemon, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if cgroup.Stopped(inCgroup) && cgroup.Stopped(pid) {
			break
		}
		if err := syscall.Kill(daemon, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("never caught both held with the daemon stopped")
		}
		time.Sleep(time.Duration(rand.IntN(50)) * time.Millisecond)
	}
	for _, p := range []int{st.Guardian.PID, daemon} { // the guardian first: it would release them
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); !cgroup.Gone(st.Guardian.PID) || !d.Proc.Done(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("daemon or guardian not gone 5 s after SIGKILL")
		}
	}
	time.Sleep(300 * time.Millisecond)
	if !cgroup.Stopped(inCgroup) || !cgroup.Stopped(pid) {
		t.Fatalf("released with no daemon and no guardian: cgroup tenant stopped %v, pid tenant stopped %v", cgroup.Stopped(inCgroup), cgroup.Stopped(pid))
	}
	thawed := time.Now()
	out, err := exec.Command(testutil.Bin(t, "gpuarb"), "thaw", "--all", "--socket", d.Socket, "--pin-path", d.PinPath).CombinedOutput()
	if err != nil {
		t.Fatalf("thaw --all: %v %s", err, out)
	}
	for cgroup.Stopped(inCgroup) || cgroup.Stopped(pid) {
		if time.Since(thawed) > time.Second {
			t.Fatalf("still stopped 1 s after thaw --all: cgroup tenant %v, pid tenant %v; it said %s", cgroup.Stopped(inCgroup), cgroup.Stopped(pid), out)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("both running %v after thaw --all: %s", time.Since(thawed), strings.TrimSpace(string(out)))
	if f, _ := cgroup.V2Frozen(cg.Path); f {
		t.Error("cgroup frozen after thaw --all")
	}
}

// Issue 18, item 8: the guardian runs apart from the daemon's cgroup, so
// that killing that whole cgroup (cgroup.kill, as systemd's
// KillMode=control-group or a container's end does) leaves it to resume
// the held tenants: both run within a second. In the daemon's cgroup, the
// guardian died with it and they stayed stopped.
func TestGuardianOutlivesTheDaemonsCgroup(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	guardianCg := testutil.NewCgroup(t, "guardian")
	daemonCg := testutil.NewCgroup(t, "daemon")
	d := startDaemonWith(t, gpu, t.TempDir(), daemonCg, "--gpu-scheduler", "off", "--guardian-cgroup", guardianCg.Rel)
	_, inCgroup, pid := holdTwoTenants(t, gpu, d)
	st, err := d.Status(t.Context())
	if err != nil || st.Guardian == nil || st.Guardian.PID == 0 {
		t.Fatalf("guardian: %+v, %v", st.Guardian, err)
	}
	procCg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", st.Guardian.PID))
	if err != nil || st.Guardian.Cgroup != guardianCg.Path || !strings.Contains(string(procCg), "::"+guardianCg.Rel+"\n") {
		t.Fatalf("guardian %d in %q (status says %q), want %s: %v", st.Guardian.PID, procCg, st.Guardian.Cgroup, guardianCg.Rel, err)
	}
	if err := os.WriteFile(filepath.Join(daemonCg.Path, "cgroup.kill"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for cgroup.Stopped(inCgroup) || cgroup.Stopped(pid) {
		if time.Since(killed) > time.Second {
			t.Fatalf("still stopped 1 s after the daemon's cgroup was killed: cgroup tenant %v, pid tenant %v", cgroup.Stopped(inCgroup), cgroup.Stopped(pid))
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("running again %v after the daemon's cgroup was killed", time.Since(killed))
}

// guardianRestarted kills the daemon's thaw guardian and waits until the
// daemon has started another, as status shows.
func guardianRestarted(t *testing.T, d runningDaemon) {
	t.Helper()
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Guardian == nil || st.Guardian.PID == 0 || st.Guardian.Restarts != 0 {
		t.Fatalf("guardian before: %+v", st.Guardian)
	}
	first := st.Guardian.PID
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil { // started by this test's daemon
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err = d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if g := st.Guardian; g != nil && g.PID != 0 && g.PID != first && g.Restarts == 1 && !cgroup.Gone(g.PID) {
			t.Logf("guardian %d killed, %d started", first, g.PID)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("guardian not restarted 5 s after it was killed: %+v", st.Guardian)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Bar 9 on the GPU's own scheduler: SIGKILL the daemon while it keeps a
// cgroup tenant's channel group paused and its and a pid tenant's
// timeslices set: the guardian resumes every group and puts
// its timeslice back within 1 s, from the steering ledger.
func TestArbiterGuardianResumesPausedGroups(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	cg := testutil.NewCgroup(t, "paused")
	d := startDaemon(t, gpu)
	inCgroup := testutil.Start(t, cg, gpu.Workload(t, "hog", "--duration", "30")).Cmd.Process.Pid
	pid := testutil.Start(t, nil, gpu.Workload(t, "hog", "--duration", "30")).Cmd.Process.Pid
	// Targets 10% and 30%: timeslices 1:3, and both paused to their limits.
	pol := "tenants:\n  - {name: c, cgroup: " + cg.Rel + ", limit: 0.1}\n  - {name: p, pid: " + strconv.Itoa(pid) + ", weight: 300, limit: 0.3}\n"
	if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
		t.Fatal(err)
	}
	contexts := func() map[int]fakegpu.ContextStats {
		st, err := fakegpu.ReadStats(gpu.Socket, false)
		if err != nil {
			t.Fatal(err)
		}
		out := map[int]fakegpu.ContextStats{}
		for _, c := range st.GPUs[0].Contexts {
			if c.Alive {
				out[c.PID] = c
			}
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		cs := contexts()
		if cs[inCgroup].Disabled > 0 && cs[inCgroup].TimesliceUS != 1024 && cs[pid].TimesliceUS != 1024 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never paused and steered: %+v", cs)
		}
		time.Sleep(time.Millisecond)
	}
	if err := d.Proc.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for {
		cs := contexts()
		if cs[inCgroup].Disabled == 0 && cs[inCgroup].TimesliceUS == 1024 && cs[pid].TimesliceUS == 1024 {
			break
		}
		if time.Since(killed) > time.Second {
			t.Fatalf("1 s after SIGKILL: %+v", cs)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("resumed and timeslices back %v after SIGKILL", time.Since(killed))
	time.Sleep(300 * time.Millisecond)
	if cs := contexts(); cs[inCgroup].Disabled != 0 {
		t.Errorf("paused again after the guardian resumed it: %+v", cs[inCgroup])
	}
}

// Bad input through the CLI is refused with the field and its range, and
// gpuarb refuses to throttle itself or PID 1.
func TestArbiterRefusals(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	bin := testutil.Bin(t, "gpuarb")
	x := testutil.NewCgroup(t, "x").Rel
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"attach", "--cgroup", x, "--weight", "0"}, "1–10000"},
		{[]string{"attach", "--cgroup", x, "--limit", "150%"}, "limit"},
		{[]string{"attach", "--cgroup", x, "--priority", "urgent"}, "priority"},
		{[]string{"attach", "--cgroup", x + "-missing"}, "no such cgroup"},
		{[]string{"attach", "--pid", "999999999"}, "no such process"},
		{[]string{"attach", "--pid", "1"}, "not a process gpuarb may stop"},
		{[]string{"attach", "--cgroup", "/", "--name", "root"}, "refusing"},
		{[]string{"attach", "--pid", strconv.Itoa(d.Proc.Cmd.Process.Pid)}, "refusing"},
		{[]string{"detach", "nobody"}, "no tenant"},
	} {
		args := append([]string{tc.args[0], "--socket", d.Socket}, tc.args[1:]...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("%v: err %v, output %q, want %q", tc.args, err, out, tc.want)
		}
	}
	out, err := exec.Command(bin, "policy", "show", "--socket", d.Socket).Output()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Parse(out); err != nil || !strings.Contains(string(out), "period: 100ms") {
		t.Errorf("policy show: %v %s", err, out)
	}
}

// logStatus logs the daemon's view of every tenant.
func logStatus(t *testing.T, d runningDaemon) {
	t.Helper()
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.GPUs {
		t.Logf("gpuarb: GPU %d busy %.1f%% actuator %s %s; probe events lost %d", g.Index, 100*g.BusyShare, g.Actuator,
			g.SchedulerUnavailable, st.Probes.LostEvents)
	}
	for _, tn := range st.Tenants {
		t.Logf("gpuarb: %s share %.1f%% target %.1f%% duty %.2f state %s timeslice %dµs throttled %v launch %v (%s)", tn.Name,
			100*tn.Share, 100*tn.TargetShare, tn.Duty, tn.State, tn.TimesliceUS, time.Duration(tn.ThrottledNS),
			time.Duration(tn.LaunchNS), tn.Reason)
	}
}

// summary parses the JSON summary a gpuwork process prints last.
func summary(t *testing.T, p *testutil.Proc) map[string]float64 {
	t.Helper()
	if err := p.Wait(t, 60*time.Second); err != nil {
		t.Fatalf("%s: %v: %s", p.Cmd.Args, err, p.Stderr)
	}
	lines := strings.Split(strings.TrimSpace(p.Stdout.String()), "\n")
	var raw map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &raw); err != nil {
		t.Fatalf("summary of %s: %v", p.Cmd.Args, err)
	}
	out := map[string]float64{}
	for k, v := range raw {
		if f, ok := v.(float64); ok {
			out[k] = f
		}
	}
	return out
}

// Bar 2: a non-preemptive GPU, 20 ms kernels against 2 ms kernels, equal
// weights: median unfairness over 1 s windows within 2%.
func TestArbiterNonPreemptive(t *testing.T) {
	measureTwice(t, func(t *testing.T, miss missFunc) {
		gpu := testutil.StartFakeGPU(t, "--no-preempt")
		d := startDaemon(t, gpu)
		// The operator tells gpuarb the GPU runs kernels to completion.
		if err := d.ApplyPolicy(t.Context(), []byte("gpus: [{index: 0, preemptive: false}]\n")); err != nil {
			t.Fatal(err)
		}
		cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "long"), "b": testutil.NewCgroup(t, "short")}
		// b arrives a second after a. Had both started together, each would
		// finish a batch every 176 ms whether their kernels took 20 and 2 ms
		// or 11 ms each on a fair GPU: launches and syncs could not tell the
		// two apart (meter.TestHogsOnEitherScheduler).
		testutil.Start(t, cgs["a"], gpu.Workload(t, "hog", "--kernel-ms", "20", "--duration", "20"))
		time.Sleep(time.Second)
		testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "20"))
		ws := trueShares(t, gpu, cgs, 4*time.Second, 6)
		logStatus(t, d)
		requireFair(t, miss, ws, "a (20 ms)", "b (2 ms)", "")
	})
}

// Bar 7: a tenant arriving mid-run beside a hog, with three times its
// weight, is within 5 pp of its target (75%) within 1 s.
func TestArbiterArrival(t *testing.T) {
	measureTwice(t, arrival)
}

func arrival(t *testing.T, miss missFunc) {
	gpu := testutil.StartFakeGPU(t)
	cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "first"), "b": testutil.NewCgroup(t, "arriving")}
	d := startDaemon(t, gpu)
	pol := "tenants:\n  - {name: a, cgroup: " + cgs["a"].Rel + ", weight: 100}\n  - {name: b, cgroup: " + cgs["b"].Rel + ", weight: 300}\n"
	if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
		t.Fatal(err)
	}
	testutil.Start(t, cgs["a"], gpu.Workload(t, "hog", "--duration", "20"))
	time.Sleep(3 * time.Second) // a alone, with a full queue
	if _, err := fakegpu.ReadStats(gpu.Socket, true); err != nil {
		t.Fatal(err)
	}
	arrived := time.Now()
	testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--duration", "20"))
	// 100 ms windows of the truth for 3 s.
	var b []float64
	for i := 0; i < 30; i++ {
		time.Sleep(time.Until(arrived.Add(time.Duration(i+1) * 100 * time.Millisecond)))
		st, err := fakegpu.ReadStats(gpu.Socket, true)
		if err != nil {
			t.Fatal(err)
		}
		var ns uint64
		for _, c := range st.GPUs[0].Contexts {
			if c.Cgroup == cgs["b"].Rel {
				ns += c.BusyNS
			}
		}
		b = append(b, float64(ns)/float64(st.ElapsedNS))
	}
	// Reached at S: every 500 ms window starting at S or later is within
	// 5 pp (shorter windows swing with the paced tenant's 20 ms kernels).
	const span = 5
	reached := -1
	for i := len(b) - span; i >= 0; i-- {
		var sum float64
		for _, x := range b[i : i+span] {
			sum += x
		}
		if math.Abs(sum/span-0.75) > 0.05 {
			break
		}
		reached = i
	}
	t.Logf("arriving tenant, 100 ms windows: %s", pcts(b))
	logStatus(t, d)
	if reached < 0 {
		miss("never settled within 5 pp of 75%%")
		return
	}
	after := time.Duration(reached) * 100 * time.Millisecond
	t.Logf("every 500 ms window from %v after arriving within 5 pp of its target", after)
	if after > time.Second {
		miss("reached its target %v after arriving, want ≤ 1 s", after)
	}
}

// Bar 6: two frame loops with an fps SLO beside a hog hold their target
// FPS within 5%. Each needs 6 ms of GPU a frame at 60 fps (36%); beside
// the hog, unarbitrated, both run at 49.6 fps.
func TestArbiterFrameSLO(t *testing.T) {
	measureTwice(t, frameSLO)
}

func frameSLO(t *testing.T, miss missFunc) {
	gpu := testutil.StartFakeGPU(t)
	cgs := map[string]*testutil.Cgroup{"f1": testutil.NewCgroup(t, "game1"), "f2": testutil.NewCgroup(t, "game2"), "hog": testutil.NewCgroup(t, "batch")}
	d := startDaemon(t, gpu)
	pol := "tenants:\n" +
		"  - {name: f1, cgroup: " + cgs["f1"].Rel + ", priority: latency, slo: {fps: 60}}\n" +
		"  - {name: f2, cgroup: " + cgs["f2"].Rel + ", priority: latency, slo: {fps: 60}}\n"
	if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
		t.Fatal(err)
	}
	testutil.Start(t, cgs["hog"], gpu.Workload(t, "hog", "--duration", "14"))
	time.Sleep(time.Second)
	var frames []*testutil.Proc
	for _, n := range []string{"f1", "f2"} {
		frames = append(frames, testutil.Start(t, cgs[n], gpu.Workload(t, "frames", "--fps", "60", "--frame-ms", "6", "--duration", "10", "--interval", "1")))
	}
	ws := trueShares(t, gpu, cgs, 4*time.Second, 5)
	logStatus(t, d)
	t.Logf("true shares f1 %s f2 %s hog %s busy %s", pcts(col(ws, func(w map[string]float64) float64 { return w["f1"] })),
		pcts(col(ws, func(w map[string]float64) float64 { return w["f2"] })), pcts(col(ws, func(w map[string]float64) float64 { return w["hog"] })),
		pcts(col(ws, func(w map[string]float64) float64 { return w["busy"] })))
	for i, p := range frames {
		s := summary(t, p)
		// Frames per second in each 1 s interval after the first four (the
		// settled state, as the shares above).
		var fps []float64
		for _, line := range strings.Split(p.Stdout.String(), "\n") {
			var iv struct {
				T     float64 `json:"t"`
				Count float64 `json:"count"`
			}
			if json.Unmarshal([]byte(line), &iv) == nil && iv.T > 4 && iv.Count > 0 {
				fps = append(fps, iv.Count)
			}
		}
		t.Logf("frames %d: %v fps per second after 4 s (target 60); whole run %.1f fps, p99 frame %.1f ms, over 34 ms %.1f%%",
			i+1, fps, s["fps"], s["frame_p99_ms"], 100*s["over_34ms"])
		if len(fps) < 3 || median(fps) < 57 {
			miss("frames %d at a median %.1f fps, want 60 ± 5%%", i+1, median(fps))
		}
	}
}

// Issue 58's equal-FPS policy (vGASA's ESA): three frame loops of 5, 8
// and 10 ms of GPU work a frame, rendering as fast as they can, in one
// equal-FPS group. At equal weights the GPU's time is shared equally and
// their frame rates are in inverse proportion to their frame costs (about
// 67, 42 and 33 a second); in the group each renders at one common rate
// (within 5% of their median), the highest the GPU allows (at least 90%
// of its busy time over the 23 ms the three frames cost), the GPU at
// least 90% busy.
func TestEqualFPSGroupRendersAtOneRate(t *testing.T) {
	measureTwice(t, equalFPSGroup)
}

func equalFPSGroup(t *testing.T, miss missFunc) {
	gpu := testutil.StartFakeGPU(t)
	costs := map[string]float64{"g5": 5, "g8": 8, "g10": 10}
	cgs := map[string]*testutil.Cgroup{}
	for n := range costs {
		cgs[n] = testutil.NewCgroup(t, "game-"+n)
	}
	d := startDaemon(t, gpu)
	policyOf := func(group string) []byte {
		pol := "tenants:\n"
		for _, n := range slices.Sorted(maps.Keys(costs)) {
			pol += "  - {name: " + n + ", cgroup: " + cgs[n].Rel + ", weight: 100" + group + "}\n"
		}
		return []byte(pol)
	}
	if err := d.ApplyPolicy(t.Context(), policyOf("")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	games := map[string]*testutil.Proc{}
	for n, ms := range costs {
		games[n] = testutil.Start(t, cgs[n], gpu.Workload(t, "frames", "--fps", "1000", "--frame-ms", strconv.FormatFloat(ms, 'f', -1, 64),
			"--kernels", "2", "--duration", "20", "--interval", "1"))
	}
	equal := trueShares(t, gpu, cgs, 3*time.Second, 4)
	switched := time.Since(start).Seconds()
	if err := d.ApplyPolicy(t.Context(), policyOf(", equal_fps: games")); err != nil {
		t.Fatal(err)
	}
	grouped := trueShares(t, gpu, cgs, 4*time.Second, 5)
	logStatus(t, d)
	for _, p := range games {
		if err := p.Wait(t, 15*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// Each loop's frames in the whole seconds of its report that fall in
	// the windows above.
	fps := func(n string, from, to float64) []float64 {
		var out []float64
		for _, line := range strings.Split(games[n].Stdout.String(), "\n") {
			var iv struct {
				T     float64 `json:"t"`
				Count float64 `json:"count"`
			}
			if json.Unmarshal([]byte(line), &iv) == nil && iv.T > from && iv.T <= to && iv.Count > 0 {
				out = append(out, iv.Count)
			}
		}
		return out
	}
	rates := map[string]float64{}
	for _, n := range slices.Sorted(maps.Keys(costs)) {
		before, after := fps(n, 4, switched), fps(n, switched+5, switched+10)
		rates[n] = median(after)
		t.Logf("%s (%.0f ms a frame): %v fps at equal weights, %v in the group", n, costs[n], before, after)
	}
	busy := median(col(grouped, func(w map[string]float64) float64 { return w["busy"] }))
	t.Logf("GPU busy %s at equal weights, %s in the group", pcts(col(equal, func(w map[string]float64) float64 { return w["busy"] })),
		pcts(col(grouped, func(w map[string]float64) float64 { return w["busy"] })))
	common := median(slices.Collect(maps.Values(rates)))
	for n, r := range rates {
		if math.Abs(r-common) > 0.05*common {
			miss("%s renders %.1f fps in the group, want within 5%% of the common %.1f (%v)", n, r, common, rates)
		}
	}
	if best := busy * 1000 / 23; common < 0.9*best {
		miss("the common rate %.1f fps, want at least 90%% of the %.1f the GPU's busy time allows", common, best)
	}
	if busy < 0.9 {
		miss("GPU busy %.1f%% in the group, want ≥ 90%%", 100*busy)
	}
}

// Bar 5: a latency tenant (infer, SLO p99 sync 3 ms) beside two greedy
// tenants, then beside two hogs: its p50 and p99 against alone, and how
// busy the GPU stays.
//
// The greedy tenants queue 1024 kernels of 50 ms each (51 s of GPU time)
// in their first milliseconds and never synchronize: no launch gate can
// recall that work, but the GPU's own scheduler time-slices it, and with
// their channel groups at the shortest timeslice infer's turn comes within
// 0.1 ms.
func TestArbiterLatencyTenant(t *testing.T) {
	// The GPU's scheduler serves it within the others' shortest slices.
	// Its p99 is taken on the simulator's truth: each request's time on
	// the GPU, from when the device saw it to its end (gpuwork infer
	// --device-latency: events around it, stamped in the device's exact
	// virtual time). Without gpuarb it is 3× alone's; the bar is 2×.
	// Issue 16's 1.5× holds in most runs of this test alone (1.15–1.21×
	// in five of seven) and in most bench runs (BENCHMARKS.md §5 header:
	// 1.39–1.59×, one of 2.29×), not under the whole suite's load on this
	// VM (1.57 and 1.72× in one make test):
	// a host stall while infer launches empties its channel mid-request,
	// and it waits through the others' rotation again. The wall clock
	// the request sees adds this VM's host stalls, which no GPU
	// scheduler reaches: infer's per-second p99 alone read 1.7 ms in one
	// run and 11 ms in the next of one build, and a uprobe hit costs it
	// about 20 µs here (about 1 µs on bare metal). On it the median
	// request stays within 1.25× of alone and the per-second p99 within
	// 2.5× or under wallP99Ceiling. Each phase is compared with infer
	// alone measured just before it, in the same run, with the probes
	// attached.
	for _, others := range []string{"greedy", "hog"} {
		t.Run("beside two "+others+" tenants", func(t *testing.T) {
			measureTwice(t, func(t *testing.T, miss missFunc) { latencyBeside(t, miss, others, false) })
		})
	}
	// Where a switch costs what it cost an H200 (256 µs: e2e/realgpu) the
	// shortest slice worth having is 1024 µs, two of them and their
	// switches ahead of a request are 3.3× its time alone, and the
	// latency holds take the others off the GPU at its launch instead
	// (enforce/hold.go).
	t.Run("H200 costs", func(t *testing.T) {
		measureTwice(t, func(t *testing.T, miss missFunc) { latencyBeside(t, miss, "greedy", true) })
	})
	// Descheduled instead of evicted, the others finish the slice they
	// are in: a request waits up to one 1024 µs slice and a switch more
	// than under evicting holds (2.7× alone at p99 in the runs of this
	// test, 5.2× with holds off), and every launch holds, however slowly
	// the holds start.
	t.Run("H200 costs, deschedule holds", func(t *testing.T) {
		measureTwice(t, func(t *testing.T, miss missFunc) {
			latencyBeside(t, miss, "greedy", true, "--latency-holds", "deschedule")
		})
	})
}

// h200Costs are the simulated GPU's flags for what the real-GPU check
// measured on an H200: a 2048 µs default timeslice, a 256 µs switch.
var h200Costs = []string{"--ctxsw=256us", "--timeslice=2048us"}

// wallP99Ceiling (ms) bounds infer's per-second wall-clock p99 where 2.5×
// alone is less: the wall clock carries this VM's host stalls (alone read
// 1.6, 3.0 and 6.2 ms in three phases of one run, and beside hogs 3.7–5.9
// ms with the GPU's share of it at 1.2–1.3× alone), while a launch gate
// or pause that held the latency tenant itself costs it a control period
// (100 ms) or more.
const wallP99Ceiling = 8.0

// latencyBeside measures infer alone for 4 s, then beside two tenants of
// the workload others, on a GPU of the simulator's default costs or an
// H200's (h200), the daemon started with daemonArgs, and reports the bars
// it misses. On the H200's the latency holds must have served it.
func latencyBeside(t *testing.T, miss missFunc, others string, h200 bool, daemonArgs ...string) {
	var gpu *testutil.FakeGPU
	if h200 {
		gpu = testutil.StartFakeGPU(t, h200Costs...)
	} else {
		gpu = testutil.StartFakeGPU(t)
	}
	cgs := map[string]*testutil.Cgroup{"infer": testutil.NewCgroup(t, "infer"), "o1": testutil.NewCgroup(t, others+"1"),
		"o2": testutil.NewCgroup(t, others+"2")}
	d := startDaemon(t, gpu, daemonArgs...)
	pol := "tenants:\n  - {name: infer, cgroup: " + cgs["infer"].Rel + ", priority: latency, slo: {p99_sync_ms: 3}}\n"
	if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
		t.Fatal(err)
	}
	infer := func(secs string) *testutil.Proc {
		return testutil.Start(t, cgs["infer"], gpu.Workload(t, "infer", "--rate", "200", "--duration", secs, "--interval", "1",
			"--device-latency"))
	}
	p := infer("4")
	s := summary(t, p)
	aloneP50, aloneSteady, aloneDevice, aloneDeviceP50 := s["latency_p50_ms"], median(perSecond(p, "latency_p99_ms", 1)),
		s["device_latency_p99_ms"], s["device_latency_p50_ms"]
	t.Logf("infer alone: p99 %.2f ms, per-second p99 %.2f ms, p50 %.2f ms; on the GPU p99 %.3f ms, p50 %.3f ms",
		s["latency_p99_ms"], aloneSteady, aloneP50, aloneDevice, aloneDeviceP50)

	testutil.Start(t, cgs["o1"], gpu.Workload(t, others, "--duration", "12"))
	testutil.Start(t, cgs["o2"], gpu.Workload(t, others, "--duration", "12"))
	time.Sleep(2 * time.Second)
	p = infer("8")
	ws := trueShares(t, gpu, cgs, 3*time.Second, 4)
	s = summary(t, p)
	logStatus(t, d)
	// At an H200's costs a held request still waits for the hold to
	// start (about 0.4 ms here: the reader's wake-up and three controls
	// over the simulator's socket) and a 256 µs switch: 1.8–2.2× alone at
	// p99 and 1.5× at p50 in the runs of this test (2.2–2.5× before holds
	// covered a service's first requests), against 3.3× with the slices
	// alone and 5.3× without gpuarb (docs/benchmark-history.md §20, §21);
	// the bars leave this VM's host stalls room, and are not issue 16's
	// 1.5×, which the default costs hold.
	deviceBar, p50Bar, busyBar := 2.0, 1.25, 0.9
	if h200 {
		// Each hold costs the others two 256 µs switches and the time the
		// hold takes to start, which grows with the host's wake-up
		// latency: the GPU read 79-85% busy (median of 4 windows) in the
		// runs of this test on a VM whose uprobe hit costs 21 µs.
		deviceBar, p50Bar, busyBar = 3.0, 2.0, 0.8
	}
	deschedule := slices.Contains(daemonArgs, "deschedule")
	if deschedule {
		// Descheduled, the others finish the slice they are in before
		// each request and pay a 256 µs switch each way, and each hold
		// idles the GPU for the host's wake-up and the controls that end
		// it: the GPU read 83-89% busy (median of 4 windows) in the runs
		// of this test alone and 77.8% in one make test on this VM.
		deviceBar, p50Bar, busyBar = 3.5, 2.5, 0.75
	}
	if h200 {
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		g := st.GPUs[0]
		t.Logf("latency holds %d (cut %d), start %d µs, slices bound %d µs", g.LatencyHolds, g.LatencyHoldsCut,
			g.LatencyHoldStartUS, g.LatencyHoldBoundUS)
		switch {
		case !deschedule && g.LatencyHoldStartUS > g.LatencyHoldBoundUS:
			// Evicting holds go on only while they start sooner than the
			// slices bound the wait (enforce/hold.go). On a host that
			// wakes the daemon that slowly (median start over 2 ms: this
			// VM under the suite's load once) the slices serve it, and a
			// probe a second measures the holds again: the bars are the
			// slices' (3.1× alone at p99 on the GPU, 2.6× at p50 in that
			// run; 5.3× without gpuarb).
			t.Logf("holds start slower than the slices bound a wait on this host: served by the slices")
			deviceBar, p50Bar = 3.5, 3.0
			if g.LatencyHolds < 7 {
				miss("%d latency holds in 8 s with holds off for their start, want a probe a second", g.LatencyHolds)
			}
		case g.LatencyHolds < 800:
			// 200 requests a second for 8 s: most of them held the others.
			miss("%d latency holds in 8 s of 200 requests a second, want most requests held", g.LatencyHolds)
		}
		// From its first second: a new process of the latency tenant
		// holds by its cgroup before a control step has seen it, and a
		// GPU's first slow hold (it records the groups) does not turn
		// the holds off. Without either its first second read 5.2× alone
		// on the GPU at p99, twice the seconds after it; with them it
		// reads within 1.4× of the seconds after it (2.6-3.9 ms for
		// 2.5-3.3 in the runs of this test).
		all := perSecond(p, "device_latency_p99_ms", 0)
		if len(all) < 2 {
			miss("infer's per-second p99 on the GPU: %v ms, want 8 seconds of it", all)
		} else if rest := median(all[1:]); all[0] > max(max(3, deviceBar)*aloneDevice, 1.5*rest) {
			miss("infer's first second on the GPU: p99 %v ms (per second), alone %.3f ms: want within %.1f× alone or 1.5× the seconds after it",
				all, aloneDevice, max(3, deviceBar))
		}
	}
	busy := median(col(ws, func(w map[string]float64) float64 { return w["busy"] }))
	steady, p50, device, deviceP50 := median(perSecond(p, "latency_p99_ms", 1)), s["latency_p50_ms"], s["device_latency_p99_ms"],
		s["device_latency_p50_ms"]
	t.Logf("infer beside two %s tenants: p99 %.2f ms, per-second p99 %.2f ms (%.1f× alone), p50 %.2f ms; on the GPU p99 %.3f ms "+
		"(%.2f× alone), p50 %.3f ms; GPU busy %s (median %.1f%%)", others, s["latency_p99_ms"], steady, steady/aloneSteady, p50,
		device, device/aloneDevice, deviceP50, pcts(col(ws, func(w map[string]float64) float64 { return w["busy"] })),
		100*busy)
	if device > deviceBar*aloneDevice {
		miss("infer p99 on the GPU beside %s tenants %.3f ms, alone %.3f ms: want within %.1f×", others, device, aloneDevice, deviceBar)
	}
	// The median request's time on the GPU is the scheduler's doing; its
	// wall-clock median also carries this VM's host stalls (1.33 ms alone
	// and 1.94 ms beside greedy tenants in one make test, 1.46×), so it
	// gets room for them: a latency tenant held at a gate or paused
	// itself would wait a control period.
	if deviceP50 > p50Bar*aloneDeviceP50 {
		miss("infer p50 on the GPU beside %s tenants %.3f ms, alone %.3f ms: want within %.2f×", others, deviceP50, aloneDeviceP50, p50Bar)
	}
	if p50 > max(p50Bar, 2)*aloneP50 {
		miss("infer p50 beside %s tenants %.2f ms, alone %.2f ms: want within %.2f×", others, p50, aloneP50, max(p50Bar, 2))
	}
	if steady > max(2.5*aloneSteady, wallP99Ceiling) {
		miss("infer per-second p99 beside %s tenants %.2f ms, alone %.2f ms: want within 2.5× or under %.0f ms", others, steady,
			aloneSteady, wallP99Ceiling)
	}
	if busy < busyBar {
		miss("GPU busy %.1f%% beside %s tenants and the latency tenant, want ≥ %.0f%%", 100*busy, others, 100*busyBar)
	}
}

// requireFair logs tenants a's and b's true shares per window and
// reports a median unfairness above 2% as a miss.
func requireFair(t *testing.T, miss missFunc, ws []map[string]float64, aName, bName, note string) {
	t.Helper()
	u := col(ws, unfairness)
	t.Logf("true shares %s %s  %s %s  unfairness %s %s", aName, pcts(col(ws, func(w map[string]float64) float64 { return w["a"] })),
		bName, pcts(col(ws, func(w map[string]float64) float64 { return w["b"] })), pcts(u), note)
	if m := median(u); m > 0.02 {
		miss("median unfairness %.1f%%, want ≤ 2%%", 100*m)
	}
}

// perSecond reads a gpuwork --interval report: the value of key in each
// interval that ends after the first `after` seconds.
func perSecond(p *testutil.Proc, key string, after float64) []float64 {
	var out []float64
	for _, line := range strings.Split(p.Stdout.String(), "\n") {
		var iv map[string]any
		if json.Unmarshal([]byte(line), &iv) != nil || iv["summary"] != nil {
			continue
		}
		if t, _ := iv["t"].(float64); t > after {
			if v, ok := iv[key].(float64); ok {
				out = append(out, v)
			}
		}
	}
	return out
}
