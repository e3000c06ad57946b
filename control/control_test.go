package control

import (
	"math"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/arbiter"
	"github.com/gpuarb/gpuarb/meter"
	"github.com/gpuarb/gpuarb/policy"
)

const ms = uint64(time.Millisecond)

// byCgroup assigns cgroup 10 to tenant a, 20 to b, anything else to the
// default tenant of its cgroup.
func byCgroup(pid uint32, cgroupID uint64) Assignment {
	switch cgroupID {
	case 10:
		return Assignment{Name: "a", Rules: policy.Rules{Weight: 100}, Cgroup: "/a"}
	case 20:
		return Assignment{Name: "b", Rules: policy.Rules{Weight: 300}, Cgroup: "/b"}
	}
	return Assignment{Name: "other", Rules: policy.Rules{Weight: 100}}
}

// step runs Step with the same figures as the short and the long window
// (1 s each), so each test states one set.
func step(ctxs []meter.ContextStats, held map[string]bool) Result {
	return Step(Input{Window: time.Second, Settled: time.Second, Short: ctxs, Long: ctxs, Assign: byCgroup,
		HeldBack: func(name string) bool { return held[name] }})
}

func input(t *testing.T, r Result, name string, gpu int) arbiter.Input {
	t.Helper()
	for _, in := range r.Inputs {
		if in.Name == name && in.GPU == gpu {
			return in
		}
	}
	t.Fatalf("no input for %s on GPU %d in %+v", name, gpu, r.Inputs)
	return arbiter.Input{}
}

// proc is one process's figures over a 1 s window: its share, the time it
// wanted the GPU, its launches and drains.
func proc(pid uint32, cg uint64, share float64, want uint64) meter.ContextStats {
	return meter.ContextStats{PID: pid, CgroupID: cg, GPUNS: uint64(share * 1e9), Share: share, WantNS: want,
		ActiveNS: 1000 * ms, Launches: 100, Learned: true}
}

// The closed loop: four processes of A against one of B, each
// syncing every few launches. B gets a fifth of the GPU but waits in its
// syncs nearly all the rest: it is backlogged (wants the whole GPU), not
// light — whatever share the GPU's scheduler gives it.
func TestStarvedClosedLoopIsBacklogged(t *testing.T) {
	var ctxs []meter.ContextStats
	for pid := uint32(1); pid <= 4; pid++ {
		ctxs = append(ctxs, proc(pid, 10, 0.2, 980*ms))
	}
	b := proc(5, 20, 0.2, 990*ms) // 10 ms between syncs and launches: 0.2 / 0.21
	b.Waiting = true
	ctxs = append(ctxs, b)
	r := step(ctxs, nil)
	for _, name := range []string{"a", "b"} {
		in := input(t, r, name, 0)
		if !in.Backlogged || in.Demand != 1 || !in.Busy {
			t.Errorf("%s: backlogged %v demand %.2f busy %v, want backlogged with demand 1", name, in.Backlogged, in.Demand, in.Busy)
		}
	}
	if a := input(t, r, "a", 0); math.Abs(a.Share-0.8) > 1e-9 || a.Contexts != 4 || a.Groups != 4 {
		t.Errorf("a: share %.3f over %d contexts (%d groups), want 0.8 over 4", a.Share, a.Contexts, a.Groups)
	}
	// The arbiter's targets over these inputs are the weights' split.
	targets := arbiter.Targets(r.Inputs, func(arbiter.Input) float64 { return 1 })
	for i, in := range r.Inputs {
		want := map[string]float64{"a": 0.25, "b": 0.75}[in.Name]
		if math.Abs(targets[i]-want) > 1e-9 {
			t.Errorf("target of %s %.3f, want %.3f", in.Name, targets[i], want)
		}
	}
}

// A closed loop of W ns of GPU work and T ns of thought wants W/(W+T) of
// the GPU alone, however much of it the others leave it: held back, it
// runs fewer iterations, but thinks as long per iteration.
func TestClosedLoopDemandIgnoresItsShare(t *testing.T) {
	const work, think = 3 * ms, 1 * ms // alone: 75%
	for _, iterations := range []uint64{250, 100, 20} {
		gpu := iterations * work
		p := proc(1, 10, float64(gpu)/1e9, 1000*ms-iterations*think) // waiting for the GPU is wanting it
		r := step([]meter.ContextStats{p}, nil)
		a := input(t, r, "a", 0)
		if math.Abs(a.Demand-0.75) > 1e-6 || a.Backlogged {
			t.Errorf("%d iterations in the window: demand %.3f backlogged %v, want 0.75 and not backlogged", iterations, a.Demand, a.Backlogged)
		}
	}
}

// A process that would take backloggedFraction of the GPU alone is
// backlogged; one that just arrived and wanted the GPU wants all of it.
func TestBackloggedFraction(t *testing.T) {
	for _, tc := range []struct {
		share        float64
		want, active uint64
		backlogged   bool
	}{
		{0.1, 989 * ms, 1000 * ms, true},  // 0.1 / (0.1 + 0.011)
		{0.1, 988 * ms, 1000 * ms, false}, // 0.1 / (0.1 + 0.012)
		{0, 1000 * ms, 1000 * ms, true},   // kept from the GPU all the window
		{0, 1 * ms, 5 * ms, true},         // just arrived
		{0, 0, 5 * ms, false},             // just arrived, nothing yet
	} {
		p := proc(1, 10, tc.share, tc.want)
		p.ActiveNS = tc.active
		a := input(t, step([]meter.ContextStats{p}, nil), "a", 0)
		if a.Backlogged != tc.backlogged || (a.Demand >= backloggedFraction) != tc.backlogged {
			t.Errorf("share %.2f, wanted %v of %v active: backlogged %v demand %.3f, want backlogged %v", tc.share,
				time.Duration(tc.want), time.Duration(tc.active), a.Backlogged, a.Demand, tc.backlogged)
		}
	}
}

// A tenant gpuarb held back in the control window wants more than it got
// (its queue may be empty because it was held): busy, held, backlogged.
func TestHeldBackWantsMore(t *testing.T) {
	p := proc(1, 10, 0.05, 100*ms)
	p.Launches = 0
	a := input(t, step([]meter.ContextStats{p}, map[string]bool{"a": true}), "a", 0)
	if !a.Busy || !a.Held || !a.Backlogged || math.Abs(a.Demand-0.05/0.95) > 1e-6 {
		t.Errorf("held back: %+v, want busy, held, backlogged, its processes' demand 0.05/0.95", a)
	}
	b := input(t, step([]meter.ContextStats{p}, nil), "a", 0)
	if b.Busy || b.Backlogged {
		t.Errorf("idle and not held: busy %v backlogged %v, want neither", b.Busy, b.Backlogged)
	}
}

// Exited processes keep their GPU time in the tenant's share but neither
// demand nor count as processes; per-GPU inputs stay apart and sorted.
func TestExitedAndPerGPU(t *testing.T) {
	gone := proc(1, 10, 0.3, 1000*ms)
	gone.Exited = true
	live := proc(2, 10, 0.1, 50*ms)
	other := proc(3, 10, 0.6, 1000*ms)
	other.GPU = 1
	r := step([]meter.ContextStats{other, live, gone}, nil)
	if len(r.Inputs) != 2 || r.Inputs[0].GPU != 0 || r.Inputs[1].GPU != 1 {
		t.Fatalf("inputs %+v, want a's on GPU 0 then GPU 1", r.Inputs)
	}
	a0 := input(t, r, "a", 0)
	if math.Abs(a0.Share-0.4) > 1e-9 || a0.Contexts != 1 || a0.Backlogged {
		t.Errorf("GPU 0: share %.2f contexts %d backlogged %v, want 0.4, 1 live context, not backlogged", a0.Share, a0.Contexts, a0.Backlogged)
	}
	if d := a0.Demand; math.Abs(d-0.1/(0.1+0.95)) > 1e-6 {
		t.Errorf("GPU 0 demand %.3f, want the live process's 0.1/(0.1+0.95)", d)
	}
	ten := r.Tenants["a"]
	if len(ten.Members) != 3 || len(ten.CgroupIDs) != 1 || ten.Usage[0].Processes != 1 || ten.Usage[0].GPUNS != 400*ms {
		t.Errorf("tenant a: %d members, cgroups %v, usage %+v", len(ten.Members), ten.CgroupIDs, ten.Usage[0])
	}
}

// The work one of a tenant's groups brings to a turn is its GPU time over
// the times its work ran out, its last bursts where the meter has them, or
// its turn in progress where that ran runsLonger times as long; none ran
// out: it fills any slice (0).
func TestBurst(t *testing.T) {
	a := proc(1, 10, 0.3, 1000*ms)
	a.Drains = 1000
	b := proc(2, 10, 0.1, 1000*ms)
	b.Drains = 1000
	hog := proc(3, 20, 0.6, 1000*ms)
	r := step([]meter.ContextStats{a, b, hog}, nil)
	if got := input(t, r, "a", 0).BurstNS; math.Abs(got-0.2*float64(ms)) > 1 {
		t.Errorf("burst %.0f ns, want 400 ms over 2000 drains = 200 µs", got)
	}
	if got := input(t, r, "b", 0).BurstNS; got != 0 {
		t.Errorf("hog's burst %.0f, want 0", got)
	}

	// Its last bursts, where the meter has them, stand for the window's
	// mean; a turn in progress within runsLonger of them is a loop's
	// spread, one beyond is a phase of longer bursts and stands itself.
	for _, tc := range []struct{ recentMS, runMS, wantMS float64 }{
		{0, 0.3, 0.2},
		{0.5, 0.3, 0.5},
		{0.5, 0.9, 0.5},
		{0.5, 3, 3},
		{0, 3, 3},
	} {
		recent, run, want := tc.recentMS*float64(ms), tc.runMS*float64(ms), tc.wantMS*float64(ms)
		a.RecentBurstNS, a.RunNS = uint64(recent), uint64(run)
		r = step([]meter.ContextStats{a, b, hog}, nil)
		if got := input(t, r, "a", 0).BurstNS; math.Abs(got-want) > 1 {
			t.Errorf("last bursts %.0f ns, turn in progress %.0f ns: burst %.0f ns, want %.0f", recent, run, got, want)
		}
	}
}

// Launch cost is weighted by launches; the SLO figures come from the
// long window's sync waits.
func TestLaunchCostAndSLOFigures(t *testing.T) {
	a := proc(1, 10, 0.3, 1000*ms)
	a.LaunchNS, a.Launches, a.Syncs = 1e6, 300, 100
	for i := uint64(1); i <= 100; i++ {
		a.SyncWait = append(a.SyncWait, i*ms)
	}
	b := proc(2, 10, 0.3, 1000*ms)
	b.LaunchNS, b.Launches = 4e6, 100
	r := step([]meter.ContextStats{a, b}, nil)
	in := input(t, r, "a", 0)
	if want := (300*1e6 + 100*4e6) / 400; math.Abs(in.LaunchNS-want) > want*1e-3 {
		t.Errorf("launch cost %.0f, want %.0f", in.LaunchNS, want)
	}
	if in.SyncP99MS != 99 || in.FPS != 100 {
		t.Errorf("p99 %.1f ms, %.0f syncs/s; want 99 ms and 100", in.SyncP99MS, in.FPS)
	}
}

// What a tenant's work waited behind other contexts' turns is summed over
// its processes, as a part of the control window: the arbiter pauses
// others only for a tenant that waits for them.
func TestWaitedBehindOthersIsSummed(t *testing.T) {
	a1, a2, b := proc(1, 10, 0.3, 500*ms), proc(2, 10, 0.2, 400*ms), proc(3, 20, 0.5, 510*ms)
	a1.QueueNS, a2.QueueNS, b.QueueNS = 150*ms, 50*ms, 3*ms
	r := step([]meter.ContextStats{a1, a2, b}, nil)
	if w := input(t, r, "a", 0).Waited; math.Abs(w-0.2) > 1e-9 {
		t.Errorf("a waited %.3f of the window, want 0.2", w)
	}
	if w := input(t, r, "b", 0).Waited; math.Abs(w-0.003) > 1e-9 {
		t.Errorf("b waited %.3f of the window, want 0.003", w)
	}
}
