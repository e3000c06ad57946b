package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

func runApp(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := newApp()
	app.Writer = &out
	app.ErrWriter = &out
	err := app.Run(append([]string{"gpuarb"}, args...))
	return out.String(), err
}

func TestHelpOnEveryCommand(t *testing.T) {
	app := newApp()
	for _, c := range app.Commands {
		out, err := runApp(t, c.Name, "--help")
		if err != nil || !strings.Contains(out, "gpuarb "+c.Name) || !strings.Contains(out, c.Usage) {
			t.Errorf("%s --help: %v\n%s", c.Name, err, out)
		}
	}
	out, err := runApp(t, "--help")
	if err != nil || !strings.Contains(out, "trace") || !strings.Contains(out, "doctor") {
		t.Errorf("--help: %v\n%s", err, out)
	}
}

func TestVersion(t *testing.T) {
	out, err := runApp(t, "version")
	if err != nil || out != "gpuarb "+version+"\n" {
		t.Errorf("version: %q %v", out, err)
	}
}

func TestTraceRejectsBadDevice(t *testing.T) {
	for _, arg := range []string{"1:7", "1:7=amd", "x:1=drm"} {
		_, err := runApp(t, "trace", "--device", arg)
		if err == nil || !strings.Contains(err.Error(), "--device") {
			t.Errorf("--device %s: %v", arg, err)
		}
	}
}

func TestMapsWithNothingPinned(t *testing.T) {
	out, err := runApp(t, "maps", "--pin-path", t.TempDir())
	if err != nil || !strings.Contains(out, "nothing is pinned") || !strings.Contains(out, "gpuarb_cgroups") {
		t.Errorf("maps: %v\n%s", err, out)
	}
}

func TestDoctor(t *testing.T) {
	testutil.Privileged(t)
	out, err := runApp(t, "doctor", "--json")
	if err != nil {
		t.Fatalf("doctor: %v\n%s", err, out)
	}
	var rep doctorReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	ok := map[string]bool{}
	for _, f := range rep.Features {
		ok[f.Name] = f.OK
	}
	if !rep.Root || !rep.BPFFS || !rep.Tracefs || !ok["btf"] || !ok["ringbuf"] || !ok["tracepoints"] || !ok["uprobes"] {
		t.Errorf("doctor on this host: %+v", rep)
	}
	if rep.Cgroup.UnifiedMount == "" || !rep.Cgroup.Freeze {
		t.Errorf("cgroup: %+v", rep.Cgroup)
	}
	text, err := runApp(t, "doctor")
	if err != nil || !strings.Contains(text, "verdict      gpuarb can run here") {
		t.Errorf("doctor: %v\n%s", err, text)
	}
}

// TestTraceJSON runs the real binary against the simulated GPU and checks
// the JSON lines a workload in a test cgroup produces.
func TestTraceJSON(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	cg := testutil.NewCgroup(t, "trace")
	trace := exec.Command(testutil.Bin(t, "gpuarb"), "trace", "--json", "--duration", "4s", "--no-host-devices",
		"--device", "1:7=nvidia", "--libcuda", testutil.Bin(t, "libcuda.so.1"))
	tp := testutil.Start(t, nil, trace)
	waitFor(t, func() bool { return strings.Contains(tp.Stderr.String(), "tracing") }, 10*time.Second, "trace start")

	hog := testutil.Start(t, cg, gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "1"))
	if err := hog.Wait(t, 20*time.Second); err != nil {
		t.Fatalf("hog: %v %s", err, hog.Stderr)
	}
	if err := tp.Wait(t, 20*time.Second); err != nil {
		t.Fatalf("trace: %v\n%s", err, tp.Stderr)
	}
	pid := float64(hog.Cmd.Process.Pid)
	seen := map[string]int{}
	sc := bufio.NewScanner(tp.Stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not JSON: %q", sc.Text())
		}
		if m["pid"] != pid {
			continue
		}
		typ, _ := m["type"].(string)
		seen[typ]++
		if m["comm"] != "gpuwork" || m["cgroup_id"] != float64(cg.ID) || m["cgroup"] != cg.Rel {
			t.Errorf("%s: comm %v cgroup %v %v, want gpuwork %d %s", typ, m["comm"], m["cgroup_id"], m["cgroup"], cg.ID, cg.Rel)
		}
		switch typ {
		case "tsg_alloc":
			if m["class"] != float64(0xA06C) || m["device"] != "1:7" {
				t.Errorf("tsg_alloc: %v", m)
			}
		case "channel_alloc":
			if m["class"] != float64(0xC86F) {
				t.Errorf("channel_alloc: %v", m)
			}
		case "work_submit_token", "rm_control":
			if m["ctrl_cmd"] == nil {
				t.Errorf("%s without ctrl_cmd: %v", typ, m)
			}
		case "launch":
			g, _ := m["grid"].([]any)
			if m["func"] != "cuLaunchKernel" || len(g) != 3 || g[0] != float64(2000) {
				t.Errorf("launch: %v", m)
			}
		case "sync":
			if m["func"] == nil || m["duration_ns"] == nil {
				t.Errorf("sync: %v", m)
			}
		}
	}
	for _, typ := range []string{"libcuda_open", "tsg_alloc", "channel_alloc", "work_submit_token", "launch", "sync", "ctx_create", "process_exit"} {
		if seen[typ] == 0 {
			t.Errorf("no %s event for the workload; saw %v", typ, seen)
		}
	}
	if seen["launch"] < 300 {
		t.Errorf("%d launches traced, want ≥ 300 of a 1 s hog of 2 ms kernels", seen["launch"])
	}
	if !strings.Contains(tp.Stderr.String(), " 0 lost") {
		t.Errorf("trace summary: %s", tp.Stderr)
	}
	if _, err := os.Stat(bpf.DefaultPinPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("trace left pins at %s", bpf.DefaultPinPath)
	}
}

func TestTraceStopsOnSIGINT(t *testing.T) {
	testutil.Privileged(t)
	trace := exec.Command(testutil.Bin(t, "gpuarb"), "trace", "--no-host-devices", "--device", "1:7=nvidia")
	tp := testutil.Start(t, nil, trace)
	waitFor(t, func() bool { return strings.Contains(tp.Stderr.String(), "tracing") }, 10*time.Second, "trace start")
	trace.Process.Signal(syscall.SIGINT)
	if err := tp.Wait(t, 5*time.Second); err != nil {
		t.Fatalf("trace after SIGINT: %v\n%s", err, tp.Stderr)
	}
	if !strings.Contains(tp.Stderr.String(), "events") {
		t.Errorf("no summary: %s", tp.Stderr)
	}
}

func waitFor(t *testing.T, cond func() bool, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
