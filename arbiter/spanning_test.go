package arbiter

import (
	"math"
	"testing"
)

// A tenant paced on one GPU and free on another gets one rate: the paced
// GPU's duty plus what it uses on the free one with room to grow, never
// more than the whole GPU; an idle context lends nothing; not paced
// anywhere, it runs freely.
func TestSpanningSumsWhatEachGPUAllows(t *testing.T) {
	ins := []Input{
		{Name: "a", GPU: 0, Share: 0.99, SettledShare: 0.97},
		{Name: "a", GPU: 1, Share: 0.14},
		{Name: "a", GPU: 2, Share: 0.0},
		{Name: "a", GPU: 3, Share: 0.2, SettledShare: 0.3},
		{Name: "b", GPU: 7, Share: 0.9}, // another tenant's
	}
	dec := func(gpu int, duty float64) Decision { return Decision{Name: "a", GPU: gpu, Duty: duty, Paced: true} }
	for _, tc := range []struct {
		name string
		decs []Decision
		rate float64 // duty × GPUs
		gpus int
	}{
		{"free where it is alone, paced beside a neighbour", []Decision{dec(0, 1), dec(1, 0.23)}, 1 + 0.23, 2},
		{"an idle context elsewhere lends only the room to start", []Decision{dec(2, 1), dec(1, 0.25)}, spanRoom + 0.25, 2},
		{"the settled share counts where it is larger", []Decision{dec(3, 1), dec(1, 0.1)}, 0.3*spanGrowth + spanRoom + 0.1, 2},
		{"no input of its own: nothing used", []Decision{dec(7, 1), dec(1, 0.5)}, spanRoom + 0.5, 2},
		{"paced on both", []Decision{dec(0, 0.5), dec(1, 0.25)}, 0.75, 2},
		{"free on both: runs freely", []Decision{dec(0, 1), dec(1, 1)}, 1, 1},
	} {
		g := Gate(tc.decs, ins)
		if g.GPUs != tc.gpus || math.Abs(g.Duty*float64(g.GPUs)-tc.rate) > 1e-9 || !g.Paced {
			t.Errorf("%s: %+v (rate %.4f), want rate %.4f over %d GPUs, paced", tc.name, g, g.Duty*float64(g.GPUs), tc.rate, tc.gpus)
		}
		if paced := tc.decs[0].Duty < 1 || tc.decs[1].Duty < 1; paced != (g.Duty < 1) {
			t.Errorf("%s: duty %.4f, paced %v", tc.name, g.Duty, paced)
		}
	}
}

// One GPU, or windows instead of rates (timeslice mode): the lowest duty
// with its offset, as before there was a rate to combine.
func TestGateTakesTheLowestDutyElsewhere(t *testing.T) {
	one := Gate([]Decision{{Name: "a", GPU: 0, Duty: 0.3, Offset: 0.2, Paced: true}}, nil)
	if one != (Gated{Duty: 0.3, Offset: 0.2, Paced: true, GPUs: 1}) {
		t.Errorf("one GPU: %+v", one)
	}
	windows := Gate([]Decision{{Name: "a", GPU: 0, Duty: 0.6, Offset: 0.1}, {Name: "a", GPU: 1, Duty: 0.4, Offset: 0.5}}, nil)
	if windows != (Gated{Duty: 0.4, Offset: 0.5, GPUs: 1}) {
		t.Errorf("windows on two GPUs: %+v", windows)
	}
	none := Gate(nil, nil)
	if none != (Gated{Duty: 1, Paced: true, GPUs: 1}) {
		t.Errorf("no decisions: %+v", none)
	}
}
