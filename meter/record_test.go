package meter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A recording played into a new meter computes exactly what the recorded
// meter did: the same shares and costs at every Snapshot, with pauses,
// timeslices, the GPU's scheduling and ticks along the events.
func TestRecordingPlaysBackTheSameFigures(t *testing.T) {
	procs := []simProc{{cg: 100, kernels: []time.Duration{18 * time.Millisecond, 846 * time.Microsecond}, perSync: 5, run: 60 * time.Millisecond}}
	for range 2 {
		procs = append(procs, simProc{cg: 200, kernels: []time.Duration{348 * time.Microsecond, 42 * time.Microsecond}, perSync: 6})
	}
	procs = append(procs, simProc{cg: 300, kernels: []time.Duration{5 * time.Millisecond}})
	evs, _, end := simulateGPU(procs, 50*time.Microsecond, 0, 3, 1)

	figures := func(m *Meter) string {
		var lines []string
		for _, ts := range m.Snapshot().Tenants {
			lines = append(lines, fmt.Sprintf("cgroup %d: share %.9f queued %d ns, long-run %.9f", ts.CgroupID, ts.Share, ts.QueueNS, ts.LongRunShare))
		}
		slices.Sort(lines)
		return strings.Join(lines, "; ")
	}
	var rec bytes.Buffer
	clk := &clock{}
	m := New(Config{Now: clk.now, Record: &rec})
	m.SetScheduling(func(int) (time.Duration, bool) { return 1500 * time.Microsecond, true })
	var want []string
	paused := false
	next := uint64(10*1000*ms) + 100*ms
	for i, ev := range evs {
		if ev.Hdr().End >= next {
			clk.t = next
			m.Tick()
			want = append(want, figures(m))
			next += 100 * ms
		}
		if i == len(evs)/2 {
			m.Observe(Timeslice(4, 0, 3*time.Millisecond))
		}
		if p := simPaused(procs[0], ev.Hdr().End); p != paused {
			if p && i > len(evs)/2 { // the second half's pauses deschedule
				m.Observe(Deschedule(1, 0, ev.Hdr().End))
			} else {
				m.Observe(Pause(1, 0, p, ev.Hdr().End))
			}
			paused = p
		}
		clk.t = ev.Hdr().End
		m.Observe(ev)
	}
	clk.t = end
	m.Tick()
	want = append(want, figures(m))
	if err := m.FlushRecording(); err != nil {
		t.Fatal(err)
	}
	t.Logf("recording of %d events: %d bytes, %d lines; last figures %s", len(evs), rec.Len(), bytes.Count(rec.Bytes(), []byte("\n")), want[len(want)-1])

	// The recording as a meter before effects were observed wrote it: each
	// effect an operation of its own. It plays back the same.
	old := withEffectOperations(t, rec.Bytes())
	for name, r := range map[string][]byte{"recording": rec.Bytes(), "recording with effect operations": old} {
		var got []string
		if _, err := Play(bytes.NewReader(r), PlayOptions{Settled: func(p *Meter, _ uint64) { got = append(got, figures(p)) }}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s played back %d answers, recorded %d", name, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: answer %d played back: %s; recorded: %s", name, i+1, got[i], want[i])
			}
		}
	}
}

// withEffectOperations rewrites a recording's observed effects as the
// operations recordings had for them before (timeslice, paused,
// descheduled, released, frozen); it fails the test if there are none.
func withEffectOperations(t *testing.T, rec []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	enc, rewritten := json.NewEncoder(&out), 0
	dec := json.NewDecoder(bytes.NewReader(rec))
	for dec.More() {
		var l recordLine
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		if l.Op == opObserve && recordedKinds[l.Kind] != nil {
			ev, err := decodeEvent(l)
			if err != nil {
				t.Fatal(err)
			}
			h, was := ev.Hdr(), l
			switch e := ev.(type) {
			case *TimesliceSet:
				l = recordLine{Op: opTimeslice, PID: h.PID, NS: int64(e.Timeslice)}
			case *GroupPaused:
				l = recordLine{Op: opPaused, PID: h.PID, On: e.Paused, From: h.Start}
			case *GroupDescheduled:
				l = recordLine{Op: opDescheduled, PID: h.PID, From: h.Start}
			case *HoldReleased:
				l = recordLine{Op: opReleased, PID: h.PID, From: h.Start, To: h.End}
			case *CgroupFrozen:
				l = recordLine{Op: opFrozen, Cgroup: h.CgroupID, From: h.Start, To: h.End}
			}
			if l.Op != opObserve {
				l.Now = was.Now
				rewritten++
			}
		}
		if err := enc.Encode(l); err != nil {
			t.Fatal(err)
		}
	}
	if rewritten == 0 {
		t.Fatal("the recording has no effects to rewrite")
	}
	return out.Bytes()
}

// A recording that is not one is refused with the line it broke on.
func TestPlayRefusesABrokenRecording(t *testing.T) {
	const config = "{\"op\":\"config\",\"now\":1,\"config\":{\"Window\":1000000000}}\n"
	for _, tc := range []struct{ in, want string }{
		{"", "not a meter recording"},
		{"{\"op\":\"tick\",\"now\":1}\n", "not a meter recording"},
		{config + "{\"op\":\"tick\",\"now\":1}\nnot json\n", "line 3"},
		{config + "{\"op\":\"launder\",\"now\":1}\n", "line 2: unknown operation \"launder\""},
		{config + "{\"op\":\"observe\",\"now\":1,\"kind\":\"Launch\",\"event\":[1]}\n", "line 2: decode Launch"},
	} {
		if _, err := Play(strings.NewReader(tc.in), PlayOptions{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one that says %q", tc.in, err, tc.want)
		}
	}
}

// A write that fails ends the recording and FlushRecording says why; the
// meter measures on.
func TestFailedRecordingIsReported(t *testing.T) {
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now, Record: failingWriter{}})
	m.Observe(launchFn(1, 100, clk.t, 7, 0xa, 100))
	clk.t += 10 * ms
	m.Tick()
	if err := m.FlushRecording(); err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Errorf("FlushRecording: %v, want the write's error", err)
	}
	if got := byCgroup(m.Snapshot())[100].Share; got <= 0 {
		t.Errorf("share %.3f after the recording failed, want the launch's work", got)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }
