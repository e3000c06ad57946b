package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuarb/gpuarb/lab"
)

// errorBins are the histogram's bins of a scenario's largest tenant error,
// in pp: [0,1), [1,2), [2,3), [3,5), [5,10), [10,∞).
var errorBins = []struct {
	name   string
	lo, hi float64
}{{"< 1", 0, 0.01}, {"1-2", 0.01, 0.02}, {"2-3", 0.02, 0.03}, {"3-5", 0.03, 0.05}, {"5-10", 0.05, 0.10}, {"> 10", 0.10, 2}}

// benchFuzz runs the fuzzer's seeds (or reads a previous run's results)
// and reports the distribution of each scenario's largest error with and
// without gpuarb, with a histogram.
func benchFuzz(ctx context.Context, b *bench) (string, error) {
	var results []lab.ScenarioResult
	var source string
	var incomplete []string
	if b.fuzzResults != "" {
		data, err := os.ReadFile(b.fuzzResults)
		if err != nil {
			return "", err
		}
		if err := json.Unmarshal(data, &results); err != nil {
			return "", fmt.Errorf("%s: %w", b.fuzzResults, err)
		}
		source = fmt.Sprintf("read from `%s` (written by `gpuarb-lab fuzz --json`)", filepath.Base(b.fuzzResults))
	} else {
		seeds, err := parseSeeds(b.fuzzSeeds)
		if err != nil {
			return "", err
		}
		o := lab.RunOptions{Bins: b.bins, Parent: cgroupParent, Log: b.logf}
		// A seed that does not complete (a workload or the daemon failed)
		// is reported, and the others still run.
		for _, seed := range seeds {
			res, err := runFuzz(ctx, io.Discard, []lab.Scenario{lab.DrawScenario(seed)}, o)
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			if err != nil {
				b.logf("seed %d did not complete: %v", seed, err)
				incomplete = append(incomplete, fmt.Sprintf("%d (%s)", seed, firstLine(err.Error())))
			}
			results = append(results, res...)
		}
		source = fmt.Sprintf("run by this bench (`gpuarb-lab fuzz --seeds %s`)", b.fuzzSeeds)
		if data, err := json.MarshalIndent(results, "", "  "); err == nil {
			_ = os.MkdirAll(filepath.Join(b.outDir, dataDir), 0o755)
			_ = os.WriteFile(filepath.Join(b.outDir, dataDir, "fuzz.json"), data, 0o644)
		}
	}
	if len(results) == 0 {
		return "", fmt.Errorf("no fuzz results")
	}
	text, err := fuzzReport(b, results, source)
	if len(incomplete) > 0 {
		text += fmt.Sprintf("\nSeeds that did not complete (not counted above): %s.\n", strings.Join(incomplete, "; "))
	}
	return text, err
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func fuzzReport(b *bench, results []lab.ScenarioResult, source string) (string, error) {
	var s strings.Builder
	sum := summarize(results)
	runs := "three times: every tenant alone on its own simulated GPU (its demand in each second), all together without gpuarb, all together with the daemon"
	if sum.Probed {
		runs = "four times: every tenant alone on its own simulated GPU (its demand in each second), the same beside the daemon observing, all together without gpuarb, all together with the daemon"
	}
	fmt.Fprintf(&s, "`gpuarb-lab fuzz` draws random scenarios from a seed: 2–6 tenants of 1–4 processes and 1–4 streams, kernel mixes from 20 µs to 50 ms with phases, sync patterns (every 1–200 launches, event syncs, polling, never), arrivals and departures, weights 1–1000, limits, batch priorities. Each runs %s. A tenant's target in a second is the weighted max-min share over that second's demands; its error is the median over its seconds of |true − target|, and a scenario's error is its largest tenant error. %d scenarios, %s.\n\n", runs, len(results), source)
	pct := func(n int) string { return fmt.Sprintf("%d (%.0f%%)", n, 100*float64(n)/float64(sum.Scenarios)) }
	s.WriteString("| run | every tenant within 3 pp | a tenant beyond 10 pp | median largest error |\n|---|---|---|---|\n")
	fmt.Fprintf(&s, "| without gpuarb | %s | %s | %.1f pp |\n", pct(sum.Within3Free), pct(sum.Beyond10Free), 100*sum.MedianMaxFree)
	fmt.Fprintf(&s, "| with gpuarb | %s | %s | %.1f pp |\n", pct(sum.Within3), pct(sum.Beyond10), 100*sum.MedianMax)
	if sum.Probed {
		fmt.Fprintf(&s, "| with gpuarb, against the targets from the demands without the probes | %s | %s | %.1f pp |\n",
			pct(sum.Within3Unprobed), pct(sum.Beyond10Unprobed), 100*sum.MedianMaxUnprobed)
		s.WriteString("\nThese runs set the targets from a fourth run of every tenant alone beside the daemon observing " +
			"(`--probed-demand`): what it takes alone under gpuarb's probes, whose cost — a uprobe hit per launch and sync, " +
			"section 1 measures it — is a closed loop of short kernels' own. The last row scores the same runs " +
			"against the targets from the demands without the probes, as the runs without `--probed-demand` do.\n")
	}
	if len(sum.Failed) > 0 {
		fmt.Fprintf(&s, "\nSeeds beyond 3 pp with gpuarb (`gpuarb-lab fuzz --seeds N --verbose` replays one): %s.\n", joinSeeds(sum.Failed))
	}
	if len(sum.LatencyHeld) > 0 {
		fmt.Fprintf(&s, "\nOf these, only closed loops held at their latency bound miss in %d: %s. Such a loop idles the GPU "+
			"between its bursts alone (its share alone below 95%%) and beside the others gets at least that rate in all the "+
			"time their true shares leave free: its target, set from its share alone, is out of reach while the others hold "+
			"theirs (`lab.TenantResult.HeldByLatency`). They still count as misses above.\n", len(sum.LatencyHeld), joinSeeds(sum.LatencyHeld))
	}
	with, without := make([]float64, len(errorBins)), make([]float64, len(errorBins))
	cats := make([]string, len(errorBins))
	for i, bin := range errorBins {
		cats[i] = bin.name
		for _, r := range results {
			if e := r.MaxError(true); e >= bin.lo && e < bin.hi {
				with[i]++
			}
			if e := r.MaxError(false); e >= bin.lo && e < bin.hi {
				without[i]++
			}
		}
	}
	path, link := b.chart("fuzz.png")
	if err := lab.BarChart(path, "largest tenant error per scenario", "scenarios", 0, cats,
		[]lab.Bars{{Name: "without gpuarb", Values: without}, {Name: "with gpuarb", Values: with}}); err != nil {
		return "", err
	}
	fmt.Fprintf(&s, "\n![largest error per scenario, pp](%s)\n", link)
	return s.String(), nil
}

func joinSeeds(seeds []uint64) string {
	parts := make([]string, len(seeds))
	for i, s := range seeds {
		parts[i] = fmt.Sprint(s)
	}
	return strings.Join(parts, ", ")
}
