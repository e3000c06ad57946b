package e2e

import (
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/internal/testutil"
)

// Issue 14's closed-loop bars: four processes of tenant a against one of
// tenant b, each a plain closed loop (a stream sync every 32 launches of
// 1 ms kernels, every 1, 4 or 32 of 10 ms ones), the daemon on its probes
// alone. Equal weights: the windows' median unfairness within 2%; weights
// 1:3 and 1:9: b within ±2 pp of its target (its weighted share, or what
// it takes alone if that is less). Unarbitrated, a's four processes take
// 80%.
//
// On the launch gate a weighted case bars the split of the GPU time the
// two tenants used: b's part of it, b/(a+b), within ±2 pp of its weighted
// share, with the GPU kept busy within 8 pp of what b takes alone. A
// closed loop leaves the GPU idle between its sync's return and its next
// launch, for as long as the host takes to run it again (b alone takes
// 87–99% on this 2-vCPU VM, run to run); steering's time-slicing gives
// those gaps to a's queued work, but the gate holds a's processes stopped
// there, so b's share of the whole GPU is its weighted share less the gaps
// of its own loop: at 1:9, a 10.2% and b 86.3–88.2% beside b alone at
// 96.3–97.8% (eight 1 s windows after the change, four runs), where b's
// part of the time used is 89.4–89.6%.
//
// The cases run steered and on the launch gate, but for 10 ms kernels
// synced every 4 or 32 there (not bars yet, issue 58: at equal weights
// 1.8–9.6% and 0.5–3.0% unfair, run to run).
//
// Not bars, the cells that miss (BENCHMARKS.md and issue 14 have their
// numbers): 1 ms kernels synced every 4 launches (unfairness 2.6-3.1%; b
// at 72-73% for 75 and 84-86% for 90: the meter reads b 2-3 pp high
// there, and a's four groups at the shortest slice switch some 2000
// times a second at 20 µs each), every launch (b 10-25 pp short), and
// 0.2 ms kernels, where the five processes' host time on this 2-vCPU VM
// leaves the GPU idle a third of the time.
func TestClosedLoops(t *testing.T) {
	for _, mode := range actuatorModes {
		t.Run(mode.name, func(t *testing.T) { closedLoops(t, mode.args) })
	}
}

// closedLoops runs TestClosedLoops' cases under a daemon started with
// daemonArgs: on the launch gate, those it holds.
func closedLoops(t *testing.T, daemonArgs []string) {
	gated := len(daemonArgs) > 0
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu, daemonArgs...)
	for _, c := range []struct {
		kernel, every string
		gated         bool // a bar on the launch gate too
	}{{"1", "32", true}, {"10", "1", true}, {"10", "4", false}, {"10", "32", false}} {
		if gated && !c.gated {
			continue
		}
		kernel, every := c.kernel, c.every
		t.Run(fmt.Sprintf("%s ms kernels, sync every %s", kernel, every), func(t *testing.T) {
			measureTwice(t, func(t *testing.T, miss missFunc) {
				loop := []string{"loop", "--kernels-ms", kernel, "--sync-every", every, "--sync", "stream", "--duration", "40"}
				cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "four"), "b": testutil.NewCgroup(t, "one")}
				testutil.Start(t, cgs["b"], gpu.Workload(t, loop...))
				ws := trueShares(t, gpu, map[string]*testutil.Cgroup{"b": cgs["b"]}, time.Second, 2)
				alone := median(col(ws, func(w map[string]float64) float64 { return w["b"] }))
				for i := 0; i < 4; i++ {
					testutil.Start(t, cgs["a"], gpu.Workload(t, loop...))
				}
				for _, wb := range []int{1, 3, 9} {
					pol := "tenants:\n  - {name: a, cgroup: " + cgs["a"].Rel + ", weight: 100}\n  - {name: b, cgroup: " +
						cgs["b"].Rel + ", weight: " + strconv.Itoa(100*wb) + "}\n"
					if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
						t.Fatal(err)
					}
					ws := trueShares(t, gpu, cgs, 3*time.Second, 3)
					b := col(ws, func(w map[string]float64) float64 { return w["b"] })
					a := col(ws, func(w map[string]float64) float64 { return w["a"] })
					part := median(col(ws, func(w map[string]float64) float64 { return w["b"] / (w["a"] + w["b"]) }))
					busy := median(col(ws, func(w map[string]float64) float64 { return w["a"] + w["b"] }))
					want := math.Min(float64(wb)/float64(1+wb), alone)
					t.Logf("1:%d: b %s (target %.1f%%, alone %.1f%%), a %s; b's part of the time used %.1f%%, GPU busy %.1f%%",
						wb, pcts(b), 100*want, 100*alone, pcts(a), 100*part, 100*busy)
					switch {
					case wb == 1 && want == 0.5:
						requireFair(t, miss, ws, "a (4)", "b (1)", "")
					case gated && math.Abs(part-float64(wb)/float64(1+wb)) > 0.02:
						logStatus(t, d)
						miss("weights 1:%d: b's part of the GPU time used %.1f%%, want %.1f%% ± 2 pp", wb, 100*part, 100*float64(wb)/float64(1+wb))
					case gated && busy < alone-0.08:
						logStatus(t, d)
						miss("weights 1:%d: the GPU %.1f%% busy, want within 8 pp of b alone, %.1f%%", wb, 100*busy, 100*alone)
					case !gated && math.Abs(median(b)-want) > 0.02:
						logStatus(t, d)
						miss("weights 1:%d: b's median %.1f%%, want %.1f%% ± 2 pp", wb, 100*median(b), 100*want)
					}
				}
			})
		})
	}
}

// Issue 14's mixed-kernel scenario under the daemon with equal weights:
// each tenant within 3 pp of 50% (median over 1 s windows), and the
// daemon's estimate within 3 pp of the truth, in both actuator modes.
func TestMixedKernelsFair(t *testing.T) {
	inEachMode(t, mixedKernelsFair)
}

func mixedKernelsFair(t *testing.T, miss missFunc, daemonArgs []string) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu, daemonArgs...)
	cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "phased"), "b": testutil.NewCgroup(t, "steady")}
	testutil.Start(t, cgs["a"], gpu.Workload(t, append(mixedPhased, "--duration", "20")...))
	testutil.Start(t, cgs["b"], gpu.Workload(t, append(mixedSteady, "--duration", "20")...))
	time.Sleep(3 * time.Second)
	var errs, a []float64
	for i := 0; i < 8; i++ {
		ws := trueShares(t, gpu, cgs, 0, 1)
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, tn := range st.Tenants {
			if tn.Cgroup == cgs["a"].Rel {
				errs = append(errs, math.Abs(tn.Share-ws[0]["a"]))
			}
		}
		a = append(a, ws[0]["a"])
	}
	t.Logf("phased tenant %s (equal weights), estimate off by %s", pcts(a), pcts(errs))
	logStatus(t, d)
	if m := median(a); math.Abs(m-0.5) > 0.03 {
		miss("phased tenant's median %.1f%%, want 50 ± 3", 100*m)
	}
	if m := median(errs); m > 0.03 {
		miss("estimate off by a median %.1f pp, want ≤ 3", 100*m)
	}
}

// Issue 15's bar: a program shaped like the CUDA runtime (entry points from
// cuGetProcAddress_v2 with the per-thread flag, the primary context,
// cuLaunchKernelEx, an event-polled allocator: gpuwork train) holds weights
// 1:3 against a plain hog within ±3 pp of its target (its weighted share,
// or what it takes alone if less), both ways round, in both actuator
// modes: on the launch gate a train step's few long GEMMs and many short
// optimizer kernels are each charged at the meter's cost of them.
func TestRuntimeTenantWeighted(t *testing.T) {
	inEachMode(t, runtimeTenantWeighted)
}

func runtimeTenantWeighted(t *testing.T, miss missFunc, daemonArgs []string) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu, daemonArgs...)
	cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "train"), "b": testutil.NewCgroup(t, "hog")}
	testutil.Start(t, cgs["a"], gpu.Workload(t, "train", "--duration", "30"))
	ws := trueShares(t, gpu, map[string]*testutil.Cgroup{"a": cgs["a"]}, time.Second, 2)
	alone := median(col(ws, func(w map[string]float64) float64 { return w["a"] }))
	testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--duration", "30"))
	for _, wa := range []int{300, 100 / 3} {
		pol := "tenants:\n  - {name: a, cgroup: " + cgs["a"].Rel + ", weight: " + strconv.Itoa(wa) + "}\n  - {name: b, cgroup: " +
			cgs["b"].Rel + ", weight: 100}\n"
		if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
			t.Fatal(err)
		}
		ws := trueShares(t, gpu, cgs, 3*time.Second, 3)
		a := col(ws, func(w map[string]float64) float64 { return w["a"] })
		want := math.Min(float64(wa)/float64(wa+100), alone)
		t.Logf("train weight %d vs hog 100: train %s (target %.1f%%, alone %.1f%%)", wa, pcts(a), 100*want, 100*alone)
		if math.Abs(median(a)-want) > 0.03 {
			logStatus(t, d)
			miss("train at weight %d: median %.1f%%, want %.1f%% ± 3 pp", wa, 100*median(a), 100*want)
		}
	}
}

// A process with a context per thread (four threads, each its own context
// and channel group, as multi-model servers make) beside a process of one
// context, the GPU steered: with equal weights each takes 50% ± 2 pp, at
// weights 1:3 the four-context process takes 25% ± 2 pp, and gpuarb's
// estimate of each is within 3 pp of the truth. The GPU schedules channel
// groups, not processes: unarbitrated the four contexts take four fifths
// of it, and the meter models each context's turns apart. On the launch
// gate the same scenario is not held to these bars yet (issue 58): the
// shares held in 3 of 4 runs (a at 56.8% for 50 in the fourth), and the
// unpaced process reads 3-5 pp low.
func TestContextPerThreadProcessSharesFairly(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	measureTwice(t, func(t *testing.T, miss missFunc) { contextsShareFairly(t, miss, gpu, d) })
}

// contextsShareFairly runs TestContextPerThreadProcessSharesFairly's
// scenario on d.
func contextsShareFairly(t *testing.T, miss missFunc, gpu *testutil.FakeGPU, d runningDaemon) {
	loop := []string{"loop", "--kernels-ms", "1", "--sync-every", "4", "--sync", "stream", "--duration", "30"}
	cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "threads"), "b": testutil.NewCgroup(t, "one")}
	testutil.Start(t, cgs["a"], gpu.Workload(t, append(loop, "--threads", "4")...))
	testutil.Start(t, cgs["b"], gpu.Workload(t, loop...))
	for _, wb := range []int{1, 3} {
		pol := "tenants:\n  - {name: a, cgroup: " + cgs["a"].Rel + ", weight: 100}\n  - {name: b, cgroup: " +
			cgs["b"].Rel + ", weight: " + strconv.Itoa(100*wb) + "}\n"
		if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * time.Second)
		ws, errs := windowsWithEstimates(t, gpu, d, cgs, 4)
		a := col(ws, func(w map[string]float64) float64 { return w["a"] })
		b := col(ws, func(w map[string]float64) float64 { return w["b"] })
		want := 1 / float64(1+wb)
		t.Logf("1:%d: a (4 contexts) %s for %.0f%%, b %s; estimate off by %s", wb, pcts(a), 100*want, pcts(b), pcts(errs))
		if m := median(a); math.Abs(m-want) > 0.02 {
			logStatus(t, d)
			miss("weights 1:%d: a's median %.1f%%, want %.0f%% ± 2 pp", wb, 100*m, 100*want)
		}
		if m := median(errs); m > 0.03 {
			miss("weights 1:%d: estimate off the truth by %.1f pp (median), want ≤ 3", wb, 100*m)
		}
	}
}
