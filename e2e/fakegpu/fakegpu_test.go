package fakegpu_test

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/e2e/fakegpu"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

// window resets the ground truth, waits d and reads it.
func window(t *testing.T, sock string, d time.Duration) fakegpu.Stats {
	t.Helper()
	if _, err := fakegpu.ReadStats(sock, true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(d)
	st, err := fakegpu.ReadStats(sock, false)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// busyByCgroup sums context busy time per cgroup path on GPU 0.
func busyByCgroup(st fakegpu.Stats) map[string]uint64 {
	out := map[string]uint64{}
	for _, c := range st.GPUs[0].Contexts {
		out[c.Cgroup] += c.BusyNS
	}
	return out
}

func busyByPID(st fakegpu.Stats) map[int]uint64 {
	out := map[int]uint64{}
	for _, c := range st.GPUs[0].Contexts {
		out[c.PID] += c.BusyNS
	}
	return out
}

func share(part, total uint64) float64 { return float64(part) / float64(total) }

func TestEqualContextsShareEqually(t *testing.T) {
	for _, tc := range []struct {
		name      string
		a, b      []string
		wantA     float64
		tolerance float64
	}{
		{"two hogs", []string{"hog"}, []string{"hog"}, 0.5, 0.02},
		{"4 streams vs 1 stream", []string{"hog", "--streams", "4"}, []string{"hog"}, 0.5, 0.02},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpu := testutil.StartFakeGPU(t)
			a := testutil.Start(t, nil, gpu.Workload(t, append(tc.a, "--duration", "4")...))
			b := testutil.Start(t, nil, gpu.Workload(t, append(tc.b, "--duration", "4")...))
			time.Sleep(500 * time.Millisecond)
			st := window(t, gpu.Socket, 2*time.Second)
			byPID := busyByPID(st)
			ta, tb := byPID[a.Cmd.Process.Pid], byPID[b.Cmd.Process.Pid]
			got := share(ta, ta+tb)
			t.Logf("A %.1f ms, B %.1f ms: A's share %.4f; GPU busy %.1f%% of %.2fs", float64(ta)/1e6, float64(tb)/1e6,
				got, 100*share(st.GPUs[0].BusyNS, st.ElapsedNS), float64(st.ElapsedNS)/1e9)
			if math.Abs(got-tc.wantA) > tc.tolerance {
				t.Errorf("A's share %.4f, want %.2f ± %.2f", got, tc.wantA, tc.tolerance)
			}
			if u := share(st.GPUs[0].BusyNS, st.ElapsedNS); u < 0.97 {
				t.Errorf("GPU busy %.3f of the window with two hogs, want ≥ 0.97", u)
			}
		})
	}
}

func TestProcessesBuyTime(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	cgA := testutil.NewCgroup(t, "tenant-a")
	cgB := testutil.NewCgroup(t, "tenant-b")
	for i := 0; i < 4; i++ {
		testutil.Start(t, cgA, gpu.Workload(t, "hog", "--duration", "4"))
	}
	testutil.Start(t, cgB, gpu.Workload(t, "hog", "--duration", "4"))
	time.Sleep(500 * time.Millisecond)
	st := window(t, gpu.Socket, 2*time.Second)
	by := busyByCgroup(st)
	got := share(by[cgA.Rel], by[cgA.Rel]+by[cgB.Rel])
	t.Logf("tenant with 4 processes: %.4f of the GPU (time-slicing is fair per context, not per tenant)", got)
	if math.Abs(got-0.8) > 0.03 {
		t.Errorf("4-process tenant share %.4f, want 0.80 ± 0.03", got)
	}
}

// inferP50 runs a closed-loop infer beside a hog of 20 ms kernels of one
// block each (one wave) and returns the infer median latency in ms.
func inferP50(t *testing.T, args ...string) float64 {
	t.Helper()
	gpu := testutil.StartFakeGPU(t, args...)
	testutil.Start(t, nil, gpu.Workload(t, "hog", "--kernel-ms", "20", "--grid", "1", "--duration", "4"))
	time.Sleep(300 * time.Millisecond)
	inf := testutil.Start(t, nil, gpu.Workload(t, "infer", "--kernels", "1", "--kernel-ms", "0.25", "--duration", "2"))
	if err := inf.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("infer: %v: %s", err, inf.Stderr)
	}
	var sum struct {
		P50 float64 `json:"latency_p50_ms"`
	}
	if err := json.Unmarshal(lastLine(inf.Stdout.String()), &sum); err != nil {
		t.Fatal(err)
	}
	return sum.P50
}

func TestRunToCompletionBlocksShortKernels(t *testing.T) {
	pre := inferP50(t)
	rtc := inferP50(t, "--no-preempt")
	t.Logf("short-kernel median beside 20 ms kernels: preemptive %.2f ms, run-to-completion %.2f ms", pre, rtc)
	if pre > rtc/2 {
		t.Errorf("preemptive GPU: median %.2f ms, want well below run-to-completion's %.2f ms", pre, rtc)
	}
	if rtc < 5 {
		t.Errorf("run-to-completion GPU: median %.2f ms, want ≥ 5 ms (waits out part of a 20 ms kernel)", rtc)
	}
}

func TestBusyIsSumOfContexts(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	for _, w := range [][]string{{"hog", "--kernel-ms", "3"}, {"storm", "--rate", "5000"}, {"graph"}, {"frames"}, {"infer", "--rate", "300"}} {
		testutil.Start(t, nil, gpu.Workload(t, append(w, "--duration", "3")...))
	}
	time.Sleep(300 * time.Millisecond)
	st := window(t, gpu.Socket, time.Second)
	var sum uint64
	for _, c := range st.GPUs[0].Contexts {
		sum += c.BusyNS
	}
	if sum != st.GPUs[0].BusyNS {
		t.Errorf("sum of context busy %d ns != GPU busy %d ns", sum, st.GPUs[0].BusyNS)
	}
	if st.GPUs[0].BusyNS > st.ElapsedNS+uint64(time.Millisecond) {
		t.Errorf("GPU busy %d ns exceeds the window %d ns", st.GPUs[0].BusyNS, st.ElapsedNS)
	}
	if len(st.GPUs[0].Contexts) != 5 {
		t.Errorf("%d contexts, want 5", len(st.GPUs[0].Contexts))
	}
}

func lastLine(s string) []byte {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return []byte(lines[len(lines)-1])
}

func TestWorkloadSummaries(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	for _, tc := range []struct {
		args  []string
		check func(t *testing.T, m map[string]any)
	}{
		{[]string{"hog", "--kernel-ms", "5"}, func(t *testing.T, m map[string]any) {
			if m["kernels"].(float64) < 100 {
				t.Errorf("hog ran %v kernels of 5 ms in 1 s", m["kernels"])
			}
		}},
		{[]string{"infer", "--rate", "100"}, func(t *testing.T, m map[string]any) {
			if r := m["requests"].(float64); math.Abs(r-100) > 5 {
				t.Errorf("infer at 100/s served %v requests in 1 s", r)
			}
			// The median, not the tail: a VM's scheduling hiccups reach p99.
			p50, p99 := m["latency_p50_ms"].(float64), m["latency_p99_ms"].(float64)
			if p50 <= 0.99 || p50 > 5 || p99 < p50 {
				t.Errorf("infer alone: p50 %v ms, p99 %v ms for 1 ms of GPU work", p50, p99)
			}
		}},
		{[]string{"frames", "--fps", "60"}, func(t *testing.T, m map[string]any) {
			if f := m["fps"].(float64); math.Abs(f-60) > 3 {
				t.Errorf("frames alone: %v fps, want 60", f)
			}
		}},
		{[]string{"storm", "--rate", "10000"}, func(t *testing.T, m map[string]any) {
			if r := m["launches_per_s"].(float64); math.Abs(r-10000) > 1000 {
				t.Errorf("storm: %v launches/s, want 10000", r)
			}
		}},
		{[]string{"graph"}, func(t *testing.T, m map[string]any) {
			if m["kernels"].(float64) < 400 {
				t.Errorf("graph ran %v kernels", m["kernels"])
			}
		}},
		{[]string{"greedy", "--kernel-ms", "1"}, func(t *testing.T, m map[string]any) {
			if m["kernels"].(float64) < 1000 {
				t.Errorf("greedy queued %v kernels", m["kernels"])
			}
		}},
		{[]string{"fork", "--children", "2"}, func(t *testing.T, m map[string]any) {
			if m["children"].(float64) != 2 || m["failed"].(float64) != 0 {
				t.Errorf("fork: %v", m)
			}
		}},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			p := testutil.Start(t, nil, gpu.Workload(t, append(tc.args, "--duration", "1", "--interval", "0.5")...))
			if err := p.Wait(t, 30*time.Second); err != nil {
				t.Fatalf("%v: %s", err, p.Stderr)
			}
			lines := strings.Split(strings.TrimSpace(p.Stdout.String()), "\n")
			var intervals int
			for _, l := range lines {
				var m map[string]any
				if err := json.Unmarshal([]byte(l), &m); err != nil {
					t.Fatalf("line %q is not JSON: %v", l, err)
				}
				if _, ok := m["t"]; ok {
					intervals++
				}
			}
			var sum map[string]any
			if err := json.Unmarshal(lastLine(p.Stdout.String()), &sum); err != nil || sum["summary"] != true {
				t.Fatalf("no summary line: %q", p.Stdout.String())
			}
			if tc.args[0] != "fork" && intervals == 0 {
				t.Errorf("--interval 0.5 printed no interval line")
			}
			tc.check(t, sum)
		})
	}
}

func TestDeviceGoneIsAnError(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			gpu := testutil.StartFakeGPU(t)
			hog := testutil.Start(t, nil, gpu.Workload(t, "hog", "--kernel-ms", "50", "--duration", "30"))
			inf := testutil.Start(t, nil, gpu.Workload(t, "infer", "--duration", "30"))
			time.Sleep(500 * time.Millisecond)
			gpu.Proc.Cmd.Process.Signal(sig)
			for _, p := range []*testutil.Proc{hog, inf} {
				err := p.Wait(t, 3*time.Second)
				if err == nil {
					t.Errorf("%s exited 0 after the device went away", p.Cmd.Args[1])
				}
				if !strings.Contains(p.Stderr.String(), "CUDA_ERROR_DEVICE_UNAVAILABLE") {
					t.Errorf("%s stderr %q, want CUDA_ERROR_DEVICE_UNAVAILABLE", p.Cmd.Args[1], p.Stderr)
				}
			}
		})
	}
}

func TestABI(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	lib := testutil.Bin(t, "libcuda.so.1")
	build := func(name string) string {
		exe := filepath.Join(t.TempDir(), name)
		cmd := exec.Command("cc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", exe, "abitest/"+name+".c",
			"-L"+filepath.Dir(lib), "-l:libcuda.so.1", "-Wl,-rpath,"+filepath.Dir(lib), "-ldl")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", name, err, out)
		}
		return exe
	}
	abi, runtime := build("abi_test"), build("runtime_test")
	for _, tc := range []struct {
		name   string
		exe    string
		args   []string
		socket string
	}{
		{"device", abi, nil, gpu.Socket},
		{"no device", abi, []string{"nodevice"}, filepath.Join(t.TempDir(), "none.sock")},
		{"runtime", runtime, nil, gpu.Socket},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.exe, tc.args...)
			cmd.Env = append(os.Environ(), "FAKEGPU_SOCKET="+tc.socket)
			out, err := cmd.CombinedOutput()
			t.Logf("%s", out)
			if err != nil {
				t.Fatalf("%s: %v", filepath.Base(tc.exe), err)
			}
			if !strings.Contains(string(out), " 0 failed") {
				t.Fatalf("%s did not report 0 failures", filepath.Base(tc.exe))
			}
		})
	}
	st, err := fakegpu.ReadStats(gpu.Socket, false)
	if err != nil {
		t.Fatal(err)
	}
	var copies uint64
	for _, c := range st.GPUs[0].Contexts {
		copies += c.Copies
		if c.Alive || c.MemBytes != 0 {
			t.Errorf("context %d after exit: alive %v, %d bytes held", c.ID, c.Alive, c.MemBytes)
		}
	}
	// abi_test's 6, runtime_test's 4 (a memcpy, two memsets, a peer copy).
	if copies != 6+4 || st.GPUs[0].CopyBusyNS == 0 {
		t.Errorf("copy engine ran %d copies (%d ns), want the tests' 10", copies, st.GPUs[0].CopyBusyNS)
	}
}

func TestStatsCLI(t *testing.T) {
	gpu := testutil.StartFakeGPU(t, "--gpus", "2")
	testutil.Start(t, nil, gpu.Workload(t, "hog", "--gpu", "1", "--duration", "1")).Wait(t, 10*time.Second)
	out, err := exec.Command(testutil.Bin(t, "fakegpud"), "stats", "--json", "--socket", gpu.Socket).Output()
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		GPUs []struct {
			Index    int    `json:"index"`
			BusyNS   uint64 `json:"busy_ns"`
			Contexts []struct {
				PID     int    `json:"pid"`
				Cgroup  string `json:"cgroup"`
				BusyNS  uint64 `json:"busy_ns"`
				Kernels uint64 `json:"kernels"`
			} `json:"contexts"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("stats --json: %v: %s", err, out)
	}
	if len(st.GPUs) != 2 || st.GPUs[1].Index != 1 || len(st.GPUs[1].Contexts) != 1 || len(st.GPUs[0].Contexts) != 0 {
		t.Fatalf("stats: %s", out)
	}
	c := st.GPUs[1].Contexts[0]
	if c.BusyNS < 500e6 || c.BusyNS != st.GPUs[1].BusyNS || c.Kernels == 0 || c.Cgroup == "" {
		t.Errorf("context on GPU 1: %+v", c)
	}
	human, err := exec.Command(testutil.Bin(t, "fakegpud"), "stats", "--socket", gpu.Socket).Output()
	if err != nil || !bufio.NewScanner(strings.NewReader(string(human))).Scan() || !strings.Contains(string(human), "GPU 1") {
		t.Errorf("stats table: %v %s", err, human)
	}
}

func TestLayoutMatchesC(t *testing.T) {
	src := filepath.Join(t.TempDir(), "off.c")
	prog := `#include <stdio.h>
#include <stddef.h>
#include "fakegpu_abi.h"
int main(void){printf("%zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(struct fg_entry), sizeof(struct fg_channel),
 offsetof(struct fg_channel, ring), sizeof(struct fg_ctx_shm), offsetof(struct fg_ctx_shm, ch),
 offsetof(struct fg_ctx_shm, event_ts), sizeof(struct fg_req), sizeof(struct fg_resp));}`
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), "off")
	abs, _ := filepath.Abs("libcuda")
	if out, err := exec.Command("cc", "-I", abs, "-o", exe, src).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	out, err := exec.Command(exe).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := fakegpu.LayoutForTest()
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("C layout %q, Go layout %q", got, want)
	}
}

// contextOf returns the context of pid on GPU 0.
func contextOf(t *testing.T, st fakegpu.Stats, pid int) fakegpu.ContextStats {
	t.Helper()
	for _, c := range st.GPUs[0].Contexts {
		if c.PID == pid {
			return c
		}
	}
	t.Fatalf("no context of pid %d in %+v", pid, st.GPUs[0].Contexts)
	return fakegpu.ContextStats{}
}

// Timeslices are the hardware's proportional share: the realistic driver's
// libcuda sets 2048µs on every other context, which then gets twice the
// time of one with the default 1024µs. (Setting timeslices through RM
// controls is tested with the actuator, in gpusched.)
func TestDriverTimeslicesShareInProportion(t *testing.T) {
	gpu := testutil.StartFakeGPU(t, "--realism", "--jitter", "0", "--contention", "0")
	a := testutil.Start(t, nil, gpu.Workload(t, "hog", "--kernel-ms", "5", "--duration", "5"))
	time.Sleep(200 * time.Millisecond)
	b := testutil.Start(t, nil, gpu.Workload(t, "hog", "--kernel-ms", "5", "--duration", "5"))
	time.Sleep(300 * time.Millisecond)
	st := window(t, gpu.Socket, 2*time.Second)
	ca, cb := contextOf(t, st, a.Cmd.Process.Pid), contextOf(t, st, b.Cmd.Process.Pid)
	got := share(ca.BusyNS, ca.BusyNS+cb.BusyNS)
	t.Logf("timeslices %dµs / %dµs: first hog %.3f of the GPU", ca.TimesliceUS, cb.TimesliceUS, got)
	if ca.TimesliceUS != 1024 || cb.TimesliceUS != 2048 || math.Abs(got-1.0/3) > 0.03 {
		t.Errorf("first hog's share %.3f with slices %d/%d µs, want 1/3 ± 0.03 with 1024/2048", got, ca.TimesliceUS, cb.TimesliceUS)
	}
}

// The realism's effects a meter cannot know: jitter keeps a kernel's mean,
// contention slows kernels while another group has work, and a short
// request waits out the rest of a wave when only wave boundaries preempt.
func TestRealism(t *testing.T) {
	throughput := func(args ...string) (alone, shared float64) {
		gpu := testutil.StartFakeGPU(t, args...)
		a := testutil.Start(t, nil, gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "4", "--interval", "0.5"))
		time.Sleep(1200 * time.Millisecond)
		testutil.Start(t, nil, gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "3"))
		if err := a.Wait(t, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		var lines []struct {
			T      float64 `json:"t"`
			GPUMS  float64 `json:"gpu_ms"`
			Sumary bool    `json:"summary"`
		}
		for _, l := range strings.Split(strings.TrimSpace(a.Stdout.String()), "\n") {
			var x struct {
				T      float64 `json:"t"`
				GPUMS  float64 `json:"gpu_ms"`
				Sumary bool    `json:"summary"`
			}
			if json.Unmarshal([]byte(l), &x) == nil && !x.Sumary {
				lines = append(lines, x)
			}
		}
		if len(lines) < 6 {
			t.Fatalf("hog printed %d interval lines: %s", len(lines), a.Stdout.String())
		}
		// GPU ms of kernels completed per 0.5 s: alone (0.5–1 s) and with the
		// second hog (2–3 s).
		return lines[1].GPUMS, (lines[3].GPUMS + lines[4].GPUMS) / 2
	}
	aloneOff, sharedOff := throughput()
	aloneOn, sharedOn := throughput("--contention", "0.2", "--jitter", "0.2")
	t.Logf("kernel ms done per 0.5 s, alone / beside a second hog: realism off %.0f / %.0f, jitter 0.2 and contention 0.2 %.0f / %.0f",
		aloneOff, sharedOff, aloneOn, sharedOn)
	if math.Abs(aloneOn-aloneOff) > 0.1*aloneOff {
		t.Errorf("alone, jitter changed the throughput: %.0f vs %.0f ms per 0.5 s", aloneOn, aloneOff)
	}
	if r := (sharedOn / aloneOn) / (sharedOff / aloneOff); r > 0.92 || r < 0.75 {
		t.Errorf("contention 0.2 with one co-runner left %.2f of the shared throughput, want about 1/1.2", r)
	}

	waveP50 := inferP50(t, "--wave-preempt")
	freeP50 := inferP50(t)
	t.Logf("infer median beside 20 ms kernels (1 block: one wave): wave preemption %.2f ms, anywhere %.2f ms", waveP50, freeP50)
	if waveP50 < 2*freeP50 || waveP50 < 5 {
		t.Errorf("wave preemption: median %.2f ms, want well above %.2f ms (waits out the one-wave 20 ms kernel)", waveP50, freeP50)
	}
}
