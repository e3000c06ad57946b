package e2e

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/lab"
)

// A few of the fuzzer's scenarios (gpuarb-lab fuzz: random tenants,
// workloads, weights, limits and arrivals) on every change: each tenant's
// median share over its 1 s windows within 3 pp of its target (max-min
// fair from its demand alone in each second), as the fuzzer's pass bar.
// A seed that misses runs once more (measureTwice): on this 2-vCPU VM
// seed 3 read 3.5 pp in one make test run and passed alone right after.
// BENCHMARKS.md has the distribution over many seeds.
func TestFuzzSeeds(t *testing.T) {
	testutil.Privileged(t)
	bins := filepath.Dir(testutil.Bin(t, "gpuarb"))
	for _, name := range []string{"fakegpud", "gpuwork", "libcuda.so.1"} {
		testutil.Bin(t, name)
	}
	for _, seed := range []uint64{1, 3} {
		sc := lab.DrawScenario(seed)
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			t.Logf("scenario:\n%s", sc)
			measureTwice(t, func(t *testing.T, miss missFunc) {
				res, err := lab.RunScenario(t.Context(), sc, lab.RunOptions{Bins: bins, Parent: testutil.TestParent,
					Log: func(format string, args ...any) { t.Logf(format, args...) }})
				if err != nil {
					t.Fatal(err)
				}
				for i, seg := range res.Segments {
					for _, tn := range seg {
						t.Logf("segment %d: %s target %.1f%%, with gpuarb %.1f%% (without %.1f%%), estimated %.1f%%, median error %.1f pp",
							i+1, tn.Name, 100*tn.Target, 100*tn.True, 100*tn.Unarbitrated, 100*tn.Estimated, 100*tn.Error())
					}
				}
				if e := res.MaxError(true); e > 0.03 {
					miss("largest error %.1f pp with gpuarb (%.1f pp without), want ≤ 3", 100*e, 100*res.MaxError(false))
				}
			})
		})
	}
}
