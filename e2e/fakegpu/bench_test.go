package fakegpu_test

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/internal/testutil"
)

// cpuSeconds returns a process's user+system CPU time from /proc/PID/stat.
func cpuSeconds(b *testing.B, pid int) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (which may hold spaces): utime is the 12th.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// BenchmarkSimulatorCPU reports fakegpud's CPU use, in % of one core,
// idle, under storm at 10k launches/s, beside two hogs, and beside two
// hogs with 500 mostly idle contexts (inference at one request a second:
// every doorbell must not cost every context's every channel).
func BenchmarkSimulatorCPU(b *testing.B) {
	for _, tc := range []struct {
		name string
		load []string
		idle int // contexts of one request a second beside the load
	}{
		{"idle", nil, 0},
		{"10k-launches-per-s", []string{"storm", "--rate", "10000", "--duration", "3"}, 0},
		{"two-hogs", []string{"hog", "--duration", "3"}, 0},
		{"two-hogs-500-idle-contexts", []string{"hog", "--duration", "30"}, 500},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var pct float64
			for i := 0; i < b.N; i++ {
				gpu := testutil.StartFakeGPU(b)
				var p *testutil.Proc
				if tc.load != nil {
					p = testutil.Start(b, nil, gpu.Workload(b, tc.load...))
					if tc.load[0] == "hog" {
						testutil.Start(b, nil, gpu.Workload(b, tc.load...))
					}
				}
				for range tc.idle {
					testutil.Start(b, nil, gpu.Workload(b, "infer", "--rate", "1", "--kernels", "1", "--duration", "30"))
				}
				time.Sleep(500 * time.Millisecond)
				pid := gpu.Proc.Cmd.Process.Pid
				c0, t0 := cpuSeconds(b, pid), time.Now()
				time.Sleep(2 * time.Second)
				pct += 100 * (cpuSeconds(b, pid) - c0) / time.Since(t0).Seconds()
				if p != nil && p.Done() {
					b.Fatalf("workload ended early: %s", p.Stderr)
				}
			}
			b.ReportMetric(pct/float64(b.N), "%cpu")
		})
	}
}

// BenchmarkKernelTiming runs 1 ms kernels one at a time (launch, sync) and
// reports how much later than 1 ms the sync returns: the doorbell poll,
// the device's wake-up overshoot and the client's wake-up together.
// With FAKEGPU_SYNC=spin the client does not sleep, which leaves the
// device's own lateness (doorbell wake-up and completion overshoot).
func BenchmarkKernelTiming(b *testing.B) {
	b.Run("futex-sync", func(b *testing.B) { kernelTiming(b, "futex") })
	b.Run("spin-sync", func(b *testing.B) { kernelTiming(b, "spin") })
}

func kernelTiming(b *testing.B, sync string) {
	gpu := testutil.StartFakeGPU(b)
	var p50, p99 float64
	for i := 0; i < b.N; i++ {
		cmd := gpu.Workload(b, "infer", "--kernels", "1", "--kernel-ms", "1", "--duration", "2")
		cmd.Env = append(cmd.Env, "FAKEGPU_SYNC="+sync)
		p := testutil.Start(b, nil, cmd)
		if err := p.Wait(b, 20*time.Second); err != nil {
			b.Fatal(err)
		}
		var s struct {
			P50 float64 `json:"latency_p50_ms"`
			P99 float64 `json:"latency_p99_ms"`
		}
		if err := json.Unmarshal(lastLine(p.Stdout.String()), &s); err != nil {
			b.Fatal(err)
		}
		p50 += (s.P50 - 1) * 1000
		p99 += (s.P99 - 1) * 1000
	}
	b.ReportMetric(p50/float64(b.N), "µs-late-p50")
	b.ReportMetric(p99/float64(b.N), "µs-late-p99")
}
