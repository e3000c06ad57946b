package arbiter

import "math"

// Growth room a paced tenant keeps, in its one rate, on a GPU where it
// runs freely: what it used there × spanGrowth + spanRoom, at most the
// whole GPU. A context that starts or speeds up there reaches the whole
// GPU in about ten control periods.
const (
	spanGrowth = 1.25
	spanRoom   = 0.05
)

// Gated is what one tenant's gate enforces of its decisions on its GPUs
// (none of them Scheduled): the lowest duty, with its offset, paced when
// that decision is; paced on several GPUs, the rate Spanning combines.
type Gated struct {
	Duty, Offset float64
	Paced        bool
	// GPUs is how many GPUs a paced Duty spans: the gate's rate is Duty ×
	// GPUs GPU ns per ns.
	GPUs int
}

// Gate combines one tenant's decisions on its GPUs into what its one gate
// enforces; ins are the period's inputs (its own among them).
func Gate(decs []Decision, ins []Input) Gated {
	g := Gated{Duty: 1, Paced: true, GPUs: 1}
	rated := 0
	for _, d := range decs {
		if d.Duty < g.Duty {
			g.Duty, g.Offset, g.Paced = d.Duty, d.Offset, d.Paced && !d.Scheduled
		}
		if d.Paced && !d.Scheduled {
			rated++
		}
	}
	if g.Paced && g.Duty < 1 && rated > 1 && rated == len(decs) {
		g.Duty, g.GPUs = Spanning(decs, ins)
	}
	return g
}

// Spanning combines a tenant's paced decisions on several GPUs into the
// one rate its launch gate enforces. The gate stops a process on all its
// GPUs at once (a stop is process-wide) and pays every launch from one
// account, so the lowest duty would hold its work on a GPU it has to
// itself to the pace another GPU needs (2.6% of a GPU it had alone, for a
// target of 99.5%). Instead each GPU where it is paced brings its duty,
// and each where it runs freely what it uses there with room to grow (an
// idle context lends it nothing). The rate is their sum: when one GPU's
// pace holds the process, its work on every GPU slows alike. ins are the
// period's inputs: the tenant's on a decision's GPU, absent where it used
// nothing there.
//
// It returns the mean duty per GPU (1: every GPU runs freely) and how many
// GPUs it spans; the gate's rate is their product, in GPU ns per ns.
func Spanning(decs []Decision, ins []Input) (duty float64, gpus int) {
	paced, sum := false, 0.0
	for _, d := range decs {
		if d.Duty < 1 {
			paced = true
			sum += d.Duty
			continue
		}
		used := 0.0
		for _, t := range ins {
			if t.Name == d.Name && t.GPU == d.GPU {
				used = math.Max(t.Share, t.SettledShare)
			}
		}
		sum += math.Min(1, used*spanGrowth+spanRoom)
	}
	if !paced || len(decs) == 0 {
		return 1, max(len(decs), 1)
	}
	return sum / float64(len(decs)), len(decs)
}
