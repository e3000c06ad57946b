package arbiter

import (
	"math"
	"testing"

	"github.com/gpuarb/gpuarb/policy"
)

func rules(w int) policy.Rules {
	return policy.Rules{Weight: policy.Weight(w), Priority: policy.Normal}
}

func share(int) policy.Mode { return policy.ModeShare }

func TestTargets(t *testing.T) {
	full := func(Input) float64 { return 0.5 } // throttled: wants the GPU
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
		got := Targets(tc.in, full)
		for i := range got {
			if math.Abs(got[i]-tc.want[i]) > 1e-9 {
				t.Errorf("%s: targets %v, want %v", tc.name, got, tc.want)
				break
			}
		}
	}
	// An unthrottled tenant using little leaves the rest (work conservation).
	in := []Input{{Name: "small", Rules: rules(100), Busy: true, Share: 0.1}, {Name: "hog", Rules: rules(100), Busy: true, Share: 0.9}}
	got := Targets(in, func(Input) float64 { return 1 })
	if math.Abs(got[0]-0.13) > 1e-9 || math.Abs(got[1]-0.87) > 1e-9 {
		t.Errorf("work conservation: %v", got)
	}
}

func TestAIMD(t *testing.T) {
	a := New(Params{})
	in := []Input{{Name: "a", Rules: rules(100), Busy: true, Share: 0.8}, {Name: "b", Rules: rules(100), Busy: true, Share: 0.2}}
	// a is above its target (76%): its rate falls from what it uses (80%)
	// by target/share, no more than needed.
	ds := a.Step(in, share)
	if math.Abs(ds[0].Duty-0.76) > 1e-9 || ds[1].Duty != 1 || ds[0].Reason != "above target" || !ds[0].Paced {
		t.Fatalf("%+v", ds)
	}
	prev := ds[0].Duty
	ds = a.Step(in, share)
	if math.Abs(ds[0].Duty-prev*0.95) > 1e-9 {
		t.Errorf("second decrease %v after %v", ds[0].Duty, prev)
	}
	for i := 0; i < 100; i++ {
		ds = a.Step(in, share)
	}
	if math.Abs(ds[0].Duty-0.38) > 1e-9 {
		t.Errorf("rate floor %v, want half the target (0.38)", ds[0].Duty)
	}
	// Below target with work: additive increase.
	in[0].Share, in[1].Share = 0.2, 0.8
	ds = a.Step(in, share)
	if math.Abs(ds[0].Duty-0.43) > 1e-9 || ds[0].Reason != "below target" {
		t.Errorf("increase: %+v", ds[0])
	}
	// Alone: full duty at once.
	in[1].Busy = false
	ds = a.Step(in, share)
	if ds[0].Duty != 1 || ds[1].Duty != 1 || ds[1].Reason != "idle" {
		t.Errorf("alone: %+v", ds)
	}
	// A limit applies even alone; far above it, the step is Decrease.
	in[0].Rules.Limit, in[0].Share = 0.3, 0.9
	ds = a.Step(in, share)
	if math.Abs(ds[0].Duty-0.72) > 1e-9 || ds[0].Target != 0.3 {
		t.Errorf("limit alone: %+v", ds[0])
	}
}

func TestLatencySLO(t *testing.T) {
	a := New(Params{})
	lat := policy.Rules{Weight: 100, Priority: policy.Latency, SLO: policy.SLO{P99SyncMS: 10}}
	in := []Input{
		{Name: "hog", Rules: rules(100), Busy: true, Share: 0.45},
		{Name: "infer", Rules: lat, Busy: true, Share: 0.1, SyncP99MS: 30},
		{Name: "hog2", Rules: rules(100), Busy: true, Share: 0.45},
	}
	ds := a.Step(in, share) // sorted by name: hog, hog2, infer
	if ds[2].Duty != 1 || !ds[2].SLOMissed {
		t.Errorf("latency tenant %+v", ds[2])
	}
	if math.Abs(ds[0].Duty-0.36) > 1e-9 || math.Abs(ds[1].Duty-0.36) > 1e-9 || ds[0].Reason != "a latency SLO is missed" {
		t.Errorf("others while the SLO is missed: %+v %+v", ds[0], ds[1])
	}
	// Held again: the others recover additively, by at most the gap to
	// their targets (43%).
	in[1].SyncP99MS, in[0].Share, in[2].Share = 5, 0.4, 0.4
	ds = a.Step(in, share)
	if ds[2].SLOMissed || math.Abs(ds[0].Duty-0.39) > 1e-9 {
		t.Errorf("after the SLO holds: %+v", ds)
	}
}

func TestTimeslice(t *testing.T) {
	a := New(Params{})
	in := []Input{{Name: "a", Rules: rules(100), Busy: true}, {Name: "b", Rules: rules(300), Busy: true}, {Name: "c", Rules: rules(100)}}
	ds := a.Step(in, func(int) policy.Mode { return policy.ModeTimeslice })
	if ds[0].Duty != 0.25 || ds[0].Offset != 0 || ds[1].Duty != 0.75 || ds[1].Offset != 0.25 || ds[2].Duty != 1 {
		t.Errorf("%+v", ds)
	}
}
