package arbiter

import (
	"fmt"
	"math"
	"testing"

	"github.com/gpuarb/gpuarb/policy"
)

func rules(w int) policy.Rules {
	return policy.Rules{Weight: policy.Weight(w), Priority: policy.Normal}
}

// pacing puts every GPU in pacing (share mode without the GPU's scheduler).
func pacing(int) Actuation { return Pacing }

func TestTargets(t *testing.T) {
	full := func(Input) float64 { return 0.5 } // paced
	for _, tc := range []struct {
		name string
		in   []Input
		want []float64
	}{
		{"equal", []Input{{Name: "a", Rules: rules(100), Busy: true}, {Name: "b", Rules: rules(100), Busy: true}}, []float64{0.5, 0.5}},
		{"1:3", []Input{{Name: "a", Rules: rules(100), Busy: true}, {Name: "b", Rules: rules(300), Busy: true}}, []float64{0.25, 0.75}},
		{"idle gets nothing", []Input{{Name: "a", Rules: rules(100), Busy: true}, {Name: "b", Rules: rules(100)}}, []float64{1, 0}},
		{"limit caps, rest to the other", []Input{
			{Name: "a", Rules: policy.Rules{Weight: 900, Priority: policy.Normal, Limit: 0.3}, Busy: true},
			{Name: "b", Rules: rules(100), Busy: true}}, []float64{0.3, 0.7}},
		{"lone tenant with a limit", []Input{{Name: "a", Rules: policy.Rules{Weight: 100, Limit: 0.3}, Busy: true}}, []float64{0.3}},
	} {
		for i := range tc.in {
			tc.in[i].Held = tc.in[i].Busy // held at its rate: it wants the GPU
		}
		got := Targets(tc.in, full)
		for i := range got {
			if math.Abs(got[i]-tc.want[i]) > 1e-9 {
				t.Errorf("%s: targets %v, want %v", tc.name, got, tc.want)
				break
			}
		}
	}
	// An unthrottled tenant using little leaves the rest (work
	// conservation); what it used over the settled window counts, not a
	// burst.
	in := []Input{{Name: "small", Rules: rules(100), Busy: true, Share: 0.3, SettledShare: 0.1}, {Name: "hog", Rules: rules(100), Busy: true, Share: 0.9, SettledShare: 0.9}}
	got := Targets(in, func(Input) float64 { return 1 })
	if math.Abs(got[0]-(0.1+lightHeadroom)) > 1e-9 || math.Abs(got[1]-(0.9-lightHeadroom)) > 1e-9 {
		t.Errorf("work conservation: %v", got)
	}
}

// hog is a backlogged tenant with learned costs using share of the GPU.
func hog(name string, share float64, contexts int) Input {
	return Input{Name: name, Rules: rules(100), Busy: true, Backlogged: true, Costed: true,
		Share: share, SettledShare: share, Contexts: contexts}
}

// setShare sets both measured shares of a tenant.
func setShare(in *Input, share float64) { in.Share, in.SettledShare = share, share }

func TestAIMD(t *testing.T) {
	a := New(Params{Settle: 3})
	// Two backlogged tenants, equal weights: the one with more processes
	// is paced; the other takes the slack. With 1.2 windows of work queued
	// from before, it admits nothing new until that has run.
	in := []Input{hog("a", 0.8, 4), hog("b", 0.2, 1)}
	in[0].Queued = 1.2
	ds := a.Step(in, pacing)
	if ds[0].Duty != 0.05 || ds[0].Reason != "draining its queue" || !ds[0].Paced || ds[1].Duty != 1 || ds[1].Reason != "takes the slack" {
		t.Fatalf("%+v", ds)
	}
	// Drained: paced at its target, and held there while the settled
	// window still shows the drain (Settle periods)...
	in[0].Queued = 0.05
	setShare(&in[0], 0.55)
	setShare(&in[1], 0.45)
	if ds = a.Step(in, pacing); ds[0].Duty != 0.5 || ds[0].Reason != "paced at target" {
		t.Fatalf("drained: %+v", ds[0])
	}
	for i := 0; i < 2; i++ {
		if ds = a.Step(in, pacing); ds[0].Duty != 0.5 || ds[0].Reason != "settling" {
			t.Fatalf("settling period %d: %+v", i, ds[0])
		}
	}
	// ...then a multiplicative decrease by what the excess needs, at most
	// ×0.8, from the settled share, spread over the 3 periods it spans.
	in[0].Share = 0.9 // the short window is not what steers it
	ds = a.Step(in, pacing)
	if want := 0.5 * math.Pow(0.5/0.55, 1.0/3); math.Abs(ds[0].Duty-want) > 1e-9 || ds[0].Reason != "above target" {
		t.Errorf("decrease: %+v, want duty %.4f", ds[0], want)
	}
	// Never below half the target.
	setShare(&in[0], 0.9)
	for i := 0; i < 20; i++ {
		ds = a.Step(in, pacing)
	}
	if ds[0].Duty != 0.25 {
		t.Errorf("rate floor %v, want half the target", ds[0].Duty)
	}
	// Below target: additive increase by the gap, at most Increase.
	setShare(&in[0], 0.47)
	setShare(&in[1], 0.53)
	ds = a.Step(in, pacing)
	if math.Abs(ds[0].Duty-0.26) > 1e-9 || ds[0].Reason != "below target" {
		t.Errorf("increase: %+v", ds[0])
	}
	setShare(&in[0], 0.3)
	ds = a.Step(in, pacing)
	if want := 0.26 + 0.05/3; math.Abs(ds[0].Duty-want) > 1e-9 {
		t.Errorf("increase capped at 0.05 a window: %+v, want %.4f", ds[0], want)
	}
	// The slack taker keeps running free while the paced tenant's own
	// rate keeps it below target...
	if ds[1].Duty != 1 {
		t.Errorf("slack taker paced: %+v", ds[1])
	}
	// ...and is paced too once that tenant is crowded out: what it is
	// admitted piles up unserved.
	setShare(&in[1], 0.7)
	in[0].Queued = 0.6
	ds = a.Step(in, pacing)
	if ds[1].Duty != 0.5 || ds[1].Reason != "paced at target" {
		t.Errorf("crowding slack taker: %+v", ds[1])
	}
	// Alone: full duty at once.
	in[1].Busy, in[0].Queued = false, 0
	ds = a.Step(in, pacing)
	if ds[0].Duty != 1 || ds[1].Duty != 1 || ds[1].Reason != "idle" || ds[0].Reason != "alone on the GPU" {
		t.Errorf("alone: %+v", ds)
	}
	// A limit applies even alone, and a limited tenant never takes the slack.
	in[0].Rules.Limit = 0.3
	setShare(&in[0], 0.9)
	ds = a.Step(in, pacing)
	if ds[0].Duty != 0.3 || ds[0].Target != 0.3 || ds[0].Reason != "paced at target" {
		t.Errorf("limit alone: %+v", ds[0])
	}
	in[1].Busy = true
	ds = a.Step(in, pacing)
	if ds[0].Duty >= 1 || ds[1].Duty != 1 {
		t.Errorf("limit beside another: %+v", ds)
	}
}

// A tenant whose costs the meter has not learned is never paced on a
// guess: it takes the slack, whatever the tie-breaks say.
func TestUncostedTakesTheSlack(t *testing.T) {
	in := []Input{hog("learned", 0.5, 1), hog("new", 0.5, 4)}
	in[1].Costed = false
	ds := New(Params{}).Step(in, pacing)
	if ds[0].Duty != 0.5 || ds[1].Duty != 1 || ds[1].Reason != "takes the slack" {
		t.Errorf("%+v", ds)
	}
}

// A tenant with unprobed processes never takes the slack, uncosted as it
// is: its share is an assumption and its duty what holds it.
func TestUnprobedNeverTakesTheSlack(t *testing.T) {
	in := []Input{hog("plain", 0.5, 1), hog("unprobed", 0.5, 1)}
	in[1].Costed, in[1].Unprobed = false, true
	ds := New(Params{}).Step(in, pacing)
	if ds[0].Duty != 1 || ds[0].Reason != "takes the slack" || ds[1].Duty != 0.5 {
		t.Errorf("%+v", ds)
	}
}

// A tenant that wants less than its target is not paced.
func TestNotCompeting(t *testing.T) {
	a := New(Params{})
	in := []Input{hog("hog", 0.8, 1), hog("light", 0.2, 1)}
	in[1].Backlogged, in[1].Demand = false, 0.21
	ds := a.Step(in, pacing)
	// light wants what it would take alone and the headroom; hog gets the
	// rest and takes the slack.
	if math.Abs(ds[1].Target-(0.21+lightHeadroom)) > 1e-9 || ds[1].Duty != 1 || ds[0].Duty != 1 || ds[0].Reason != "takes the slack" {
		t.Fatalf("%+v", ds)
	}
}

func TestLatencySLO(t *testing.T) {
	a := New(Params{})
	lat := policy.Rules{Weight: 100, Priority: policy.Latency, SLO: policy.SLO{P99SyncMS: 10}}
	in := []Input{hog("hog", 0.45, 1), {Name: "infer", Rules: lat, Busy: true, Costed: true, Share: 0.1, SettledShare: 0.1, SyncP99MS: 30}, hog("hog2", 0.45, 1)}
	ds := a.Step(in, pacing) // sorted by name: hog, hog2, infer
	if ds[2].Duty != 1 || !ds[2].SLOMissed {
		t.Errorf("latency tenant %+v", ds[2])
	}
	if math.Abs(ds[0].Duty-0.36) > 1e-9 || math.Abs(ds[1].Duty-0.36) > 1e-9 || ds[0].Reason != "a latency SLO is missed" {
		t.Errorf("others while the SLO is missed: %+v %+v", ds[0], ds[1])
	}
	// Held again: the others recover additively, by Increase per settled
	// window (Settle 10 periods), to their targets (43%).
	in[1].SyncP99MS = 5
	setShare(&in[0], 0.4)
	setShare(&in[2], 0.4)
	ds = a.Step(in, pacing)
	if ds[2].SLOMissed || math.Abs(ds[0].Duty-0.365) > 1e-9 || ds[0].Reason != "recovering" || math.Abs(ds[1].Duty-0.365) > 1e-9 {
		t.Errorf("after the SLO holds: %+v", ds)
	}
	for i := 0; i < 20; i++ {
		ds = a.Step(in, pacing)
	}
	if math.Abs(ds[1].Duty-0.43) > 1e-9 {
		t.Errorf("recovery capped at the target: %+v", ds[1])
	}
}

func TestTimeslice(t *testing.T) {
	a := New(Params{})
	in := []Input{{Name: "a", Rules: rules(100), Busy: true}, {Name: "b", Rules: rules(300), Busy: true}, {Name: "c", Rules: rules(100)}}
	ds := a.Step(in, func(int) Actuation { return Windows })
	if ds[0].Duty != 0.25 || ds[0].Offset != 0 || ds[1].Duty != 0.75 || ds[1].Offset != 0.25 || ds[2].Duty != 1 {
		t.Errorf("%+v", ds)
	}
}

// A paced tenant left alone to compete takes the slack at once; only one
// a latency SLO pushed down recovers step by step.
func TestSlackTakerNotPressed(t *testing.T) {
	a := New(Params{})
	in := []Input{hog("a", 0.2, 1), hog("b", 0.8, 1)}
	in[0].Rules.Weight, in[1].Rules.Weight = 100, 300
	ds := a.Step(in, pacing) // b takes the slack, a is paced at 25%
	if ds[0].Duty != 0.25 || ds[1].Duty != 1 {
		t.Fatalf("%+v", ds)
	}
	lat := policy.Rules{Weight: 100, Priority: policy.Latency}
	in[1] = Input{Name: "b", Rules: lat, Busy: true, Costed: true, Share: 0.2, SettledShare: 0.2}
	ds = a.Step(in, pacing)
	if ds[0].Duty != 1 || ds[0].Reason != "takes the slack" {
		t.Errorf("a, no longer paced against anyone: %+v", ds[0])
	}
}

// Between equals the slack taker stays put: launch costs that swap which
// of two hogs has the shorter launches do not swap which one is paced.
func TestStickySlackTaker(t *testing.T) {
	a := New(Params{})
	in := []Input{hog("a", 0.5, 1), hog("b", 0.5, 1)}
	in[0].LaunchNS, in[1].LaunchNS = 20e6, 21e6
	free := func(ds []Decision) string {
		for _, d := range ds {
			if d.Reason == "takes the slack" {
				return d.Name
			}
		}
		return ""
	}
	if got := free(a.Step(in, pacing)); got != "a" {
		t.Fatalf("first taker %q, want a (shorter launches)", got)
	}
	for i := 0; i < 20; i++ {
		in[0].LaunchNS, in[1].LaunchNS = in[1].LaunchNS, in[0].LaunchNS
		if got := free(a.Step(in, pacing)); got != "a" {
			t.Fatalf("period %d: taker %q, want a to stay", i, got)
		}
	}
	// A taker with more contexts than an equal does not stay: it would
	// take that many turns to the paced one's one.
	in[0].Contexts, in[1].Contexts = 4, 1
	if got := free(a.Step(in, pacing)); got != "b" {
		t.Fatalf("taker %q of 4 contexts beside an equal of 1, want b", got)
	}
	// One whose costs are not learned goes first: it cannot be paced.
	in[0].Contexts, in[1].Contexts = 1, 1
	in[0].Costed = false
	if got := free(a.Step(in, pacing)); got != "a" {
		t.Fatalf("taker %q beside an uncosted tenant, want a", got)
	}
}

// A tenant paced once and idle since (it uses a sliver of its rate and is
// never held) claims no more than it uses, and grows back to running
// freely: it does not keep the others' targets down.
func TestIdlePacedTenantLetGo(t *testing.T) {
	a := New(Params{})
	in := []Input{hog("hog", 0.6, 1), hog("b", 0.4, 1)}
	a.Step(in, pacing)
	in[1].Backlogged, in[1].Held = false, false
	setShare(&in[1], 0.001)
	var ds []Decision
	for i := 0; i < 30; i++ {
		ds = a.Step(in, pacing)
	}
	if ds[0].Name != "b" || ds[0].Duty < 1 || ds[1].Target < 0.99 { // sorted by name
		t.Errorf("after 30 periods idle: %+v", ds)
	}
}

// Hundreds of light tenants leave two hogs what they do not use: the
// headroom set aside for them all is totalHeadroom, not lightHeadroom each.
func TestManyLightTenants(t *testing.T) {
	in := []Input{hog("hog1", 0.4, 1), hog("hog2", 0.4, 1)}
	for i := 0; i < 500; i++ {
		in = append(in, Input{Name: fmt.Sprintf("light%03d", i), Rules: rules(100), Busy: true, Costed: true, Share: 0.01, SettledShare: 0.0002})
	}
	got := Targets(in, func(Input) float64 { return 1 })
	want := (1 - 500*0.0002 - totalHeadroom) / 2
	if math.Abs(got[0]-want) > 1e-6 || math.Abs(got[1]-want) > 1e-6 {
		t.Errorf("hogs' targets beside 500 light tenants %.4f %.4f, want %.4f", got[0], got[1], want)
	}
}

// An equal-FPS group's weight is shared in proportion to its tenants'
// frame costs: three loops of 5, 8 and 10 ms frames, running at one third
// of the GPU each (66.7, 41.7 and 33.3 frames a second), are given
// targets of 5/23, 8/23 and 10/23 of the half the group's weight of 300
// earns beside a tenant of weight 300: one frame rate, 21.7 a second. A
// tenant not rendering keeps its own weight, in every actuation.
func TestEqualFPSGroupSharesByFrameCost(t *testing.T) {
	game := func(name string, frameMS float64) Input {
		in := hog(name, 1.0/3, 1)
		in.Rules.EqualFPS = "games"
		in.FPS = 1000 / 3.0 / frameMS
		return in
	}
	in := []Input{game("a", 5), game("b", 8), game("c", 10), hog("other", 0, 1)}
	in[3].Rules.Weight = 300
	for name, act := range map[string]func(int) Actuation{"pacing": pacing, "steered": steered,
		"windows": func(int) Actuation { return Windows }} {
		ds := New(DefaultParams()).Step(in, act)
		got := map[string]float64{}
		for _, d := range ds {
			got[d.Name] = d.Target
		}
		for i, cost := range map[string]float64{"a": 5, "b": 8, "c": 10} {
			if want := 0.5 * cost / 23; math.Abs(got[i]-want) > 1e-9 {
				t.Errorf("%s: %s's target %.4f, want %.4f (%v)", name, i, got[i], want, got)
			}
		}
		if math.Abs(got["other"]-0.5) > 1e-9 {
			t.Errorf("%s: the other tenant's target %.4f, want 0.5", name, got["other"])
		}
	}
	idle := append([]Input(nil), in...)
	idle[2].FPS = 0
	equalFrames(idle)
	if w := 200 * 5.0 / 13; math.Abs(idle[0].frameWeight-w) > 1e-9 || idle[2].frameWeight != 0 {
		t.Errorf("frame weights %.1f, %.1f, %.1f: want %.1f for a and c, not rendering, on its own weight", idle[0].frameWeight,
			idle[1].frameWeight, idle[2].frameWeight, w)
	}
}
