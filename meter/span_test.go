package meter

import (
	"math/rand"
	"testing"
)

// unionByUnits is the union's length counted unit by unit: the reference
// unionLength must equal.
func unionByUnits(from, to uint64, lists ...[]span) float64 {
	var n float64
	for t := from; t < to; t++ {
		for _, l := range lists {
			covered := false
			for _, sp := range l {
				if sp.start <= t && t < sp.end {
					covered = true
					break
				}
			}
			if covered {
				n++
				break
			}
		}
	}
	return n
}

func TestUnionLengthCountsEachInstantOnce(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 2000; i++ {
		lists := make([][]span, 1+rng.Intn(7))
		for j := range lists {
			at := uint64(rng.Intn(20))
			for k := rng.Intn(6); k > 0; k-- {
				if rng.Intn(5) == 0 { // out of time order: the sorting path
					at = uint64(rng.Intn(100))
				}
				sp := span{at, at + uint64(rng.Intn(15))}
				lists[j] = append(lists[j], sp)
				at = sp.start + uint64(rng.Intn(20))
			}
		}
		from, to := uint64(rng.Intn(40)), uint64(40+rng.Intn(80))
		if got, want := unionLength(from, to, lists...), unionByUnits(from, to, lists...); got != want {
			t.Fatalf("case %d: union of %v within [%d, %d) = %v, want %v", i, lists, from, to, got, want)
		}
	}
}

// BenchmarkWantedInLaunchBound reads the wanted time of a launch-bound
// context: a held span per kernel, 100 000 in the window.
func BenchmarkWantedInLaunchBound(b *testing.B) {
	c := &gpuContext{}
	for i := uint64(0); i < 100000; i++ {
		c.held = appendSpan(c.held, i*10, i*10+5)
	}
	c.waited = []span{{0, 1000}, {500000, 600000}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if got := c.wantedIn(0, 1000000, nil); got < 500000 {
			b.Fatal(got)
		}
	}
}
