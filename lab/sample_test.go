package lab

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuarb/gpuarb/e2e/fakegpu"
)

func TestStatistics(t *testing.T) {
	xs := []float64{4, 1, 3, 2}
	for _, tc := range []struct {
		name      string
		got, want float64
	}{
		{"median", Median(xs), 2.5},
		{"p0", Percentile(xs, 0), 1},
		{"p100", Percentile(xs, 100), 4},
		{"p95", Percentile(xs, 95), 3.85},
		{"mean", Mean(xs), 2.5},
		{"max", Max(xs), 4},
		{"empty", Median(nil), 0},
		{"unfairness", Unfairness(0.8, 0.2), 0.6},
		{"unfairness of nothing", Unfairness(0, 0), 0},
	} {
		if math.Abs(tc.got-tc.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if xs[0] != 4 {
		t.Error("Percentile sorted its input")
	}
}

func TestTrueSharesByCgroup(t *testing.T) {
	st := fakegpu.Stats{ElapsedNS: 1000, GPUs: []fakegpu.GPUStats{{BusyNS: 900, Contexts: []fakegpu.ContextStats{
		{Cgroup: "/demo/train", BusyNS: 300}, {Cgroup: "/demo/train/worker", BusyNS: 200},
		{Cgroup: "/demo/training", BusyNS: 100}, {Cgroup: "/demo/infer", BusyNS: 300},
	}}}}
	shares, busy := TrueShares(st, []Tenant{{"train", "/demo/train"}, {"infer", "/demo/infer"}})
	if shares["train"] != 0.5 || shares["infer"] != 0.3 || busy != 0.9 {
		t.Errorf("shares %v busy %v: a cgroup counts with what is below it, not a sibling sharing its prefix", shares, busy)
	}
}

func TestCharts(t *testing.T) {
	dir := t.TempDir()
	x := []float64{0, 1, 2}
	for name, write := range map[string]func(string) error{
		"line.png": func(p string) error {
			return LineChart(p, "shares", "s", "share", 0, []Line{{Name: "a", X: x, Y: []float64{0.2, 0.5, 0.5}}, {Name: "a target", X: x, Y: []float64{0.5, 0.5, 0.5}, Dashed: true}})
		},
		"bars.png": func(p string) error {
			return BarChart(p, "weights", "share", 100, []string{"1:1", "1:3"}, []Bars{{"target", []float64{0.5, 0.25}}, {"achieved", []float64{0.5, 0.26}}})
		},
	} {
		p := filepath.Join(dir, name)
		if err := write(p); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(p)
		if err != nil || !bytes.HasPrefix(data, []byte("\x89PNG")) || len(data) < 2000 {
			t.Errorf("%s: not a PNG chart (%d bytes, %v)", name, len(data), err)
		}
	}
}
