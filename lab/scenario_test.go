package lab

import (
	"math"
	"reflect"
	"slices"
	"testing"
	"time"
)

// A closed loop that takes 57% of a GPU alone, beside a hog limited to
// 25% and a light tenant: its max-min target is its 57%, which it cannot
// reach while the others hold theirs. Evaluate gives it its latency bound
// (57% × the 67% the others leave), and the scenario's only miss is then
// a loop held there; a loop given less than its bound, or any other miss
// beside it, is not excused.
func TestLatencyHeldLoops(t *testing.T) {
	sc := Scenario{Seed: 1, Duration: 8 * time.Second, Tenants: []ScenarioTenant{
		{Name: "loop", Weight: 500}, {Name: "hog", Weight: 500, Limit: 0.25}, {Name: "light", Weight: 500},
	}}
	run := func(loop, hog float64) []Sample {
		var ss []Sample
		for s := 1; s <= 8; s++ {
			ss = append(ss, Sample{At: time.Duration(s) * time.Second,
				True: map[string]float64{"loop": loop, "hog": hog, "light": 0.08}})
		}
		return ss
	}
	alone := run(0.57, 1)
	for _, tc := range []struct {
		name      string
		loop, hog float64
		held      bool
	}{
		{"held at its bound", 0.38, 0.25, true},
		{"below its bound", 0.30, 0.25, false},
		{"the hog over its limit too", 0.36, 0.30, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := sc.Evaluate(alone, run(tc.loop, tc.hog), run(0.2, 0.7), nil)
			if len(r.Segments) != 1 {
				t.Fatalf("%d segments, want 1", len(r.Segments))
			}
			i := slices.IndexFunc(r.Segments[0], func(x TenantResult) bool { return x.Name == "loop" })
			loop := r.Segments[0][i]
			if bound := 0.57 * (1 - tc.hog - 0.08); math.Abs(loop.LatencyBound-bound) > 1e-9 || loop.Alone != 0.57 {
				t.Errorf("alone %.3f, latency bound %.3f: want 0.570 and %.3f", loop.Alone, loop.LatencyBound, bound)
			}
			if loop.Target-loop.True <= 0.03 {
				t.Fatalf("the loop is %.1f pp short of its target: the case shows nothing", 100*(loop.Target-loop.True))
			}
			held := r.LatencyHeld(0.03)
			if got := slices.Equal(held, []string{"loop"}); got != tc.held {
				t.Errorf("latency held %v, want the loop: %v", held, tc.held)
			}
		})
	}
}

// With the demands under the probes (--probed-demand), the targets come
// from them and the errors against the demands without the probes come
// beside them: a loop that takes 80% alone and 72% under the probes,
// beside a hog, given 70% — 2 pp short of what it can take, 10 pp short of
// what it took before anyone watched.
func TestProbedDemand(t *testing.T) {
	sc := Scenario{Seed: 1, Duration: 8 * time.Second, Tenants: []ScenarioTenant{
		{Name: "loop", Weight: 503}, {Name: "hog", Weight: 26},
	}}
	run := func(loop, hog float64) []Sample {
		var ss []Sample
		for s := 1; s <= 8; s++ {
			ss = append(ss, Sample{At: time.Duration(s) * time.Second, True: map[string]float64{"loop": loop, "hog": hog}})
		}
		return ss
	}
	arb, free := run(0.70, 0.28), run(0.15, 0.85)
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	r := sc.Evaluate(run(0.72, 1), arb, free, run(0.80, 1))
	if !r.ProbedDemand() || len(r.Segments) != 1 {
		t.Fatalf("probed %v, %d segments: want probed, one segment", r.ProbedDemand(), len(r.Segments))
	}
	for _, x := range r.Segments[0] {
		want := map[string][4]float64{ // target, err, alone unprobed, err unprobed
			"loop": {0.72, 0.02, 0.80, 0.10},
			"hog":  {0.28, 0, 1, 0.08},
		}[x.Name]
		if !near(x.Target, want[0]) || !near(x.Err, want[1]) || !near(x.AloneUnprobed, want[2]) || !near(x.ErrUnprobed, want[3]) {
			t.Errorf("%s: target %.3f err %.3f alone unprobed %.3f err unprobed %.3f, want %.3f %.3f %.3f %.3f",
				x.Name, x.Target, x.Err, x.AloneUnprobed, x.ErrUnprobed, want[0], want[1], want[2], want[3])
		}
	}
	if !near(r.MaxError(true), 0.02) || !near(r.MaxErrorUnprobed(), 0.10) {
		t.Errorf("largest errors %.3f, %.3f without the probes: want 0.020, 0.100", r.MaxError(true), r.MaxErrorUnprobed())
	}
	if r := sc.Evaluate(run(0.80, 1), arb, free, nil); r.ProbedDemand() || r.MaxErrorUnprobed() != 0 || !near(r.MaxError(true), 0.10) {
		t.Errorf("without probed demands: probed %v, largest error %.3f (%.3f without the probes), want false, 0.100 (0)",
			r.ProbedDemand(), r.MaxError(true), r.MaxErrorUnprobed())
	}
}

// WithShapes adds the new shapes from the seed alone and leaves what
// DrawScenario drew as it was: over 200 seeds every shape comes up, each
// tenant's processes stay on the scenario's GPUs, and the same seed draws
// the same shapes.
func TestWithShapes(t *testing.T) {
	seen := map[string]int{}
	for seed := uint64(1); seed <= 200; seed++ {
		base := DrawScenario(seed)
		kept := DrawScenario(seed)
		sc := base.WithShapes()
		if !reflect.DeepEqual(base, kept) {
			t.Fatalf("seed %d: WithShapes changed the scenario it was given", seed)
		}
		if again := DrawScenario(seed).WithShapes(); !reflect.DeepEqual(sc, again) {
			t.Fatalf("seed %d: two draws differ:\n%s\n%s", seed, sc, again)
		}
		if sc.GPUs == 2 {
			seen["two GPUs"]++
		}
		if sc.Restart > 0 {
			if sc.Restart < 3*time.Second || sc.Restart > 8*time.Second {
				t.Errorf("seed %d: restart at %s, want 3–8 s", seed, sc.Restart)
			}
			seen[map[bool]string{false: "stopped", true: "killed"}[sc.RestartKilled]]++
		}
		refused := 0
		for i, tn := range sc.Tenants {
			b := base.Tenants[i]
			if tn.Name != b.Name || tn.Weight != b.Weight || !slices.Equal(tn.Args[:len(b.Args)], b.Args) {
				t.Fatalf("seed %d: tenant %s is not the one drawn: %v, was %v", seed, tn.Name, tn.Args, b.Args)
			}
			for _, g := range tn.GPUsOf() {
				if g < 0 || g >= sc.gpuCount() {
					t.Errorf("seed %d: tenant %s on GPU %d of %d", seed, tn.Name, g, sc.gpuCount())
				}
			}
			if len(tn.GPUsOf()) == 2 {
				seen["a process on two GPUs"]++
			}
			if slices.Contains(tn.Args, "--threads") {
				seen["a context per thread"]++
			}
			if tn.Refused {
				refused++
			}
		}
		switch refused {
		case 0:
		case len(sc.Tenants):
			seen["all refused"]++
		default:
			seen["some refused"]++
		}
	}
	for _, shape := range []string{"two GPUs", "stopped", "killed", "a process on two GPUs", "a context per thread", "all refused", "some refused"} {
		if seen[shape] < 5 {
			t.Errorf("%q in %d of 200 seeds, want at least 5", shape, seen[shape])
		}
	}
}

// On two GPUs each is scored apart: a process on both beside a different
// neighbour on each gets the weighted max-min share of each (a at 100
// beside b at 100 on GPU 0 and c at 300 on GPU 1: 50% and 25%), named
// a and a@1.
func TestEvaluateTwoGPUs(t *testing.T) {
	sc := Scenario{Seed: 1, Duration: 8 * time.Second, GPUs: 2, Tenants: []ScenarioTenant{
		{Name: "a", Weight: 100, Args: []string{"--threads", "2", "--spread", "2"}},
		{Name: "b", Weight: 100, Args: []string{"--gpu", "0"}},
		{Name: "c", Weight: 300, Args: []string{"--gpu", "1"}},
	}}
	run := func(shares map[string]float64) []Sample {
		var ss []Sample
		for s := 1; s <= 8; s++ {
			ss = append(ss, Sample{At: time.Duration(s) * time.Second, True: shares, Est: shares})
		}
		return ss
	}
	alone := run(map[string]float64{"a": 1, "a@1": 1, "b": 1, "c@1": 1})
	r := sc.Evaluate(alone, run(map[string]float64{"a": 0.5, "b": 0.5, "a@1": 0.3, "c@1": 0.7}),
		run(map[string]float64{"a": 0.5, "b": 0.5, "a@1": 0.5, "c@1": 0.5}), nil)
	if len(r.Segments) != 1 {
		t.Fatalf("%d segments, want 1", len(r.Segments))
	}
	want := map[string][2]float64{"a": {0.5, 0}, "b": {0.5, 0}, "a@1": {0.25, 0.05}, "c@1": {0.75, 0.05}}
	got := map[string][2]float64{}
	for _, tn := range r.Segments[0] {
		got[tn.Name] = [2]float64{tn.Target, tn.Err}
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || math.Abs(g[0]-w[0]) > 1e-9 || math.Abs(g[1]-w[1]) > 1e-9 {
			t.Errorf("%s: target and error %v, want %v (all: %v)", k, g, w, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("results for %v, want %v", got, want)
	}
	if e := r.MaxError(false); math.Abs(e-0.25) > 1e-9 {
		t.Errorf("largest error without gpuarb %.3f, want 0.250 (a@1 and c@1 at 50%%)", e)
	}
}

// A daemon restart is a boundary between segments, as an arrival is.
func TestRestartSplitsSegments(t *testing.T) {
	sc := Scenario{Seed: 1, Duration: 14 * time.Second, Restart: 6 * time.Second, Tenants: []ScenarioTenant{{Name: "a"}, {Name: "b"}}}
	segs := sc.Segments()
	if len(segs) != 2 || segs[0].From != 3*time.Second || segs[0].To != 6*time.Second || segs[1].From != 9*time.Second || segs[1].To != 14*time.Second {
		t.Errorf("segments %+v, want 3–6 s and 9–14 s", segs)
	}
}
