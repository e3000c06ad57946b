package realgpu

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/lab"
)

// heldWindow is how long the latency-with-gpuarb step measures the probe
// beside the burners: 500 requests at 100 a second.
const heldWindow = 5 * time.Second

// holdModes are the daemon's --latency-holds the latency-with-gpuarb step
// runs under, one after the other.
var holdModes = []string{"evict", "deschedule", "off"}

// latencyWithGpuarb runs, under each of holdModes, the daemon steering the
// GPU's scheduler with latency.py as a latency tenant (SLO p99 3 ms) and
// two burners as two more tenants, each in its own cgroup: the probe's
// p50 and p99 alone (the burners not started yet) and beside them, the
// holds' count and start time as status reads them, and the burners'
// iterations. The latency step gives the same probe beside burners
// without gpuarb.
func (c *check) latencyWithGpuarb(ctx context.Context, s *Step) error {
	var parts []string
	for _, mode := range holdModes {
		values, summary, err := c.heldRun(ctx, mode)
		s.Values[mode] = values
		if err != nil {
			return fmt.Errorf("--latency-holds %s: %w", mode, err)
		}
		parts = append(parts, "--latency-holds "+mode+": "+summary)
	}
	s.Summary = "a latency tenant (1 ms requests, 100 a second) beside two burners under gpuarb; " + strings.Join(parts, "; ")
	return nil
}

// heldRecording is the file, in Options.Keep, of the meter's recording
// of the latency-with-gpuarb step's run without holds: on the check's
// H200 the meter read that latency tenant at twice its GPU time, and a
// recording lets the misreading be replayed where there is no GPU.
const heldRecording = "latency-with-gpuarb-off-meter.jsonl.gz"

// heldRun is one run of latencyWithGpuarb, its daemon under
// --latency-holds mode.
func (c *check) heldRun(ctx context.Context, mode string) (values map[string]any, summary string, err error) {
	values = map[string]any{}
	extra := []string{"--latency-holds", mode}
	recording := ""
	if mode == "off" && c.o.Keep != "" {
		recording = filepath.Join(c.o.Work, "meter.jsonl")
		extra = append(extra, "--record-meter", recording)
	}
	defer func() {
		if c.daemon != nil {
			_, stderr := c.daemon.Output()
			values["daemon_log"] = lastLines(stderr, 20)
		}
		c.stopDaemon() // the daemon flushes its recording as it stops
		if recording != "" {
			if err := gzipFile(recording, filepath.Join(c.o.Keep, heldRecording)); err != nil {
				values["meter_recording_error"] = err.Error()
			} else {
				values["meter_recording"] = heldRecording
			}
		}
	}()
	names := []string{"infer", "batch1", "batch2"}
	cgs, err := c.tenantCgroups(mode+"-infer", mode+"-batch1", mode+"-batch2")
	if err != nil {
		return values, "", err
	}
	policy := fmt.Sprintf("tenants:\n  - {name: infer, cgroup: %s, priority: latency, slo: {p99_sync_ms: 3}}\n", cgs[0].Rel)
	for i, n := range names[1:] {
		policy += fmt.Sprintf("  - {name: %s, cgroup: %s, weight: 100}\n", n, cgs[i+1].Rel)
	}
	client, err := c.startDaemon(ctx, policy, extra...)
	if err != nil {
		return values, "", err
	}
	probe, err := lab.Start(c.python(ctx, "latency.py", "1", "100", "120"), cgs[0].Path)
	if err != nil {
		return values, "", err
	}
	defer probe.Stop()
	if err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
		out, stderr := probe.Output()
		if probe.Done() {
			return false, fmt.Errorf("latency.py exited: %s", lastLine(stderr))
		}
		return strings.HasPrefix(out, "ready"), nil
	}); err != nil {
		return values, "", fmt.Errorf("latency.py ready: %w", err)
	}
	requests := func(from, to int64) []float64 {
		var lats []float64
		for _, pr := range progressLines(probe) {
			if pr.at >= from && pr.at < to {
				lats = append(lats, float64(pr.count)/1e6)
			}
		}
		return lats
	}
	from := monotonic() + int64(500*time.Millisecond)
	if err := lab.Sleep(ctx, latencyWindow+500*time.Millisecond); err != nil {
		return values, "", err
	}
	alone := requests(from, monotonic())
	if len(alone) == 0 {
		return values, "", fmt.Errorf("alone: no request completed")
	}
	var burners []*lab.Proc
	for i := range names[1:] {
		p, err := lab.Start(c.python(context.Background(), "burner.py", burnerMS), cgs[i+1].Path)
		if err != nil {
			return values, "", err
		}
		defer p.Stop()
		burners = append(burners, p)
	}
	if err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
		st, err := tenantsByName(ctx, client)
		return err == nil && st["batch1"].Share > 0 && st["batch2"].Share > 0, err
	}); err != nil {
		return values, "", fmt.Errorf("the burners metered: %w", err)
	}
	if err := lab.Sleep(ctx, 2*time.Second); err != nil {
		return values, "", err
	}
	from = monotonic()
	var perSecond []float64
	for i := 0; i < int(heldWindow/time.Second); i++ {
		at := monotonic()
		if err := lab.Sleep(ctx, time.Second); err != nil {
			return values, "", err
		}
		perSecond = append(perSecond, lab.Percentile(requests(at, monotonic()), 99))
	}
	to := monotonic()
	beside := requests(from, to)
	if len(beside) == 0 {
		return values, "", fmt.Errorf("beside the burners: no request completed")
	}
	st, err := client.Status(ctx)
	if err != nil {
		return values, "", err
	}
	var gpu api.GPU
	if len(st.GPUs) > 0 {
		gpu = st.GPUs[0]
	}
	var rate float64
	for _, b := range burners {
		rate += rateOf(progressLines(b), from, to)
	}
	var tenants []string
	for _, t := range st.Tenants {
		tenants = append(tenants, fmt.Sprintf("%s %.1f%% %s %dµs duty %.2f (%s)", t.Name, 100*t.Share, t.Actuator, t.TimesliceUS, t.Duty, t.Reason))
	}
	aloneP50, aloneP99 := lab.Percentile(alone, 50), lab.Percentile(alone, 99)
	p50, p99 := lab.Percentile(beside, 50), lab.Percentile(beside, 99)
	values["alone"] = map[string]any{"p50_ms": aloneP50, "p99_ms": aloneP99, "requests": len(alone)}
	values["beside"] = map[string]any{"p50_ms": p50, "p99_ms": p99, "requests": len(beside), "p99_ms_per_second": perSecond, "burner_rate": rate}
	values["gpu"], values["tenants"] = gpu, tenants
	summary = fmt.Sprintf("alone p50 %.2f ms, p99 %.2f ms; beside p50 %.2f ms (%.2f×), p99 %.2f ms (%.2f×; per second %s), the burners %.1f iterations/s; %d holds (%d cut, %.0f ms held), a hold's start %d µs against a bound of %d µs; %s",
		aloneP50, aloneP99, p50, p50/aloneP50, p99, p99/aloneP99, formatMS(perSecond), rate,
		gpu.LatencyHolds, gpu.LatencyHoldsCut, float64(gpu.LatencyHeldNS)/1e6, gpu.LatencyHoldStartUS, gpu.LatencyHoldBoundUS, strings.Join(tenants, "; "))
	return values, summary, nil
}

// tenantsByName is the daemon's tenants by name.
func tenantsByName(ctx context.Context, client *api.Client) (map[string]api.Tenant, error) {
	st, err := client.Status(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]api.Tenant{}
	for _, t := range st.Tenants {
		out[t.Name] = t
	}
	return out, nil
}

// gzipFile writes file src gzipped to dst, and removes src.
func gzipFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(out)
	_, err = io.Copy(zw, in)
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("gzip %s into %s: %w", src, dst, err)
	}
	return os.Remove(src)
}

func formatMS(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, "/")
}
