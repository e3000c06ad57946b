package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuarb/gpuarb/lab"
)

// windows is how many 1 s windows a scenario is measured over.
func (b *bench) windows() int {
	if b.quick {
		return 3
	}
	return 10
}

// settle is how long a scenario runs before it is measured.
const settle = 4 * time.Second

// scene starts a scene with the section's gpuArgs and the bench's own
// (--gpu-arg).
func (b *bench) scene(name string, mode daemonMode, gpuArgs ...string) (*scene, error) {
	return newScene(b.bins, name, mode, append(slices.Clone(gpuArgs), b.gpuArgs...)...)
}

// measured runs a scenario in a fresh scene: setup starts its tenants,
// then the truth is sampled in 1 s windows after settle. It returns the
// samples and the GPU utilisation over them.
func (b *bench) measured(ctx context.Context, name string, mode daemonMode, gpuArgs []string, setup func(*scene) error) ([]lab.Sample, float64, error) {
	sc, err := b.scene(name, mode, gpuArgs...)
	if err != nil {
		return nil, 0, err
	}
	defer sc.close()
	if err := setup(sc); err != nil {
		return nil, 0, err
	}
	ss, err := sc.sample(ctx, settle, time.Second, time.Duration(b.windows())*time.Second)
	if err != nil {
		return nil, 0, err
	}
	return ss, lab.Median(lab.Series(ss, 0, func(s lab.Sample) float64 { return s.Busy })), nil
}

// modes are the two runs of a comparison.
var modes = []struct {
	name string
	mode daemonMode
}{{"without gpuarb", noDaemon}, {"with gpuarb", enforcing}}

// goBench runs a Go benchmark of the repository and returns, per
// sub-benchmark, the median over runs of each reported unit.
func (b *bench) goBench(ctx context.Context, pattern, benchtime string, count int, pkg string) (map[string]map[string]float64, error) {
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", pattern, "-benchtime", benchtime,
		"-count", strconv.Itoa(count), pkg)
	cmd.Dir = b.repo
	cmd.Env = append(os.Environ(), "GPUARB_BIN="+b.bins)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go test -bench %s: %w\n%s", pattern, err, out)
	}
	runs := map[string]map[string][]float64{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			name = name[:i] // the GOMAXPROCS suffix
		}
		if runs[name] == nil {
			runs[name] = map[string][]float64{}
		}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				runs[name][f[i+1]] = append(runs[name][f[i+1]], v)
			}
		}
	}
	res := map[string]map[string]float64{}
	for name, units := range runs {
		res[name] = map[string]float64{}
		for u, vs := range units {
			res[name][u] = lab.Median(vs)
		}
	}
	return res, nil
}

// summary parses the JSON summary a gpuwork process prints last.
func summary(p *lab.Proc) (map[string]float64, error) {
	stdout, stderr := p.Output()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var raw map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &raw); err != nil {
		return nil, fmt.Errorf("%v: no summary (%w): %s", p.Cmd.Args, err, stderr)
	}
	out := map[string]float64{}
	for k, v := range raw {
		if f, ok := v.(float64); ok {
			out[k] = f
		}
	}
	return out, nil
}

// finished waits for a workload to end and returns its summary.
func finished(ctx context.Context, p *lab.Proc, timeout time.Duration) (map[string]float64, error) {
	done := make(chan error, 1)
	go func() { done <- p.Wait(timeout) }()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case err := <-done:
		if err != nil {
			return nil, err
		}
	}
	return summary(p)
}

// pct formats a fraction as a percentage.
func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

// intervals parses gpuwork's per-interval lines (--interval 1): field f of
// the lines after `after` seconds.
func intervals(p *lab.Proc, field string, after float64) []float64 {
	stdout, _ := p.Output()
	var out []float64
	for _, line := range strings.Split(stdout, "\n") {
		var iv map[string]any
		if json.Unmarshal([]byte(line), &iv) != nil || iv["summary"] != nil {
			continue
		}
		t, _ := iv["t"].(float64)
		if v, ok := iv[field].(float64); ok && t > after {
			out = append(out, v)
		}
	}
	return out
}
