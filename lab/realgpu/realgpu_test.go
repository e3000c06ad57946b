package realgpu

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pmon output as nvidia-smi 5xx prints it: a header, then a line per
// process per sample; "-" where a process ran nothing.
const pmonSample = `# gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command
# Idx           #    C/G      %      %      %      %      %      %    name
    0       4101     C     71     12      -      -      -      -    python3
    0       4102     C     24      3      -      -      -      -    python3
    0       4101     C     69     11      -      -      -      -    python3
    0       4102     C      -      -      -      -      -      -    python3
`

func TestParsePmon(t *testing.T) {
	got := parsePmon(pmonSample)
	if len(got) != 2 || len(got[4101]) != 2 || got[4101][0] != 0.71 || got[4101][1] != 0.69 ||
		len(got[4102]) != 2 || got[4102][0] != 0.24 || got[4102][1] != 0 {
		t.Errorf("parsePmon: %v", got)
	}
}

func TestDetectWithoutGPU(t *testing.T) {
	var st unix.Stat_t
	if unix.Stat("/dev/nvidiactl", &st) == nil {
		t.Skip("this host has /dev/nvidiactl")
	}
	if _, err := Detect(context.Background(), "python3"); !errors.Is(err, ErrNoGPU) {
		t.Errorf("Detect without /dev/nvidiactl: %v, want ErrNoGPU", err)
	}
}

// The report keeps every step, failed ones with their error, in both
// files.
func TestReportWrite(t *testing.T) {
	r := &Report{Host: Host{Kernel: "6.18", GPUs: []string{"GPU 0: NVIDIA H100"}}, Steps: []Step{
		{Name: "ownership and permission", OK: true, Summary: "GET_INFO 0x0 | 0x23", Values: map[string]any{"via_fresh": 0x23}},
		{Name: "preempt", Error: "rm control 0xa06c0105: NV_ERR_NOT_SUPPORTED"},
	}}
	dir := filepath.Join(t.TempDir(), "out")
	if err := r.Write(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| ownership and permission | ok | GET_INFO 0x0 \\| 0x23 |", "**failed**: rm control 0xa06c0105", "## preempt", `"via_fresh": 35`} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q:\n%s", want, md)
		}
	}
	if !strings.Contains(string(js), `"error": "rm control 0xa06c0105: NV_ERR_NOT_SUPPORTED"`) || r.Failed() != 1 {
		t.Errorf("report.json %s, failed %d", js, r.Failed())
	}
}

// switchCostAt inverts the throughput a switch per slice leaves: with a
// 20 µs switch, 50 µs slices run 50/70 of the time, the 1024 µs default
// 1024/1044, and their ratio gives the 20 µs back; a ratio no switch cost
// explains gives nothing.
func TestSwitchCostAt(t *testing.T) {
	const us = time.Microsecond
	slice, def, cost := 50*us, 1024*us, 20*us
	q := (float64(slice) / float64(slice+cost)) / (float64(def) / float64(def+cost))
	got, ok := switchCostAt(slice, def, q)
	if !ok || got < cost-us/10 || got > cost+us/10 {
		t.Errorf("switchCostAt(50 µs, 1024 µs, %.4f) = %v, %v; want 20 µs", q, got, ok)
	}
	for _, q := range []float64{1, 1.02, 0, 50.0 / 1024} {
		if got, ok := switchCostAt(slice, def, q); ok {
			t.Errorf("switchCostAt(50 µs, 1024 µs, %.4f) = %v, want no cost", q, got)
		}
	}
}

// A workload's progress lines give its iterations per second between two
// times, from the last line before each; other lines are skipped.
func TestRateOf(t *testing.T) {
	ps := progressOf("ready 4096\n1000000000 10\n1500000000 20\n2000000000 30\n2500000000 40\niterations 40\n")
	if len(ps) != 4 {
		t.Fatalf("progress lines: %v", ps)
	}
	if r := rateOf(ps, 1_200_000_000, 2_200_000_000); r != 20 {
		t.Errorf("rate over 1 s from 10 to 30 iterations: %v, want 20", r)
	}
	if r := rateOf(ps, 500_000_000, 2_000_000_000); r != 0 {
		t.Errorf("rate from before the first line: %v, want 0", r)
	}
}

// gzipFile leaves the gzipped copy and removes the original.
func TestGzipFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "meter.jsonl")
	want := strings.Repeat("{\"op\":\"tick\"}\n", 1000)
	if err := os.WriteFile(src, []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "out", heldRecording)
	if err := gzipFile(src, dst); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(zr)
	if err != nil || string(got) != want {
		t.Errorf("gunzipped %d bytes (%v), want the %d written", len(got), err, len(want))
	}
	if _, err := os.Stat(src); !os.IsNotExist(err) {
		t.Errorf("the original is still there: %v", err)
	}
}
