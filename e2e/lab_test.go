package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuarb/gpuarb/internal/testutil"
)

// The demo (make demo, here its 16 s form) runs three runc containers
// attached by the OCI hook, prints its table and writes its chart, and
// leaves nothing behind: the weight-300 job gets more than the weight-100
// one under gpuarb, and the inference service's p99 falls.
func TestDemo(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, "runc", "apt-get install runc")
	chart := filepath.Join(t.TempDir(), "demo.png")
	out, err := exec.Command(testutil.Bin(t, "gpuarb-lab"), "demo", "--quick", "--simulated", "--chart", chart).CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	text := string(out)
	row := func(name string) []float64 {
		m := regexp.MustCompile(`(?m)^\s*` + name + `\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)%$`).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no row for %s in:\n%s", name, text)
		}
		var xs []float64
		for _, s := range m[1:] {
			v, _ := strconv.ParseFloat(s, 64)
			xs = append(xs, v)
		}
		return xs // unarbitrated, target, measured, true
	}
	a, b := row("train-a"), row("train-b")
	t.Logf("train-a %v, train-b %v (unarbitrated, target, measured, true)", a, b)
	if b[3] < 2*a[3] || a[0] < 30 || b[0] < 30 {
		t.Errorf("weights 100:300 not enforced: unarbitrated %.1f/%.1f, under gpuarb %.1f/%.1f", a[0], b[0], a[3], b[3])
	}
	m := regexp.MustCompile(`without gpuarb ([\d.]+) ms, with gpuarb ([\d.]+) ms`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no latency line in:\n%s", text)
	}
	without, _ := strconv.ParseFloat(m[1], 64)
	with, _ := strconv.ParseFloat(m[2], 64)
	if with >= without {
		t.Errorf("inference p99 %.2f ms with gpuarb, %.2f ms without", with, without)
	}
	if data, err := os.ReadFile(chart); err != nil || !bytes.HasPrefix(data, []byte("\x89PNG")) {
		t.Errorf("chart %s: %v", chart, err)
	}
	// Nothing left: no container, no demo cgroup.
	if left, _ := filepath.Glob("/sys/fs/cgroup/unified/gpuarb-lab/demo-*"); len(left) > 0 {
		t.Errorf("cgroups left behind: %v", left)
	}
	if ps, _ := exec.Command("pgrep", "-f", "gpuarb-demo-").Output(); len(strings.TrimSpace(string(ps))) > 0 {
		t.Errorf("demo processes left behind: %s", ps)
	}
}

// The benchmark runs and writes its report and charts (a quick run of two
// sections; make bench writes BENCHMARKS.md).
func TestBenchQuick(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	report := filepath.Join(dir, "BENCHMARKS.md")
	cmd := exec.Command(testutil.Bin(t, "gpuarb-lab"), "bench", "--quick", "--only", "weights,conservation", "--out", report)
	cmd.Dir = testutil.RepoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for _, want := range []string{"## 4. Weighted shares", "| 1:3 | 25.0% / 75.0% |", "## 9. Work conservation", "bench-weights.png", "Machine: "} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "bench-weights.png")); err != nil {
		t.Error(err)
	}
}
