package arbiter

import (
	"fmt"
	"math"
	"testing"

	"github.com/gpuarb/gpuarb/policy"
)

// steered puts every GPU under its own scheduler, steered.
func steered(int) Actuation { return Scheduler }

// schedHog is a backlogged tenant of groups channel groups that fills any
// timeslice: its work waits whenever another holds the GPU.
func schedHog(name string, weight int, share float64, groups int) Input {
	in := hog(name, share, groups)
	in.Rules, in.Groups, in.Demand, in.Waited = rules(weight), groups, 1, 1-share
	return in
}

func decisionOf(t *testing.T, ds []Decision, name string) Decision {
	t.Helper()
	for _, d := range ds {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no decision for %s in %+v", name, ds)
	return Decision{}
}

// Backlogged tenants' timeslices are their targets split among their
// groups, averaging BaseSlice: the hardware's round robin then gives each
// its target whatever its number of processes.
func TestSlicesFollowTargets(t *testing.T) {
	a := New(Params{})
	ds := a.Step([]Input{schedHog("a", 100, 0.25, 4), schedHog("b", 300, 0.75, 1)}, steered)
	da, db := decisionOf(t, ds, "a"), decisionOf(t, ds, "b")
	if !da.Scheduled || math.Abs(da.Target-0.25) > 1e-9 || math.Abs(db.Target-0.75) > 1e-9 {
		t.Fatalf("decisions %+v", ds)
	}
	// a's four groups take a quarter of the rotation, b's one the rest:
	// 4·sa = sb/3, and the five average BaseSlice.
	sa, sb := float64(da.Timeslice), float64(db.Timeslice)
	if math.Abs(4*sa*3-sb) > 4e3 || math.Abs((4*sa+sb)/5-float64(BaseSlice)) > 4e3 {
		t.Errorf("timeslices a %v (×4), b %v: want a's four a third of b's one, averaging %v", da.Timeslice, db.Timeslice, BaseSlice)
	}
	if da.Duty != 1 || db.Duty != 1 {
		t.Errorf("duties %.2f %.2f: nothing to pause", da.Duty, db.Duty)
	}
}

// Each GPU's slices follow its own bounds (SetSlices): on one whose switch
// costs 250 µs (the real H200's, gpusched.Slices) equal hogs run at its
// base of 2048 µs, and a light weight's slice stops at its floor of
// 1024 µs where the simulated GPU's would go to 1/19 of the heavy one's.
func TestSlicesFollowTheGPU(t *testing.T) {
	a := New(Params{})
	h200 := Slices{Base: 2048 * Microsecond, Min: 1024 * Microsecond}
	a.SetSlices(1, h200)
	on := func(gpu int, in Input) Input { in.GPU = gpu; return in }
	ds := a.Step([]Input{on(0, schedHog("a", 100, 0.5, 1)), on(0, schedHog("b", 100, 0.5, 1)),
		on(1, schedHog("c", 100, 0.5, 1)), on(1, schedHog("d", 100, 0.5, 1))}, steered)
	for _, d := range ds {
		want := BaseSlice
		if d.GPU == 1 {
			want = h200.Base
		}
		if d.Timeslice != want {
			t.Errorf("%s on GPU %d: timeslice %v, want %v", d.Name, d.GPU, d.Timeslice, want)
		}
	}
	ds = a.Step([]Input{on(0, schedHog("a", 50, 0.5, 1)), on(0, schedHog("b", 950, 0.5, 1)),
		on(1, schedHog("c", 50, 0.5, 1)), on(1, schedHog("d", 950, 0.5, 1))}, steered)
	if da := decisionOf(t, ds, "a"); da.Timeslice < MinSlice || da.Timeslice > 2*MinSlice {
		t.Errorf("weight 50 of 1000 on the simulated GPU: timeslice %v, want about a 19th of the other's", da.Timeslice)
	}
	if dc := decisionOf(t, ds, "c"); dc.Timeslice != h200.Min {
		t.Errorf("weight 50 of 1000 on the H200: timeslice %v, want its floor %v", dc.Timeslice, h200.Min)
	}
	if got := a.SlicesOf(1); got != h200 {
		t.Errorf("SlicesOf(1) = %+v, want %+v", got, h200)
	}
	a.SetSlices(2, Slices{Base: 50 * Microsecond, Min: 200 * Microsecond})
	if got := a.SlicesOf(2); got.Base != 200*Microsecond || got.Min != 200*Microsecond {
		t.Errorf("a base below the floor: %+v, want both 200µs", got)
	}
}

// A closed loop brings only so much work to a turn: the others' slices
// shrink until its burst is its share of the rotation, and its own holds
// its burst with burstCover to spare, so that a longer burst is not cut.
func TestClosedLoopBurstShrinksTheRotation(t *testing.T) {
	a := New(Params{})
	loop := schedHog("loop", 100, 0.5, 1)
	loop.BurstNS = float64(200 * Microsecond)
	ds := a.Step([]Input{loop, schedHog("hog", 100, 0.5, 1)}, steered)
	dl, dh := decisionOf(t, ds, "loop"), decisionOf(t, ds, "hog")
	if dl.Timeslice != 250*Microsecond || dh.Timeslice != 200*Microsecond {
		t.Errorf("timeslices loop %v hog %v, want 250µs (the loop's burst, covered) and 200µs (equal weights)", dl.Timeslice, dh.Timeslice)
	}
	// A slice of a weight that nearly fits the burst holds it too.
	loop.BurstNS = float64(1100 * Microsecond)
	ds = New(Params{}).Step([]Input{loop, schedHog("hog", 100, 0.5, 1)}, steered)
	if dl, dh := decisionOf(t, ds, "loop"), decisionOf(t, ds, "hog"); dl.Timeslice != 1375*Microsecond || dh.Timeslice != BaseSlice {
		t.Errorf("burst of 1.1 ms: timeslices loop %v hog %v, want 1.375ms and %v", dl.Timeslice, dh.Timeslice, BaseSlice)
	}
	// A burst longer than the even split changes nothing.
	loop.BurstNS = float64(5 * Millisecond)
	ds = New(Params{}).Step([]Input{loop, schedHog("hog", 100, 0.5, 1)}, steered)
	if dl := decisionOf(t, ds, "loop"); dl.Timeslice != BaseSlice {
		t.Errorf("long burst: timeslice %v, want %v", dl.Timeslice, BaseSlice)
	}
}

// Slices stop at MinSlice: a tenant still above target there is paused
// part of each period, the run fraction falling at most maxRunStep per
// control window and growing back once it is below target.
func TestPausesWhereSlicesCannot(t *testing.T) {
	a := New(Params{})
	loop := schedHog("loop", 100, 0.2, 1)
	loop.BurstNS = float64(50 * Microsecond)
	in := []Input{loop, schedHog("hog", 100, 0.8, 1)}
	var last float64 = 1
	for i := 0; i < 3; i++ {
		dh := decisionOf(t, a.Step(in, steered), "hog")
		if dh.Timeslice != MinSlice {
			t.Fatalf("hog's timeslice %v, want MinSlice", dh.Timeslice)
		}
		if dh.Duty >= last || dh.Duty < last/math.Pow(maxRunStep, 1/3.0)-1e-9 {
			t.Errorf("period %d: hog's run fraction %.3f after %.3f, want it falling by at most maxRunStep per window", i, dh.Duty, last)
		}
		last = dh.Duty
	}
	setShare(&in[0], 0.6)
	setShare(&in[1], 0.4)
	dh := decisionOf(t, a.Step(in, steered), "hog")
	if dh.Duty <= last {
		t.Errorf("hog below target: run fraction %.3f, want above %.3f", dh.Duty, last)
	}
}

// A paused tenant within Tolerance of its target keeps converging on it
// while another still wants more, instead of growing back at once (which
// held the other below its target on average: issue 14's closed loops at
// 1:9; here 1:19); once the other is above its target it grows back at maxRunStep.
func TestPausedTenantConvergesWhileAnotherWants(t *testing.T) {
	a := New(Params{})
	in := []Input{schedHog("a", 100, 0.08, 4), schedHog("b", 1900, 0.92, 1)}
	var run float64
	for i := 0; i < 3; i++ {
		da := decisionOf(t, a.Step(in, steered), "a")
		if da.Timeslice != MinSlice {
			t.Fatalf("a's timeslice %v, want MinSlice", da.Timeslice)
		}
		run = da.Duty
	}
	if run >= 1 {
		t.Fatalf("a above target beside a deprived b: run fraction %.3f, want paused", run)
	}
	setShare(&in[0], 0.054)
	setShare(&in[1], 0.946)
	da := decisionOf(t, a.Step(in, steered), "a")
	if want := run * (1 + (0.05-0.054)/0.05/3); math.Abs(da.Duty-want) > 1e-9 {
		t.Errorf("a within Tolerance above target, b wanting: run fraction %.4f after %.4f, want %.4f (toward its target)", da.Duty, run, want)
	}
	run = da.Duty
	setShare(&in[0], 0.045)
	setShare(&in[1], 0.955)
	da = decisionOf(t, a.Step(in, steered), "a")
	if want := math.Min(1, run*math.Pow(maxRunStep, 1/3.0)); math.Abs(da.Duty-want) > 1e-9 {
		t.Errorf("b above its target: a's run fraction %.4f after %.4f, want %.4f (growing back)", da.Duty, run, want)
	}
}

// A tenant whose channel groups gpuarb does not know is paced at the
// launch gate, its rate falling toward its target while it keeps another
// from its share; the others stay steered, their slices in proportion to
// their weights without it in the rotation.
func TestUnsteeredTenantPacedBesideSteered(t *testing.T) {
	a := New(Params{})
	u := schedHog("u", 100, 0.5, 0)
	u.Unsteered = true
	in := []Input{u, schedHog("b", 100, 0.2, 1), schedHog("c", 200, 0.3, 1)}
	last := 1.0
	for i := 0; i < 6; i++ {
		ds := a.Step(in, steered)
		du, db, dc := decisionOf(t, ds, "u"), decisionOf(t, ds, "b"), decisionOf(t, ds, "c")
		if du.Scheduled || !du.Paced || du.Timeslice != 0 || du.Duty >= last {
			t.Fatalf("step %d: unsteered %+v, want paced at the launch gate below %.3f", i, du, last)
		}
		last = du.Duty
		// Twice at first, then moved by their feedback (both below
		// target, c further).
		if r := float64(dc.Timeslice) / float64(db.Timeslice); !db.Scheduled || !dc.Scheduled || i == 0 && (r < 1.9 || r > 2.2) {
			t.Fatalf("step %d: steered b %v c %v, want both scheduled, c's slice about twice b's", i, db.Timeslice, dc.Timeslice)
		}
	}
	if last > 0.5 {
		t.Errorf("after 6 steps the unsteered tenant's rate is %.2f, want it below its share 0.5", last)
	}
}

// A paced tenant whose window shares swing widely around their mean (a
// launch-gated queue drains in bursts) settles with its mean share on
// target, not its geometric mean: here the plant gives it twice its run
// fraction's share, in windows of 0.3x to 1.7x that, beside a tenant
// that wants the rest.
func TestPacedTenantsMeanShareSettlesOnTarget(t *testing.T) {
	a := New(Params{})
	u := schedHog("u", 100, 0.5, 0)
	u.Unsteered = true
	in := []Input{u, schedHog("b", 300, 0.5, 1)}
	swing := []float64{0.3, 1.7, 1.0, 0.6, 1.4}
	var sum float64
	const steps, settled = 900, 300
	for i := 0; i < steps; i++ {
		du := decisionOf(t, a.Step(in, steered), "u")
		share := math.Min(0.95, 0.5*du.Duty*swing[i%len(swing)])
		setShare(&in[0], share)
		setShare(&in[1], 1-share)
		if i >= settled {
			sum += share
		}
	}
	if mean := sum / (steps - settled); math.Abs(mean-0.25) > 0.005 {
		t.Errorf("paced tenant's mean share %.2f%% with swinging windows, want 25 ± 0.5 pp", 100*mean)
	}
}

// A limit pauses a tenant even alone on the GPU; no limit, alone, nothing.
func TestSchedulerLimit(t *testing.T) {
	a := New(Params{})
	lim := schedHog("lim", 100, 0.9, 1)
	lim.Rules.Limit = 0.3
	free := schedHog("free", 100, 1, 1)
	for i := 0; i < 5; i++ {
		a.Step([]Input{lim}, steered)
	}
	if d := decisionOf(t, a.Step([]Input{lim}, steered), "lim"); d.Duty >= 0.7 || d.Target != 0.3 {
		t.Errorf("limited tenant: duty %.2f target %.2f, want paused toward 0.3", d.Duty, d.Target)
	}
	if d := decisionOf(t, a.Step([]Input{free}, steered), "free"); d.Duty != 1 || d.Reason != "alone on the GPU" {
		t.Errorf("lone tenant: %+v", d)
	}
}

// A tenant wanting less than its fair share gets the largest weight: it is
// served at once and uses what it needs.
func TestLightServedFirst(t *testing.T) {
	light := schedHog("light", 100, 0.05, 1)
	light.Backlogged, light.Demand, light.SettledShare = false, 0.05, 0.05
	ds := New(Params{}).Step([]Input{light, schedHog("h1", 100, 0.5, 1), schedHog("h2", 300, 0.45, 1)}, steered)
	dl, dh := decisionOf(t, ds, "light"), decisionOf(t, ds, "h2")
	if dl.Weight != dh.Weight || dl.Reason != "light: served first" {
		t.Errorf("light tenant weight %.3f (%s), want the largest, %.3f", dl.Weight, dl.Reason, dh.Weight)
	}
}

// A host of light tenants, each bringing one short burst to its turn,
// does not shrink the hogs' slices with their number: the rotation counts
// the time they take (their demand), not slices they would never use, so the
// slices stay put as the number of busy lights changes from step to step
// (with 1000 tenants they moved by a third each step, each move a control
// per group).
func TestManyLightTenantsLeaveTheSlicesAlone(t *testing.T) {
	slice := func(lights int) Nanoseconds {
		in := []Input{schedHog("h1", 100, 0.35, 1), schedHog("h2", 100, 0.35, 1)}
		for i := 0; i < lights; i++ {
			l := schedHog(fmt.Sprintf("l%d", i), 100, 0.0003, 1)
			l.Backlogged, l.Demand, l.SettledShare = false, 0.0003, 0.0003
			l.BurstNS = float64(270 * Microsecond)
			in = append(in, l)
		}
		ds := New(Params{}).Step(in, steered)
		if d := decisionOf(t, ds, "l0"); lights > 0 && d.Reason != "light: served first" {
			t.Fatalf("light tenant: %s", d.Reason)
		}
		return decisionOf(t, ds, "h1").Timeslice
	}
	few, many, more := slice(10), slice(330), slice(370)
	near := func(a, b Nanoseconds) bool { return math.Abs(float64(a-b)) <= 0.01*float64(b) }
	if !near(few, BaseSlice) || !near(many, BaseSlice) || !near(more, BaseSlice) {
		t.Errorf("hog's slice beside 10, 330 and 370 busy light tenants: %v, %v, %v; want the same, near %v", few, many, more, BaseSlice)
	}
}

// Feedback corrects what the model misses, bounded by maxFeedback.
func TestFeedbackBounded(t *testing.T) {
	a := New(Params{})
	in := []Input{schedHog("a", 100, 0.1, 1), schedHog("b", 100, 0.9, 1)}
	for i := 0; i < 200; i++ {
		a.Step(in, steered)
	}
	ds := a.Step(in, steered)
	da, db := decisionOf(t, ds, "a"), decisionOf(t, ds, "b")
	if r := da.Weight / db.Weight; math.Abs(r-maxFeedback*maxFeedback) > 1e-6 {
		t.Errorf("weights a %.3f b %.3f: ratio %.2f, want the bound %.0f", da.Weight, db.Weight, r, maxFeedback*maxFeedback)
	}
	if db.Duty >= 1 {
		t.Errorf("b above target with its feedback at the floor: duty %.2f, want paused", db.Duty)
	}
}

// While a latency tenant has work the others' weights are tiny against
// its; a missed SLO pauses batch tenants first.
func TestSchedulerLatency(t *testing.T) {
	a := New(Params{})
	lat := schedHog("lat", 100, 0.2, 1)
	lat.Rules.Priority = policy.Latency
	lat.Rules.SLO = policy.SLO{P99SyncMS: 5}
	lat.SyncP99MS = 20
	batch, normal := schedHog("batch", 100, 0.4, 1), schedHog("normal", 100, 0.37, 1) // on target
	batch.Rules.Priority = policy.Batch
	ds := a.Step([]Input{lat, batch, normal}, steered)
	dl, db, dn := decisionOf(t, ds, "lat"), decisionOf(t, ds, "batch"), decisionOf(t, ds, "normal")
	if !dl.SLOMissed || dl.Weight < 1000*db.Weight || dl.Duty != 1 {
		t.Errorf("latency tenant %+v beside batch %+v", dl, db)
	}
	if db.Duty >= 1 || dn.Duty != 1 {
		t.Errorf("missed SLO: batch duty %.2f, normal %.2f; want batch paused first", db.Duty, dn.Duty)
	}
}

// A light closed loop waits through the others' rotation for each turn:
// their slices shrink until that wait costs it no more than Tolerance of
// what it takes alone.
func TestLightClosedLoopWaitsLittle(t *testing.T) {
	light := schedHog("light", 900, 0.163, 1)
	light.Backlogged, light.Demand, light.SettledShare = false, 0.163, 0.163
	light.BurstNS = float64(Millisecond)
	hog := schedHog("hog", 100, 0.837, 1)
	ds := New(Params{}).Step([]Input{light, hog}, steered)
	want := 1e6 * 0.01 / (0.163 * 0.153) // ns: 401 µs
	if dh := decisionOf(t, ds, "hog"); math.Abs(float64(dh.Timeslice)-want) > 1e3 {
		t.Errorf("hog's timeslice %v beside a light loop of 1 ms bursts at 16.3%%, want %v", dh.Timeslice, Nanoseconds(want))
	}
}

// A light loop's bound on the others' rotation stretches for a closed
// loop with host time between its bursts that falls short: not within
// Tolerance, twice at twice Tolerance, and not for a hog that falls as
// short. The bound sets the slices' scale, a slice per unit of weight
// (seed 37's loop was held to 355 µs slices by it).
func TestLightWaitStretchesForAShortLoop(t *testing.T) {
	scale := func(demand, short float64) float64 {
		light := schedHog("light", 358, 0.25, 1)
		light.Backlogged, light.Demand, light.SettledShare = false, 0.25, 0.25
		light.BurstNS = float64(12400 * Microsecond)
		loop := schedHog("loop", 300, 0.3, 1)
		loop.Backlogged, loop.Demand = false, demand
		loop.BurstNS = float64(19600 * Microsecond)
		in := []Input{light, loop, schedHog("h1", 400, 0.4, 4), schedHog("h2", 9, 0.05, 4)}
		target := decisionOf(t, New(Params{}).Step(in, steered), "loop").Target
		setShare(&in[1], target-short)
		ds := New(Params{}).Step(in, steered)
		if d := decisionOf(t, ds, "light"); d.Reason != "light: served first" {
			t.Fatalf("light tenant: %s", d.Reason)
		}
		d := decisionOf(t, ds, "loop")
		return float64(d.Timeslice) / d.Weight
	}
	on, within, far, hog := scale(0.62, 0), scale(0.62, 0.008), scale(0.62, 0.03), scale(1, 0.03)
	near := func(r, want float64) bool { return math.Abs(r-want) < 0.01*want }
	if !near(within/on, 1) || !near(hog/on, 1) {
		t.Errorf("slice per weight %.0f ns on target, %.0f 0.8 pp short, %.0f for a hog 3 pp short; want the same", on, within, hog)
	}
	// The short loop's own feedback moves its weight a little too.
	if math.Abs(far/on-maxWaitRelax) > 0.05 {
		t.Errorf("slice per weight %.0f ns 3 pp short, %.0f on target: ratio %.2f, want %d", far, on, far/on, maxWaitRelax)
	}
}

// A light closed loop's slice covers its burst: cut by its slice, a burst
// would wait through the others' rotation once per slice, not once per
// burst. The slice is rounded up to BaseSlice times a power of two, and
// bounded by MaxSlice (the 12.6 ms burst is seed 37's, which read 41% for
// a demand of 51% in 1 ms slices).
func TestLightSliceCoversItsBurst(t *testing.T) {
	for _, c := range []struct {
		burst, want Nanoseconds
	}{
		{500 * Microsecond, BaseSlice},
		{12600 * Microsecond, 16 * BaseSlice},
		{14 * Millisecond, 32 * BaseSlice}, // 1.25 × 14 ms > 16 × 1024 µs
		{200 * Millisecond, MaxSlice},
	} {
		light := schedHog("light", 358, 0.41, 1)
		light.Backlogged, light.Demand, light.SettledShare = false, 0.5, 0.41
		light.BurstNS = float64(c.burst)
		in := []Input{light, schedHog("h1", 49, 0.12, 4), schedHog("h2", 9, 0.02, 1)}
		ds := New(Params{}).Step(in, steered)
		d := decisionOf(t, ds, "light")
		if d.Reason != "light: served first" {
			t.Fatalf("burst %v: light tenant: %s", c.burst, d.Reason)
		}
		if d.Timeslice != c.want {
			t.Errorf("burst %v: slice %v, want %v", c.burst, d.Timeslice, c.want)
		}
	}
}

// A light closed loop below its target that hardly ever waits for the
// others' turns is held back by its own pace — its demand read high by the
// host time in its syncs — and takes nothing from them: pausing them would
// only idle the GPU. The same loop waiting behind their turns for 20% of
// the window is deprived: the one at MinSlice is paused, the other's slice
// loopBesideHogs steps, three periods, a loop of weight 1700 at 50% of
// the GPU beside hogs of weights 300 and 100 (37% and 13%), and returns
// the hogs' decisions.
func loopBesideHogs(t *testing.T, backlogged bool, demand, waited float64, burst Nanoseconds) (h1, h2 Decision) {
	t.Helper()
	a := New(Params{})
	loop := schedHog("loop", 1700, 0.5, 1)
	loop.Backlogged, loop.Demand, loop.Waited = backlogged, demand, waited
	loop.BurstNS = float64(burst)
	in := []Input{loop, schedHog("h1", 300, 0.37, 1), schedHog("h2", 100, 0.13, 1)}
	var ds []Decision
	for range 3 {
		ds = a.Step(in, steered)
	}
	return decisionOf(t, ds, "h1"), decisionOf(t, ds, "h2")
}

// shrinks.
func TestOwnPaceIsNotDeprivation(t *testing.T) {
	for _, c := range []struct {
		waited float64
		held   bool
	}{{0.003, false}, {0.2, true}} {
		h1, h2 := loopBesideHogs(t, false, 0.57, c.waited, 8*Millisecond)
		if (h2.Duty < 1) != c.held || (h1.Reason == "above target: takes the slack") == c.held {
			t.Errorf("loop waiting %.1f%% of the window: h1 %s, h2 run fraction %.2f (%s); want them held back %v",
				100*c.waited, h1.Reason, h2.Duty, h2.Reason, c.held)
		}
	}
}

// A phased loop in its phase of long bursts queues deep (Backlogged) while
// its demand over the settled window still averages in its phase of short
// bursts and reads no more than it gets: its queue says it wants more, so
// below its target and waiting it is deprived and the others above theirs
// give way, where its settled demand alone let them take its share.
func TestBackloggedPhaseWantsMore(t *testing.T) {
	for _, backlogged := range []bool{false, true} {
		h1, h2 := loopBesideHogs(t, backlogged, 0.5, 0.2, 60*Millisecond)
		if held := h2.Duty < 1 && h1.Reason == "above target"; held != backlogged {
			t.Errorf("loop backlogged %v at 50%% for a settled demand of 50%%: h1 %s, h2 run fraction %.2f (%s); want them held back %v",
				backlogged, h1.Reason, h2.Duty, h2.Reason, backlogged)
		}
	}
}

// A feedback that moves no slice stays: in a phase of short bursts a
// loop's slice holds its burst and the hogs' slices sit at MinSlice, so
// neither the loop's weight rising nor the hogs' falling would change a
// turn (pauses hold the hogs back). When the loop's phase of long bursts
// comes, the slices follow the targets from the first step, where wound-up
// feedbacks (the loop's at maxFeedback, the hogs' at 1/maxFeedback) gave
// the loop four times its weight for seconds (fuzz seed 47).
func TestFeedbackDoesNotWindUpAcrossPhases(t *testing.T) {
	a := New(Params{})
	loop := schedHog("loop", 100, 0.2, 1)
	// Equal weights give the hogs the loop's burst as slices at first:
	// 10% above MinSlice, all that feedback can take from them.
	loop.BurstNS = float64(110 * Microsecond)
	in := []Input{loop, schedHog("h1", 100, 0.4, 1), schedHog("h2", 100, 0.4, 1)}
	var ds []Decision
	for i := 0; i < 60; i++ {
		ds = a.Step(in, steered)
	}
	dl, dh := decisionOf(t, ds, "loop"), decisionOf(t, ds, "h1")
	if dh.Timeslice != MinSlice || dh.Duty >= 1 || dl.Reason != "below target" {
		t.Fatalf("short phase: loop %+v, h1 %+v; want h1 at MinSlice and paused, the loop below target", dl, dh)
	}
	if r := dl.Weight / dh.Weight; r > 1.2 {
		t.Errorf("short phase: weights loop %.3f h1 %.3f, want within 20%% of each other (no slice moves with them)", dl.Weight, dh.Weight)
	}
	in[0].BurstNS = 0 // its phase of long kernels: it never runs out of work
	for i := range in {
		setShare(&in[i], 1/3.0)
	}
	ds = a.Step(in, steered)
	dl, dh = decisionOf(t, ds, "loop"), decisionOf(t, ds, "h1")
	if r := float64(dl.Timeslice) / float64(dh.Timeslice); r > 1.2 {
		t.Errorf("long phase, first step: timeslices loop %v h1 %v, want equal weights' slices within 20%%", dl.Timeslice, dh.Timeslice)
	}
}

// hogPausedForLoop steps a hog beside a deprived closed loop of 50 µs
// bursts (targets 50% each) for periods periods, and returns the arbiter,
// the inputs and the hog's run fraction, which must be paused by then.
func hogPausedForLoop(t *testing.T, periods int) (*Arbiter, []Input, float64) {
	t.Helper()
	a := New(Params{})
	loop := schedHog("loop", 100, 0.2, 1)
	loop.BurstNS = float64(50 * Microsecond)
	in := []Input{loop, schedHog("hog", 100, 0.8, 1)}
	var paused float64
	for i := 0; i < periods; i++ {
		paused = decisionOf(t, a.Step(in, steered), "hog").Duty
	}
	if paused >= 1 {
		t.Fatalf("hog's run fraction %.2f beside a deprived loop, want paused", paused)
	}
	return a, in, paused
}

// A paused tenant below its target resumes at once where the pauses only
// waste the GPU: it idles more than idleSlack of the window and every busy
// tenant is below its target (the tenant it was paused for gone). Where
// the GPU is busy, or a closed loop at its target idles it by its own
// gaps, it grows back at maxRunStep.
func TestPausedResumesAtOnceWhereTheGPUIdles(t *testing.T) {
	for _, c := range []struct {
		share, loop float64 // the hog's share, the loop's (0: gone)
		once        bool
	}{{0.5, 0, true}, {0.9, 0, false}, {0.3, 0.5, false}} {
		a, in, paused := hogPausedForLoop(t, 3)
		if c.loop == 0 {
			in[0].Busy, in[0].Backlogged = false, false
		}
		setShare(&in[0], c.loop)
		setShare(&in[1], c.share)
		dh := decisionOf(t, a.Step(in, steered), "hog")
		if once := dh.Duty == 1; once != c.once || dh.Duty <= paused {
			t.Errorf("hog at %.0f%%, loop at %.0f%%: run fraction %.3f after %.3f (%s), want back at once %v, else growing",
				100*c.share, 100*c.loop, dh.Duty, paused, dh.Reason, c.once)
		}
	}
}

// A tenant alone held at its limit that dips below it while the GPU idles
// grows back at maxRunStep, not at once: its pause is its limit.
func TestLimitedTenantDoesNotResumeAtOnce(t *testing.T) {
	a := New(Params{})
	hog := schedHog("hog", 100, 0.8, 1)
	hog.Rules.Limit = 0.4
	in := []Input{hog}
	var paused float64
	for i := 0; i < 6; i++ {
		paused = decisionOf(t, a.Step(in, steered), "hog").Duty
	}
	if paused >= 1 {
		t.Fatalf("hog at 80%% for a limit of 40%%: run fraction %.2f, want paused", paused)
	}
	setShare(&in[0], 0.35)
	dh := decisionOf(t, a.Step(in, steered), "hog")
	if dh.Duty >= 1 || dh.Duty <= paused {
		t.Errorf("hog at 35%% for a limit of 40%%, the GPU 65%% idle: run fraction %.3f after %.3f (%s), want growing, not back at once",
			dh.Duty, paused, dh.Reason)
	}
}

// A closed loop deprived while every other tenant holds its target (the
// GPU idles in the loop's host time) shares its shortfall: the others,
// their slices at the floor, pause toward their targets less the part of
// it beyond Tolerance. Where a tenant above its target can give the
// shortfall back, only that one pauses.
func TestShortfallShared(t *testing.T) {
	for _, c := range []struct {
		b, c      float64 // the hogs' shares beside the loop's 0.23
		bPaused   bool
		bRunBelow float64 // b's run fraction after three windows is below this
	}{{0.33, 0.33, true, 0.9}, {0.33, 0.43, false, 0}} {
		a := New(Params{})
		loop := schedHog("loop", 100, 0.23, 1)
		loop.BurstNS = float64(50 * Microsecond)
		in := []Input{loop, schedHog("b", 100, c.b, 1), schedHog("c", 100, c.c, 1)}
		var db, dc Decision
		for i := 0; i < 3; i++ {
			ds := a.Step(in, steered)
			db, dc = decisionOf(t, ds, "b"), decisionOf(t, ds, "c")
		}
		if db.Timeslice != MinSlice {
			t.Fatalf("b's timeslice %v, want MinSlice", db.Timeslice)
		}
		if paused := db.Duty < 1; paused != c.bPaused || paused && db.Duty >= c.bRunBelow {
			t.Errorf("loop at 23%%, b at %.0f%%, c at %.0f%% (targets 33%%): b's run fraction %.3f (%s), want paused %v (below %.2f)",
				100*c.b, 100*c.c, db.Duty, db.Reason, c.bPaused, c.bRunBelow)
		}
		if dc.Duty >= 1 {
			t.Errorf("loop at 23%%, c at %.0f%%: c's run fraction %.3f, want paused", 100*c.c, dc.Duty)
		}
	}
}

// A tenant paused for a deprived loop resumes at once when a tenant that
// is not paused takes more than overrunMargin above its target — the loop
// itself in its phase of long bursts, or another — and its own slice is
// above the GPU's floor again: the pause then only feeds the other's
// excess. Within the margin it keeps converging (a loop served by the
// pauses overshoots its target by a little and must not lose them), and so
// does one whose slice is still at the floor: its pause is what holds it
// to its target.
func TestPausesReleasedWhileAnotherOverruns(t *testing.T) {
	for _, c := range []struct {
		loop, hog float64     // their shares after the pauses (targets 50% each)
		burst     Nanoseconds // the loop's burst after the pauses
		once      bool
	}{
		{0.60, 0.38, 50 * Millisecond, true},
		{0.56, 0.42, 50 * Millisecond, true},
		{0.52, 0.40, 50 * Millisecond, false},
		{0.60, 0.38, 50 * Microsecond, false},
	} {
		a, in, paused := hogPausedForLoop(t, 3)
		in[0].BurstNS = float64(c.burst)
		setShare(&in[0], c.loop)
		setShare(&in[1], c.hog)
		dh := decisionOf(t, a.Step(in, steered), "hog")
		if once := dh.Duty == 1; once != c.once || dh.Duty <= paused {
			t.Errorf("loop at %.0f%% (bursts of %v), hog at %.0f%% (slice %v): hog's run fraction %.3f after %.3f (%s), want back at once %v, else growing",
				100*c.loop, c.burst, 100*c.hog, dh.Timeslice, dh.Duty, paused, dh.Reason, c.once)
		}
	}
}

// A released pause is remembered: called to yield again within
// pauseMemory windows (the loop's next phase of short bursts), the tenant
// pauses at once as deeply as before its release; after them, it pauses
// from its full run fraction down, at most maxRunStep per window.
func TestReleasedPauseRemembered(t *testing.T) {
	for _, c := range []struct {
		between  int // periods of the long phase before the short one returns
		remember bool
	}{{6, true}, {pauseMemory*3 + 1, false}} {
		a, in, paused := hogPausedForLoop(t, 6)
		short := in[0].BurstNS
		in[0].BurstNS = float64(50 * Millisecond)
		setShare(&in[0], 0.6)
		setShare(&in[1], 0.4)
		for i := 0; i < c.between; i++ {
			if d := decisionOf(t, a.Step(in, steered), "hog"); d.Duty != 1 {
				t.Fatalf("period %d of the long phase: hog's run fraction %.3f (%s), want released", i, d.Duty, d.Reason)
			}
		}
		in[0].BurstNS = short
		setShare(&in[0], 0.2)
		setShare(&in[1], 0.8)
		d := decisionOf(t, a.Step(in, steered), "hog")
		if got := d.Duty == paused; got != c.remember || !c.remember && d.Duty < 1/math.Pow(maxRunStep, 1/3.0)-1e-9 {
			t.Errorf("short phase again after %d periods: hog's run fraction %.3f (%s), paused at %.3f before; want back there at once %v, else from 1 down by at most maxRunStep per window",
				c.between, d.Duty, d.Reason, paused, c.remember)
		}
	}
}
