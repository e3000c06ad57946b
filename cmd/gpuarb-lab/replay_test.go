package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/meter"
)

// replay-meter plays a recording and prints, every interval of its clock,
// each tenant's share under the name the fuzzer's status log gives it.
func TestReplayMeterPrintsTheTenantsShares(t *testing.T) {
	const ms = uint64(time.Millisecond)
	var rec bytes.Buffer
	now := uint64(10_000 * ms)
	m := meter.New(meter.Config{Now: func() uint64 { return now }, Record: &rec})
	hdr := func(start, end uint64) ioctlspy.Header {
		return ioctlspy.Header{PID: 7, CgroupID: 42, Start: start, End: end, DurationNS: end - start}
	}
	// A loop of 1 ms bursts every 4 ms: 25% of the GPU.
	for i := range 1000 {
		t0 := 10_000*ms + uint64(i)*4*ms
		now = t0
		m.Observe(&ioctlspy.Launch{Header: hdr(t0, t0), Stream: 1, Function: 0xa, Grid: [3]uint32{1, 1, 1}})
		m.Observe(&ioctlspy.WaitBegin{Header: hdr(t0, t0), Of: ioctlspy.WaitStream, Handle: 1})
		now = t0 + ms
		m.Observe(&ioctlspy.Sync{Header: hdr(t0, t0+ms), Func: "cuStreamSynchronize", Of: ioctlspy.WaitStream, Handle: 1})
		if i%25 == 24 {
			m.Tick()
			m.Snapshot()
		}
	}
	if err := m.FlushRecording(); err != nil {
		t.Fatal(err)
	}
	status := filepath.Join(t.TempDir(), "seed-1-status.jsonl")
	if err := os.WriteFile(status, []byte(`{"at_s":1,"status":{"tenants":[{"name":"loop","cgroup_id":42}]}}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	names, err := tenantNames(status)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := replayMeter(&out, &rec, time.Second, names, 7); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var rows []string
	for _, l := range lines {
		if strings.Contains(l, "s | ") {
			rows = append(rows, l)
		}
	}
	if len(rows) < 3 {
		t.Fatalf("%d rows for 4 s every 1 s, want 3 or more:\n%s", len(rows), out.String())
	}
	if last := rows[len(rows)-1]; !strings.Contains(last, "loop  25.0%") {
		t.Errorf("last row %q, want loop at 25.0%%", last)
	}
	// --proofs 7: its first proof, then the rest, each at a launch's true
	// cost of 1 ms.
	var proofs []string
	for _, l := range lines {
		if strings.Contains(l, "pid 7 ") && strings.Contains(l, "proof of its stream") {
			proofs = append(proofs, l)
		}
	}
	if len(proofs) < 900 {
		t.Fatalf("%d proofs of pid 7, want 1000:\n%s", len(proofs), out.String())
	}
	if !strings.Contains(proofs[0], "first proof") || !strings.Contains(proofs[len(proofs)-1], "a launch costs 1.000 ms") {
		t.Errorf("pid 7's proofs: the first %q, the last %q; want its first proof first and a launch at 1 ms", proofs[0], proofs[len(proofs)-1])
	}
}
