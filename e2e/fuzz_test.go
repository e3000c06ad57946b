package e2e

import (
	"path/filepath"
	"testing"

	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/lab"
)

// A few of the fuzzer's scenarios (gpuarb-lab fuzz: random tenants,
// workloads, weights, limits and arrivals) on every change: each tenant's
// median share over its 1 s windows within 3 pp of its target (max-min
// fair from its demand alone in each second), as the fuzzer's pass bar.
// A seed that misses runs once more and the second run is asserted, as
// the accuracy matrix does: on this 2-vCPU VM seed 3 read 3.5 pp in one
// make test run and passed alone right after (a regression misses twice).
// BENCHMARKS.md has the distribution over many seeds.
func TestFuzzSeeds(t *testing.T) {
	testutil.Privileged(t)
	bins := filepath.Dir(testutil.Bin(t, "gpuarb"))
	for _, name := range []string{"fakegpud", "gpuwork", "libcuda.so.1"} {
		testutil.Bin(t, name)
	}
	for _, seed := range []uint64{1, 3} {
		sc := lab.DrawScenario(seed)
		t.Logf("seed %d:\n%s", seed, sc)
		for attempt := 1; ; attempt++ {
			res, err := lab.RunScenario(t.Context(), sc, lab.RunOptions{Bins: bins, Parent: testutil.TestParent,
				Log: func(format string, args ...any) { t.Logf(format, args...) }})
			if err != nil {
				t.Fatal(err)
			}
			for i, seg := range res.Segments {
				for _, tn := range seg {
					t.Logf("seed %d run %d segment %d: %s target %.1f%%, with gpuarb %.1f%% (without %.1f%%), estimated %.1f%%, median error %.1f pp",
						seed, attempt, i+1, tn.Name, 100*tn.Target, 100*tn.True, 100*tn.Unarbitrated, 100*tn.Estimated, 100*tn.Error())
				}
			}
			e := res.MaxError(true)
			switch {
			case e <= 0.03:
			case attempt == 1:
				t.Logf("seed %d run 1: largest error %.1f pp with gpuarb, want ≤ 3; once more", seed, 100*e)
				continue
			default:
				t.Errorf("seed %d: largest error %.1f pp with gpuarb (%.1f pp without), want ≤ 3", seed, 100*e, 100*res.MaxError(false))
			}
			break
		}
	}
}
