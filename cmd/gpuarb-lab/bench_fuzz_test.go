package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuarb/gpuarb/lab"
)

// The fuzzer section counts scenarios by their largest tenant error, with
// and without gpuarb, from a results file as gpuarb-lab fuzz --json
// writes it, and draws the histogram.
func TestFuzzReportFromResults(t *testing.T) {
	res := func(seed uint64, with, without float64) lab.ScenarioResult {
		r := lab.ScenarioResult{Scenario: lab.Scenario{Seed: seed}}
		r.Segments = [][]lab.TenantResult{{{Name: "a", Err: with, UnarbitratedErr: without}, {Name: "b"}}}
		return r
	}
	results := []lab.ScenarioResult{res(1, 0.005, 0.2), res(2, 0.02, 0.04), res(3, 0.12, 0.01), res(4, 0.01, 0.3)}
	dir := t.TempDir()
	data, err := json.Marshal(results)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "fuzz.json")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	b := &bench{outDir: dir, fuzzResults: file, log: io.Discard}
	text, err := benchFuzz(t.Context(), b)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"4 scenarios, read from `fuzz.json`",
		"| without gpuarb | 1 (25%) | 2 (50%) |",
		"| with gpuarb | 3 (75%) | 1 (25%) |",
		"Seeds beyond 3 pp with gpuarb (`gpuarb-lab fuzz --seeds N --verbose` replays one): 3.",
		"Each runs three times",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	// Results of --probed-demand say so, and score both ways.
	for i := range results {
		results[i].Segments[0][0].AloneUnprobed, results[i].Segments[0][0].ErrUnprobed = 1, 0.15
	}
	text, err = fuzzReport(b, results, "read from `fuzz.json`")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Each runs four times: every tenant alone on its own simulated GPU (its demand in each second), the same beside the daemon observing,",
		"| with gpuarb, against the targets from the demands without the probes | 0 (0%) | 4 (100%) | 15.0 pp |",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("probed report lacks %q:\n%s", want, text)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "benchmarks", "fuzz.png")); err != nil || fi.Size() == 0 {
		t.Errorf("histogram: %v", err)
	}
}
