package e2e

import (
	"math"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/meter"
)

// The meter's recording of a live run (gpuarb daemon --record-meter), two
// hogs at weights 1:3 steered on the simulated GPU's scheduler (their
// timeslices and pauses recorded with the events), played into a new
// meter, reads what the daemon read: each status taken during the run
// (its GPU time per tenant in the window, as the control step before it
// measured) matches, within 0.01 pp a tenant, the replayed figures of a
// settling in the 300 ms before it.
func TestMeterRecordingReplaysTheLiveFigures(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "rec-a"), "b": testutil.NewCgroup(t, "rec-b")}
	pol := writePolicy(t, "tenants:\n  - {name: a, cgroup: "+cgs["a"].Rel+", weight: 100}\n  - {name: b, cgroup: "+cgs["b"].Rel+", weight: 300}\n")
	rec := filepath.Join(t.TempDir(), "meter.jsonl")
	d := startDaemon(t, gpu, "--record-meter", rec)
	data, _ := os.ReadFile(pol)
	if err := d.ApplyPolicy(t.Context(), data); err != nil {
		t.Fatal(err)
	}
	testutil.Start(t, cgs["a"], gpu.Workload(t, "hog", "--duration", "8"))
	testutil.Start(t, cgs["b"], gpu.Workload(t, "loop", "--kernels-ms", "0.4,2", "--sync-every", "4", "--duration", "8"))

	type live struct {
		at     uint64             // CLOCK_MONOTONIC when the status came back
		shares map[uint64]float64 // per cgroup ID
	}
	var lives []live
	time.Sleep(2 * time.Second)
	for range 4 {
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		l := live{at: meter.MonotonicNow(), shares: map[uint64]float64{}}
		for _, tn := range st.Tenants {
			if (tn.Name == "a" || tn.Name == "b") && tn.CgroupID != 0 {
				// The meter's figure of the step's window (the status's
				// share is the arbiter's settled one).
				l.shares[tn.CgroupID] += float64(tn.GPUNS) / float64(st.WindowNS)
			}
		}
		if len(l.shares) != 2 {
			t.Fatalf("status without both tenants: %+v", st.Tenants)
		}
		lives = append(lives, l)
		time.Sleep(time.Second)
	}
	_ = d.Proc.Cmd.Process.Signal(syscall.SIGTERM) // it writes out the recording as it stops
	if err := d.Proc.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("daemon after SIGTERM: %v\n%s", err, d.Proc.Stderr)
	}

	f, err := os.Open(rec)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type replayed struct {
		at     uint64
		shares map[uint64]float64
	}
	var figures []replayed
	if _, err := meter.Play(f, meter.PlayOptions{Settled: func(m *meter.Meter, at uint64) {
		r := replayed{at: at, shares: map[uint64]float64{}}
		for _, tn := range m.Snapshot().Tenants {
			r.shares[tn.CgroupID] += tn.Share
		}
		figures = append(figures, r)
	}}); err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	t.Logf("recording: %.1f MB, %d settlings", float64(fi.Size())/1e6, len(figures))
	for i, l := range lives {
		best := math.Inf(1)
		for _, r := range figures {
			if r.at > l.at || r.at+uint64(300*time.Millisecond) < l.at {
				continue
			}
			off := 0.0
			for id, s := range l.shares {
				off = max(off, math.Abs(s-r.shares[id]))
			}
			best = min(best, off)
		}
		t.Logf("status %d: %v; the closest replayed figures differ by %.3f pp", i+1, l.shares, 100*best)
		if best > 0.0001 {
			t.Errorf("status %d (%v): no replayed settling in the 300 ms before it within 0.01 pp (closest %.3f pp)", i+1, l.shares, 100*best)
		}
	}
}
