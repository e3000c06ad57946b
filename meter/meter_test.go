package meter

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/nvrm"
)

const (
	ms = uint64(time.Millisecond)
	us = uint64(time.Microsecond)
)

type clock struct{ t uint64 }

func (c *clock) now() uint64 { return c.t }

func hdr(pid uint32, cg uint64, start, end uint64) ioctlspy.Header {
	return ioctlspy.Header{PID: pid, CgroupID: cg, Start: start, End: end, DurationNS: end - start}
}

func launch(pid uint32, cg, t, stream uint64) ioctlspy.Event {
	return &ioctlspy.Launch{Header: hdr(pid, cg, t, t), Stream: stream, Grid: [3]uint32{1 << 20, 1, 1}}
}

func syncEv(pid uint32, cg uint64, fn string, handle, start, end uint64) ioctlspy.Event {
	of := map[string]ioctlspy.WaitTarget{"cuStreamSynchronize": ioctlspy.WaitStream, "cuCtxSynchronize": ioctlspy.WaitContext, "cuEventSynchronize": ioctlspy.WaitEvent}[fn]
	return &ioctlspy.Sync{Header: hdr(pid, cg, start, end), Func: fn, Of: of, Handle: handle}
}

func near(a, b float64) bool { return math.Abs(a-b) < 0.005 }

func ptr[T any](v T) *T { return &v }

func byCgroup(s Snapshot) map[uint64]TenantStats {
	out := map[uint64]TenantStats{}
	for _, t := range s.Tenants {
		out[t.CgroupID] = t
	}
	return out
}

// playedShares feeds evs to a new meter, each at its end's clock, settles
// it at end and returns its tenants by cgroup.
func playedShares(evs []ioctlspy.Event, end uint64) map[uint64]TenantStats {
	clk := &clock{}
	m := New(Config{Now: clk.now})
	for _, ev := range evs {
		clk.t = ev.Hdr().End
		m.Observe(ev)
	}
	clk.t = end
	m.Tick()
	return byCgroup(m.Snapshot())
}

func TestProcessorSharing(t *testing.T) {
	base := 10 * 1000 * ms
	for _, tc := range []struct {
		name   string
		events []ioctlspy.Event
		want   map[uint64]float64 // cgroup -> share of the 1 s window ending at base+1s
		busy   float64
	}{
		{"two backlogged contexts", []ioctlspy.Event{
			launch(1, 100, base-5*ms, 7), launch(2, 200, base-3*ms, 9),
		}, map[uint64]float64{100: 0.5, 200: 0.5}, 1},
		{"one request of 100 ms", []ioctlspy.Event{
			launch(1, 100, base+200*ms, 7), syncEv(1, 100, "cuStreamSynchronize", 7, base+210*ms, base+300*ms),
		}, map[uint64]float64{100: 0.1}, 0.1},
		{"overlap", []ioctlspy.Event{
			launch(1, 100, base, 7), launch(2, 200, base+500*ms, 9),
		}, map[uint64]float64{100: 0.75, 200: 0.25}, 1},
		// The sync drains stream 8 at 200 ms, where the replay (one kernel
		// at a time) still ran stream 7's: the proof covers both launches,
		// and teaches what its wait bounds, 100 ms for the two; stream 7's
		// launch, rescaled with it, runs 50 ms more.
		{"another stream's sync drains only its stream", []ioctlspy.Event{
			launch(1, 100, base, 7), launch(1, 100, base, 8),
			syncEv(1, 100, "cuStreamSynchronize", 8, base+100*ms, base+200*ms),
		}, map[uint64]float64{100: 0.25}, 0.25},
		{"context sync drains every stream", []ioctlspy.Event{
			launch(1, 100, base, 7), launch(1, 100, base, 8),
			syncEv(1, 100, "cuCtxSynchronize", 0, base+100*ms, base+400*ms),
		}, map[uint64]float64{100: 0.4}, 0.4},
		{"an event sync never recorded teaches nothing", []ioctlspy.Event{
			launch(1, 100, base, 7), syncEv(1, 100, "cuEventSynchronize", 0x55, base+100*ms, base+400*ms),
		}, map[uint64]float64{100: 1}, 1},
		{"exit ends the work", []ioctlspy.Event{
			launch(1, 100, base, 7), &ioctlspy.ProcessExit{Header: hdr(1, 100, base+600*ms, base+600*ms)},
		}, map[uint64]float64{100: 0.6}, 0.6},
		{"processes of a tenant add up", []ioctlspy.Event{
			launch(1, 100, base, 7), launch(2, 100, base, 7), launch(3, 100, base, 7), launch(4, 200, base, 7),
		}, map[uint64]float64{100: 0.75, 200: 0.25}, 1},
		{"GPUs do not share", []ioctlspy.Event{
			&ioctlspy.ContextCreated{Header: hdr(2, 200, base-ms, base-ms), Device: 1},
			launch(1, 100, base, 7), launch(2, 200, base, 7),
		}, map[uint64]float64{100: 1, 200: 1}, 1},
		// A process given only GPU 1 (CUDA_VISIBLE_DEVICES=1) names it
		// ordinal 0; its channel group is on device 1, beside pid 3.
		{"a context is on its channel group's GPU", []ioctlspy.Event{
			&ioctlspy.TSGAllocated{ObjectAllocated: ioctlspy.ObjectAllocated{Header: hdr(1, 100, base-3*ms/2, base-3*ms/2)}, GPU: ptr(uint32(1))},
			&ioctlspy.ContextCreated{Header: hdr(1, 100, base-2*ms, base-ms), Func: "cuCtxCreate_v2", Ctx: 0xc1, Device: 0},
			&ioctlspy.ContextCreated{Header: hdr(3, 300, base-2*ms, base-ms), Func: "cuCtxCreate_v2", Ctx: 0xc3, Device: 1},
			launch(1, 100, base, 7), launch(2, 200, base, 7), launch(3, 300, base, 7),
		}, map[uint64]float64{100: 0.5, 200: 1, 300: 0.5}, 1},
		{"nouveau submissions and waits", []ioctlspy.Event{
			&ioctlspy.Submission{Header: hdr(1, 100, base, base+ms)},
			syncEv(1, 100, "NOUVEAU_GEM_CPU_PREP", 3, base+100*ms, base+250*ms),
		}, map[uint64]float64{100: 0.25}, 0.25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{t: base + 1000*ms}
			m := New(Config{Now: clk.now})
			for _, ev := range tc.events {
				m.Observe(ev)
			}
			snap := m.Snapshot()
			got := byCgroup(snap)
			for cg, want := range tc.want {
				if !near(got[cg].Share, want) {
					t.Errorf("cgroup %d share %.4f, want %.4f", cg, got[cg].Share, want)
				}
			}
			var busy float64
			for _, g := range snap.GPUs {
				busy = max(busy, g.BusyShare)
			}
			if !near(busy, tc.busy) {
				t.Errorf("GPU busy %.4f, want %.4f", busy, tc.busy)
			}
		})
	}
}

func TestQueueing(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base + 1000*ms}
	m := New(Config{Now: clk.now})
	m.Observe(launch(1, 100, base, 7))
	m.Observe(launch(2, 200, base+500*ms, 9))
	got := byCgroup(m.Snapshot())
	// From 0.5 s both are backlogged: each waits half of the remaining 0.5 s.
	for _, cg := range []uint64{100, 200} {
		if q := float64(got[cg].QueueNS) / 1e9; math.Abs(q-0.25) > 0.005 {
			t.Errorf("cgroup %d queued %.3f s, want 0.25", cg, q)
		}
	}
}

func TestRatesAndExit(t *testing.T) {
	clk := &clock{t: 5000 * ms}
	m := New(Config{Now: clk.now})
	for i := uint64(0); i < 300; i++ {
		m.Observe(launch(1, 100, 4000*ms+i*ms, 0))
	}
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 0, 4500*ms, 4600*ms))
	ts := byCgroup(m.Snapshot())[100]
	if ts.LaunchesPerS != 300 || ts.SyncsPerS != 1 || ts.Processes != 1 || ts.Busy {
		t.Errorf("%+v", ts)
	}
	m.Observe(&ioctlspy.ProcessExit{Header: hdr(1, 100, 4900*ms, 4900*ms)})
	ts = byCgroup(m.Snapshot())[100]
	if ts.Processes != 0 {
		t.Errorf("after exit: %+v", ts)
	}
	// Once its window is past, an exited process is forgotten.
	clk.t = 7000 * ms
	m.Tick()
	if n := len(m.Snapshot().Tenants); n != 0 {
		t.Errorf("%d tenants after the window passed", n)
	}
}

func TestLongRunShare(t *testing.T) {
	clk := &clock{t: 1000 * ms}
	m := New(Config{Now: clk.now, HalfLife: time.Second})
	m.Observe(launch(1, 100, 1000*ms, 0))
	m.Observe(launch(2, 200, 1000*ms, 0))
	m.Tick()
	for i := 0; i < 100; i++ { // 10 s of 100 ms ticks: ten half-lives
		clk.t += 100 * ms
		m.Tick()
	}
	got := byCgroup(m.Snapshot())
	if math.Abs(got[100].LongRunShare-0.5) > 0.001 || math.Abs(got[200].LongRunShare-0.5) > 0.001 {
		t.Errorf("long-run shares %.4f %.4f, want 0.5", got[100].LongRunShare, got[200].LongRunShare)
	}
	m.Observe(syncEv(2, 200, "cuCtxSynchronize", 0, clk.t, clk.t))
	for i := 0; i < 10; i++ { // one half-life with tenant 200 idle
		clk.t += 100 * ms
		m.Tick()
	}
	got = byCgroup(m.Snapshot())
	if math.Abs(got[200].LongRunShare-0.25) > 0.01 || math.Abs(got[100].LongRunShare-0.75) > 0.01 {
		t.Errorf("after a half-life: %.4f %.4f, want 0.75 0.25", got[100].LongRunShare, got[200].LongRunShare)
	}
}

// A context of tiny kernels beside a hog: its syncs wait up to a slice of
// the hog's, which proves no work of its own, so its estimate must stay
// near its true 2%, not grow towards its round-robin half.
func TestTinyWorkBesideHog(t *testing.T) {
	us := uint64(time.Microsecond)
	var evs []ioctlspy.Event
	// The hog: 8 kernels of 20 ms, then a sync that returns when they ran,
	// slowed 2% by the tiny kernels.
	for burst := uint64(0); burst < 30; burst++ {
		start := 1000*ms + burst*164*ms
		for i := 0; i < 8; i++ {
			evs = append(evs, &ioctlspy.Launch{Header: hdr(1, 100, start, start), Stream: 1, Grid: [3]uint32{20000, 1, 1}})
		}
		evs = append(evs, syncEv(1, 100, "cuStreamSynchronize", 1, start+10*us, start+164*ms))
	}
	// 1000 kernels of 1 µs per 50 ms; each sync waits for the hog's slice
	// to end (the phase varies) and then for its own queued work.
	for burst := uint64(0); burst < 95; burst++ {
		start := 1000*ms + burst*50*ms
		for i := uint64(0); i < 1000; i++ {
			evs = append(evs, &ioctlspy.Launch{Header: hdr(2, 200, start+i*50*us, start+i*50*us), Stream: 3, Grid: [3]uint32{1, 1, 1}})
		}
		wait := 100*us + (burst*370*us)%(2*ms)
		evs = append(evs, syncEv(2, 200, "cuStreamSynchronize", 3, start+50*ms, start+50*ms+wait))
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Hdr().End < evs[j].Hdr().End })
	clk := &clock{}
	m := New(Config{Now: clk.now})
	for _, ev := range evs {
		clk.t = ev.Hdr().End
		m.Observe(ev)
	}
	got := byCgroup(m.Snapshot())
	t.Logf("shares: tiny %.4f, hog %.4f", got[200].Share, got[100].Share)
	if s := got[200].Share; s > 0.03 {
		t.Errorf("tiny-kernel context estimated at %.3f of the GPU, want ≤ 0.03 (true 0.02)", s)
	}
	if s := got[100].Share; s < 0.95 {
		t.Errorf("hog estimated at %.3f, want ≥ 0.95 (true 0.98)", s)
	}
}

// hogEvents plays a hog alone on the GPU: batches of 8 kernels of 20 ms
// (1<<20 blocks each), an event recorded after each batch, a sync on the
// previous batch's event; after `pauseAfter` batches it stops submitting
// for `pause` (frozen), as the arbiter would make it.
func hogEvents(pid uint32, cg uint64, start uint64, batches, pauseAfter int, pause uint64) (evs []ioctlspy.Event, end uint64) {
	const kernel = 20 * ms
	t := start
	gpuFree := start  // when the GPU finishes what is queued
	var done []uint64 // completion time of each batch
	for b := 0; b < batches; b++ {
		if b == pauseAfter {
			t += pause
		}
		for i := 0; i < 8; i++ {
			evs = append(evs, launch(pid, cg, t, 7))
		}
		gpuFree = max(gpuFree, t) + 8*kernel
		done = append(done, gpuFree)
		evs = append(evs, &ioctlspy.EventRecord{Header: hdr(pid, cg, t, t), Event: uint64(0xe0 + b%2), Stream: 7})
		if b > 0 {
			ret := max(t+10*1000, done[b-1])
			evs = append(evs, syncEv(pid, cg, "cuEventSynchronize", uint64(0xe0+(b-1)%2), t, ret))
			t = ret
		}
	}
	return evs, t
}

func TestEventSyncTeachesCosts(t *testing.T) {
	base := 10 * 1000 * ms
	for _, tc := range []struct {
		name       string
		pauseAfter int
		pause      uint64
		want       float64 // share over the last second
	}{
		{"alone", 100, 0, 1},
		{"frozen 600 ms of the last second", 38, 600 * ms, 0.56},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{}
			m := New(Config{Now: clk.now})
			evs, end := hogEvents(1, 100, base, 40, tc.pauseAfter, tc.pause)
			for _, e := range evs {
				clk.t = e.Hdr().End
				m.Observe(e)
			}
			clk.t = end
			m.Tick()
			learned := m.ctxs[ctxKey{pid: 1}].costs[costKey{}].ns
			perBlock := 20 * float64(ms) / float64(1<<20)
			t.Logf("learned %.2f ns/block (true %.2f), share %.3f", learned, perBlock, byCgroup(m.Snapshot())[100].Share)
			if math.Abs(learned/perBlock-1) > 0.05 {
				t.Errorf("cost %.2f ns/block, want %.2f ±5%%", learned, perBlock)
			}
			if got := byCgroup(m.Snapshot())[100].Share; math.Abs(got-tc.want) > 0.03 {
				t.Errorf("share %.3f, want %.3f", got, tc.want)
			}
		})
	}
}

func TestTotalsRestartOnMove(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	// pid 1 in cgroup 100 runs two requests of 100 ms and 50 ms...
	m.Observe(launch(1, 100, base, 7))
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, base+10*ms, base+100*ms))
	m.Observe(launch(1, 100, base+200*ms, 7))
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, base+210*ms, base+250*ms))
	// ...pid 2 one of 50 ms, then exits.
	m.Observe(launch(2, 200, base+300*ms, 7))
	m.Observe(syncEv(2, 200, "cuStreamSynchronize", 7, base+310*ms, base+350*ms))
	m.Observe(&ioctlspy.ProcessExit{Header: hdr(2, 200, base+400*ms, base+400*ms)})
	clk.t = base + 500*ms
	check := func(want map[uint32]Totals) {
		t.Helper()
		_, ctxs := m.Contexts(time.Second)
		for _, c := range ctxs {
			w := want[c.PID]
			g := c.Total
			if g.Launches != w.Launches || g.Syncs != w.Syncs || math.Abs(float64(g.GPUNS)-float64(w.GPUNS)) > float64(ms) {
				t.Errorf("pid %d in %d: %+v, want %+v", c.PID, c.CgroupID, g, w)
			}
		}
	}
	check(map[uint32]Totals{1: {GPUNS: 150 * ms, Launches: 2, Syncs: 2}, 2: {GPUNS: 50 * ms, Launches: 1, Syncs: 1}})
	// Counts outlive the window: 3 s later pid 1 still has its totals.
	clk.t = base + 3000*ms
	m.Tick()
	check(map[uint32]Totals{1: {GPUNS: 150 * ms, Launches: 2, Syncs: 2}})
	// Moved to cgroup 300, it starts from zero there.
	m.Observe(launch(1, 300, base+3000*ms, 7))
	m.Observe(syncEv(1, 300, "cuStreamSynchronize", 7, base+3010*ms, base+3020*ms))
	clk.t = base + 3100*ms
	check(map[uint32]Totals{1: {GPUNS: 20 * ms, Launches: 1, Syncs: 1}})
}

func heldLaunchEv(pid uint32, cg, t, stream uint64) ioctlspy.Event {
	ev := launch(pid, cg, t, stream).(*ioctlspy.Launch)
	ev.Held = true
	return ev
}

// A launch the gate held reaches the replay when its process is released:
// by Released, by Released reported before the event, or by the process's
// next event (by its end: a call may begin as the stop spreads); a release
// frees the launches held before it, not those of a later hold.
func TestHeldLaunchRunsFromRelease(t *testing.T) {
	base := 10 * 1000 * ms
	for _, tc := range []struct {
		name   string
		events func(m *Meter)
	}{
		{"released", func(m *Meter) {
			m.Observe(heldLaunchEv(1, 100, base, 7))
			m.Observe(Release(1, base, base+600*ms))
		}},
		{"release reported first", func(m *Meter) {
			m.Observe(&ioctlspy.ContextCreated{Header: hdr(1, 100, base-ms, base-ms)})
			m.Observe(Release(1, base, base+600*ms))
			m.Observe(heldLaunchEv(1, 100, base, 7))
		}},
		{"next event", func(m *Meter) {
			m.Observe(heldLaunchEv(1, 100, base, 7))
			m.Observe(&ioctlspy.EventRecord{Header: hdr(1, 100, base+600*ms, base+600*ms), Stream: 7, Event: 3})
		}},
		{"a call begun as the stop spread", func(m *Meter) {
			// A sibling thread's sync that began just after the hold (the
			// stop had not reached its thread) and returned after the
			// continue: the process ran by its return, not its start.
			m.Observe(heldLaunchEv(1, 100, base, 7))
			m.Observe(syncEv(1, 100, "cuStreamSynchronize", 9, base+ms/10, base+600*ms))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{t: base + 1000*ms}
			m := New(Config{Now: clk.now})
			tc.events(m)
			// A backlogged launch from 0.6 s holds the GPU for the last 0.4 s.
			if got := byCgroup(m.Snapshot())[100].Share; !near(got, 0.4) {
				t.Errorf("share %.3f, want 0.4", got)
			}
		})
	}
	t.Run("a later hold waits for its own release", func(t *testing.T) {
		// Released at 0.6 s, the process is held again at 0.7 s before
		// that release is reported: the second launch waits for its own.
		clk := &clock{t: base + 1000*ms}
		m := New(Config{Now: clk.now})
		m.Observe(heldLaunchEv(1, 100, base, 7))
		m.Observe(heldLaunchEv(1, 100, base+700*ms, 7))
		m.Observe(Release(1, base, base+600*ms))
		if _, cs := m.Contexts(time.Second); len(cs) != 1 || cs[0].Launches != 1 {
			t.Errorf("contexts %+v, want one launch run (the other still held)", cs)
		}
		m.Observe(Release(1, base+700*ms, base+900*ms))
		if _, cs := m.Contexts(time.Second); len(cs) != 1 || cs[0].Launches != 2 {
			t.Errorf("contexts %+v, want both launches run once the second hold is released", cs)
		}
	})
	t.Run("never released", func(t *testing.T) {
		clk := &clock{t: base + 1000*ms}
		m := New(Config{Now: clk.now})
		m.Observe(heldLaunchEv(1, 100, base, 7))
		if got := byCgroup(m.Snapshot())[100].Share; got != 0 {
			t.Errorf("a held launch ran: share %.3f", got)
		}
	})
}

// A held launch that runs without the arbiter's release (someone else
// continued the process) ran at some unknown time since the hold: a sync
// across that span teaches no cost. Here the launch of 10 ms really ran
// at once after the hold but shows up only with the next event, 50 ms
// later, beside a new launch, and the sync finds both done in 10 ms:
// learning from it would price a launch at 5 ms.
func TestEscapedHoldTeachesNoCost(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base + 1000*ms}
	m := New(Config{Now: clk.now})
	for i := 0; i < 10; i++ {
		m.Observe(launch(1, 100, base, 7))
	}
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, base, base+100*ms)) // 10 ms a launch
	m.Observe(heldLaunchEv(1, 100, base+200*ms, 7))
	m.Observe(launch(1, 100, base+250*ms, 7))                                     // runs again: escaped
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, base+250*ms, base+260*ms)) // both done in 10 ms of it
	_, cs := m.Contexts(time.Second)
	if len(cs) != 1 || math.Abs(cs[0].LaunchNS-10e6)/10e6 > 0.01 {
		t.Errorf("cost after an escaped hold %+v, want still 10 ms a launch", cs)
	}
}

// A process that ran before the meter could see it may have queued work
// unseen: the first sync of its stream, which waits for that work too,
// teaches no cost; the next one does. Here 10 launches of 10 ms seen, 5
// more queued unseen: the first sync returns after 150 ms.
func TestPreexistingProcessFirstSyncTeachesNothing(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base + 1000*ms}
	m := New(Config{Now: clk.now})
	m.SetPreexisting([]uint32{1})
	for i := 0; i < 10; i++ {
		m.Observe(launch(1, 100, base, 7))
	}
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, base, base+150*ms))
	for i := 0; i < 10; i++ {
		m.Observe(launch(1, 100, base+200*ms, 7))
	}
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, base+200*ms, base+300*ms))
	_, cs := m.Contexts(time.Second)
	if len(cs) != 1 || math.Abs(cs[0].LaunchNS-10e6)/10e6 > 0.01 {
		t.Errorf("cost %+v, want 10 ms a launch (from the second sync only)", cs)
	}
}

func TestLaunchCost(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base + 1000*ms}
	m := New(Config{Now: clk.now})
	costOf := func(pid uint32) float64 {
		_, cs := m.Contexts(time.Second)
		for _, c := range cs {
			if c.PID == pid {
				return c.LaunchNS
			}
		}
		t.Fatalf("no context for pid %d", pid)
		return 0
	}
	// Process 1 learns 10 ms per launch: ten launches drain in 100 ms.
	for i := 0; i < 10; i++ {
		m.Observe(launch(1, 100, base, 7))
	}
	if c := costOf(1); c > unlearnedCharge {
		t.Errorf("unlearned cost %.0f ns, want at most %.0f", c, unlearnedCharge)
	}
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, base, base+100*ms))
	if c := costOf(1); math.Abs(c-10e6)/10e6 > 0.01 {
		t.Errorf("learned cost %.0f ns, want 10 ms", c)
	}
	// An unlearned context counts its guess, capped.
	m.Observe(launch(2, 200, base+200*ms, 7))
	if c := costOf(2); c != unlearnedCharge {
		t.Errorf("unlearned cost %.0f, want %.0f", c, unlearnedCharge)
	}
}

// A kernel a context has not learned yet (a program's next phase) counts
// towards Submitted, which paces it at the launch gate, at the mean cost
// of its learned launches (2 ms), not at unlearnedCharge (20 ms): a paced
// tenant entering a phase of 0.1 ms kernels is not put seconds in debt
// before the sync that would teach them. A context with nothing learned
// counts unlearnedCharge.
func TestUnlearnedKernelChargedAtTheLearnedMean(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	c := m.context(&ioctlspy.Header{PID: 1, CgroupID: 100, Start: base})
	c.costs[costKey{handle: 1}] = &cost{ns: float64(2 * ms), learned: true}
	c.learned = true
	for i := 0; i < 20; i++ {
		m.Observe(launchFn(1, 100, base, 7, 1, 1))
	}
	before := m.SubmittedBy([]uint64{100})
	for i := 0; i < 10; i++ {
		m.Observe(launchFn(1, 100, base, 7, 2, 1)) // a kernel never seen
	}
	got := m.SubmittedBy([]uint64{100})
	if n, ns := got.Launches-before.Launches, got.NS-before.NS; n != 10 || ns > 10*2.2e6 || ns < 10*1.8e6 {
		t.Errorf("10 launches of a new kernel counted as %d launches, %.1f ms; want 10, about 20 ms (2 ms each)", n, ns/1e6)
	}
	m.Observe(launchFn(2, 200, base, 7, 1, 1))
	if got := m.SubmittedBy([]uint64{200}); got.Launches != 1 || got.NS != unlearnedCharge {
		t.Errorf("a context with nothing learned: %+v, want 1 launch at %.0f ns", got, unlearnedCharge)
	}
}

// On a GPU that does not preempt, a context of 20 ms kernels beside one of
// 2 ms kernels holds the GPU 20 ms for every 2 ms of the other (a 2 ms
// slice fits one short kernel): 90.9% / 9.1%, where a preemptive GPU
// splits it evenly.
func TestRunToCompletion(t *testing.T) {
	base := 10 * 1000 * ms
	for _, tc := range []struct {
		preemptive bool
		long       float64
	}{{true, 0.5}, {false, 20.0 / 22}} {
		clk := &clock{t: base + 1000*ms}
		m := New(Config{Now: clk.now})
		m.SetScheduling(func(int) (time.Duration, bool) { return 2 * time.Millisecond, tc.preemptive })
		kernel := func(pid uint32, cg uint64, ns time.Duration) ioctlspy.Event {
			c := m.context(&ioctlspy.Header{PID: pid, CgroupID: cg})
			c.costs[costKey{}] = &cost{ns: float64(ns), learned: true}
			c.learned = true
			return &ioctlspy.Launch{Header: hdr(pid, cg, base, base), Stream: 7, Grid: [3]uint32{1, 1, 1}}
		}
		for i := 0; i < 60; i++ {
			m.Observe(kernel(1, 100, 20*time.Millisecond))
		}
		for i := 0; i < 600; i++ {
			m.Observe(kernel(2, 200, 2*time.Millisecond))
		}
		got := byCgroup(m.Snapshot())
		if math.Abs(got[100].Share-tc.long) > 0.01 || math.Abs(got[100].Share+got[200].Share-1) > 0.01 {
			t.Errorf("preemptive %v: long kernels %.3f, short %.3f, want %.3f", tc.preemptive, got[100].Share, got[200].Share, tc.long)
		}
	}
}

// simStep is one thing the meter learns from a simulated run: a probe
// event, or (pid != 0) the release of a process the launch gate held.
type simStep struct {
	ev                ioctlspy.Event
	pid               uint32
	heldSince, freeAt uint64
}

// twoHogs plays two double-buffered hogs (batches of 8 kernels, an event
// after each, a sync on the previous one) on a simulated GPU that
// time-slices contexts in 2 ms slices (a 20 µs switch charged to the
// incoming one), preemptively or running each kernel to completion, and
// returns what the meter would learn in time order, with the true GPU
// time of each process over the last second. The second starts late;
// from then on the first is paced at rate (0: not) by a launch gate
// charging the true kernel cost, as the arbiter would pace it.
func twoHogs(kernel [2]time.Duration, preemptive bool, seconds int, late time.Duration, rate float64) (steps []simStep, truth [2]float64, end uint64) {
	const (
		step  = uint64(50 * time.Microsecond)
		slice = uint64(2 * time.Millisecond)
		wake  = uint64(100 * time.Microsecond)
	)
	type proc struct {
		queue        []int // batch of each queued kernel
		left         uint64
		batch, k     int         // batch being launched, kernels launched of it
		waitingSince uint64      // sync start; 0: not waiting
		heldSince    uint64      // held at a launch; 0: not held
		resume       uint64      // when it runs again after a sync
		done         map[int]int // completed kernels per batch
		busy         uint64
		credit       float64 // launch gate balance, ns
	}
	base := 10 * 1000 * ms
	ps := [2]*proc{{done: map[int]int{}}, {done: map[int]int{}, resume: base + uint64(late)}}
	holder, sliceEnd, last := -1, uint64(0), -1
	endT := base + uint64(seconds)*1000*ms
	for t := base; t < endT; t += step {
		for i, p := range ps {
			pid, cg := uint32(i+1), uint64(100*(i+1))
			cost := float64(kernel[i])
			gated := i == 0 && rate > 0 && t >= base+uint64(late)
			if gated {
				p.credit = min(p.credit+rate*float64(step), rate*float64(100*ms))
			}
			if p.waitingSince != 0 && p.done[p.batch-2] == 8 {
				steps = append(steps, simStep{ev: syncEv(pid, cg, "cuEventSynchronize", uint64(0xe0+(p.batch-2)%2), p.waitingSince, t+wake)})
				p.waitingSince, p.resume = 0, t+wake
			}
			if p.heldSince != 0 && p.credit >= 0 {
				steps = append(steps, simStep{pid: pid, heldSince: p.heldSince, freeAt: t})
				p.credit -= cost
				p.heldSince = 0
				p.queue = append(p.queue, p.batch)
				p.k++
			}
			for p.waitingSince == 0 && p.heldSince == 0 && t >= p.resume {
				if p.k == 8 {
					steps = append(steps, simStep{ev: &ioctlspy.EventRecord{Header: hdr(pid, cg, t, t), Event: uint64(0xe0 + p.batch%2), Stream: 7}})
					p.batch, p.k = p.batch+1, 0
					if p.batch > 1 {
						p.waitingSince = t
					}
					continue
				}
				l := &ioctlspy.Launch{Header: hdr(pid, cg, t, t), Stream: 7, Grid: [3]uint32{uint32(kernel[i] / time.Microsecond), 1, 1}}
				steps = append(steps, simStep{ev: l})
				if gated && p.credit < cost {
					l.Held, p.heldSince = true, t
					break
				}
				if gated {
					p.credit -= cost
				}
				p.queue = append(p.queue, p.batch)
				p.k++
			}
		}
		// The GPU: switch at a slice end when another context waits (at a
		// kernel boundary when it does not preempt), run the holder.
		pending := func(i int) bool { return len(ps[i].queue) > 0 }
		other := 1 - max(holder, 0)
		atBoundary := holder < 0 || ps[holder].left == 0
		if holder < 0 || !pending(holder) || (t >= sliceEnd && pending(other) && (preemptive || atBoundary)) {
			switch {
			case holder >= 0 && pending(other):
				holder = other
			case holder < 0 && pending(0):
				holder = 0
			case holder < 0 && pending(1):
				holder = 1
			}
			sliceEnd = t + slice
		}
		if holder < 0 || !pending(holder) {
			continue
		}
		p := ps[holder]
		if p.left == 0 {
			p.left = uint64(kernel[holder])
			if holder != last {
				p.left += uint64(20 * time.Microsecond) // a context switch, charged to the incoming context
			}
			last = holder
		}
		run := min(step, p.left)
		p.left -= run
		if t >= endT-1000*ms {
			p.busy += run
		}
		if p.left == 0 {
			p.done[p.queue[0]]++
			p.queue = p.queue[1:]
		}
	}
	for i, p := range ps {
		truth[i] = float64(p.busy) / float64(1000*ms)
	}
	return steps, truth, endT
}

// replaySim feeds a simulated run to a meter that knows the GPU's
// scheduling and returns it.
func replaySim(steps []simStep, end uint64, preemptive bool) *Meter {
	clk := &clock{}
	m := New(Config{Now: clk.now})
	m.SetScheduling(func(int) (time.Duration, bool) { return 2 * time.Millisecond, preemptive })
	for _, s := range steps {
		if s.ev == nil {
			clk.t = s.freeAt
			m.Observe(Release(s.pid, s.heldSince, s.freeAt))
			continue
		}
		clk.t = s.ev.Hdr().End
		m.Observe(s.ev)
	}
	clk.t = end
	return m
}

// The meter follows the GPU's scheduling: two hogs of 20 ms and 2 ms
// kernels split a preemptive GPU evenly and a run-to-completion one about
// 91/9, and the meter reads both within 3 pp once told which it is. The
// second hog starts a second later: had both started together, each would
// finish a batch every 176 ms whether its kernels took 20 and 2 ms on a GPU
// that runs them to completion or 11 ms each on a fair one — launches and
// syncs could not tell the two apart.
func TestHogsOnEitherScheduler(t *testing.T) {
	for _, preemptive := range []bool{true, false} {
		for _, late := range []time.Duration{300 * time.Millisecond, 700 * time.Millisecond, time.Second, 1300 * time.Millisecond} {
			for _, rate := range []float64{0, 0.5} {
				t.Run(fmt.Sprintf("preemptive %v, second %v late, first paced at %.1f", preemptive, late, rate), func(t *testing.T) {
					twoHogsRead(t, preemptive, late, rate)
				})
			}
		}
	}
}

func twoHogsRead(t *testing.T, preemptive bool, late time.Duration, rate float64) {
	{
		steps, truth, end := twoHogs([2]time.Duration{20 * time.Millisecond, 2 * time.Millisecond}, preemptive, 6, late, rate)
		got := byCgroup(replaySim(steps, end, preemptive).Snapshot())
		t.Logf("preemptive %v: true %.3f / %.3f, estimated %.3f / %.3f", preemptive, truth[0], truth[1], got[100].Share, got[200].Share)
		if math.Abs(got[100].Share-truth[0]) > 0.03 || math.Abs(got[200].Share-truth[1]) > 0.03 {
			t.Errorf("preemptive %v: estimated %.3f / %.3f, true %.3f / %.3f", preemptive, got[100].Share, got[200].Share, truth[0], truth[1])
		}
	}
}

func launchFn(pid uint32, cg, t, stream, fn uint64, blocks uint32) ioctlspy.Event {
	return &ioctlspy.Launch{Header: hdr(pid, cg, t, t), Stream: stream, Function: fn, Grid: [3]uint32{blocks, 1, 1}}
}

func waitBegin(pid uint32, cg uint64, of ioctlspy.WaitTarget, handle, t uint64) ioctlspy.Event {
	return &ioctlspy.WaitBegin{Header: hdr(pid, cg, t, t), Of: of, Handle: handle}
}

// burst plays one closed-loop iteration: n launches of fn on stream 7 at
// t, a stream sync from t that returns once their work (work ns) ran, and
// returns when the next may begin after think ns.
func burst(m *Meter, clk *clock, pid uint32, fn uint64, blocks uint32, n int, work, think, t uint64) uint64 {
	for i := 0; i < n; i++ {
		m.Observe(launchFn(pid, 100, t, 7, fn, blocks))
	}
	m.Observe(waitBegin(pid, 100, "stream", 7, t))
	clk.t = t + work
	m.Observe(syncEv(pid, 100, "cuStreamSynchronize", 7, t, t+work))
	return t + work + think
}

// A change of kernel mix does not throw the estimate off: each function
// learns its own cost per block, so a phase of the cheap kernel after one
// of the dear kernel is costed right at once (one scale per context would
// cost it at the dear kernel's rate).
func TestPhasesOfKernelsLearnApart(t *testing.T) {
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	const (
		cheap, dear = 0xa, 0xb
		think       = 4 * ms
	)
	phase := func(fn uint64, blocks uint32, work uint64, until uint64) {
		for clk.t < until {
			clk.t = burst(m, clk, 1, fn, blocks, 8, work, think, clk.t)
		}
	}
	start := clk.t
	phase(cheap, 500, 4*ms, start+1500*ms) // 8 × 0.5 ms (1000 ns a block)
	phase(dear, 100, 80*ms, start+3000*ms) // 8 × 10 ms (100 µs a block)
	phase(cheap, 500, 4*ms, start+3500*ms)
	m.Tick()
	c := m.ctxs[ctxKey{pid: 1}]
	if a, b := c.costs[costKey{handle: cheap}].ns, c.costs[costKey{handle: dear}].ns; math.Abs(a/1000-1) > 0.05 ||
		math.Abs(b/100000-1) > 0.05 {
		t.Errorf("costs per block: cheap %.0f ns (true 1000), dear %.0f ns (true 100000)", a, b)
	}
	_, cs := m.Contexts(500 * time.Millisecond)
	if got := cs[0].Share; math.Abs(got-0.5) > 0.03 {
		t.Errorf("share in the cheap phase after the dear one %.3f, want 0.5 (4 ms of work, 4 ms of thought)", got)
	}
}

// A new kernel first proven beside learned ones costs at most its
// burst's true work, never a part of its first guess, and the learned
// ones keep their costs: where the learned kernels made nearly all of a
// burst, a percent of the guess (1 s a block) read a kernel of 10,000
// blocks as 100 s, and the burst's factor, dominated by that guess, cut
// the learned kernel's cost by a fifth.
func TestNewKernelBesideLearnedOnesCostsNoMoreThanItsBurst(t *testing.T) {
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	const cheap, tiny = 0xa, 0xc
	start := clk.t
	for clk.t < start+1500*ms {
		clk.t = burst(m, clk, 1, cheap, 500, 8, 4*ms, 4*ms, clk.t) // 8 × 0.5 ms
	}
	c := m.ctxs[ctxKey{pid: 1}]
	before := c.costs[costKey{handle: cheap}].ns
	// 8 cheap kernels and one of 10,000 blocks that takes 10 µs in all.
	for i := 0; i < 8; i++ {
		m.Observe(launchFn(1, 100, clk.t, 7, cheap, 500))
	}
	m.Observe(launchFn(1, 100, clk.t, 7, tiny, 10000))
	m.Observe(waitBegin(1, 100, "stream", 7, clk.t))
	clk.t += 4*ms + 10*us
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, clk.t-4*ms-10*us, clk.t))
	x := c.costs[costKey{handle: tiny}]
	if x == nil || !x.learned {
		t.Fatalf("the new kernel's cost not learned from its first proof: %+v", x)
	}
	if perLaunch := 10000 * x.ns; perLaunch > float64(4*ms+10*us) {
		t.Errorf("the new kernel costs %.3g ns a launch after its first proof, more than its whole burst (4.01 ms; true 10 µs)", perLaunch)
	}
	if a := c.costs[costKey{handle: cheap}].ns; a != before {
		t.Errorf("the learned kernel moved: %.0f ns a block, %.0f before the proof", a, before)
	}
}

// A context wants the GPU while it waits in a sync or a poll, whatever
// the modeled queue says, and while gpuarb keeps it from the GPU; its
// think time is not wanted.
func TestWantedFromWaits(t *testing.T) {
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	start := clk.t
	for clk.t < start+1000*ms {
		clk.t = burst(m, clk, 1, 0xa, 1000, 4, 6*ms, 4*ms, clk.t) // 6 ms waits, 4 ms thought
	}
	m.Tick()
	_, cs := m.Contexts(time.Second)
	if want := float64(cs[0].WantNS) / float64(time.Second); math.Abs(want-0.6) > 0.02 {
		t.Errorf("wanted %.3f of the second, want 0.6 (its waits)", want)
	}
	// A wait in progress counts to now, though its work is modeled done.
	m.Observe(launchFn(1, 100, clk.t, 7, 0xa, 1))
	m.Observe(waitBegin(1, 100, "stream", 7, clk.t))
	clk.t += 500 * ms
	_, cs = m.Contexts(500 * time.Millisecond)
	if !cs[0].Waiting || float64(cs[0].WantNS) < 0.99*float64(500*ms) {
		t.Errorf("waiting %v, wanted %d ns of 500 ms", cs[0].Waiting, cs[0].WantNS)
	}
	// Paused by gpuarb counts too.
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, clk.t-500*ms, clk.t))
	m.Observe(Pause(1, 0, true, clk.t))
	clk.t += 300 * ms
	m.Observe(Pause(1, 0, false, clk.t))
	_, cs = m.Contexts(300 * time.Millisecond)
	if float64(cs[0].WantNS) < 0.99*float64(300*ms) {
		t.Errorf("paused: wanted %d ns of 300 ms", cs[0].WantNS)
	}
}

// A polling loop that found its event not done is a wait for the GPU: it
// counts as a sync, its wait towards the SLO's p99; a query that finds the
// work already done waited for nothing and does not.
func TestPolledWaitsCountAsSyncs(t *testing.T) {
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	start := clk.t
	for i := 0; clk.t < start+1000*ms; i++ {
		m.Observe(launchFn(1, 100, clk.t, 7, 0xa, 1))
		m.Observe(&ioctlspy.EventRecord{Header: hdr(1, 100, clk.t, clk.t), Event: 0xe, Stream: 7})
		m.Observe(waitBegin(1, 100, "event", 0xe, clk.t))
		polled := proofOf("event", hdr(1, 100, clk.t, clk.t+3*ms), 7, 0xe, true)
		m.Observe(polled)
		clk.t += 3 * ms
		// The allocator's check of an older event, done at once.
		m.Observe(proofOf("event", hdr(1, 100, clk.t, clk.t), 7, 0xf, true))
		clk.t += 2 * ms
	}
	m.Tick()
	_, cs := m.Contexts(time.Second)
	if n := len(cs[0].SyncWait); n != 200 || cs[0].Syncs != 200 {
		t.Fatalf("%d syncs, %d waits; want the 200 polling waits, not the instant checks", cs[0].Syncs, n)
	}
	for _, w := range cs[0].SyncWait {
		if w != 3*ms {
			t.Fatalf("a polling wait read %d ns, want 3 ms", w)
		}
	}
}

// A polling loop learns its costs from the middle of its last poll
// interval: its work completed between the query that found it not done
// and the one that found it done. Read at the success, a loop of 0.3 ms
// bursts polled every 0.2 ms would read each burst 0.1 ms long on average.
func TestPolledCompletionBetweenQueries(t *testing.T) {
	const (
		work  = 300 * us // a burst of 3 × 100 µs kernels
		poll  = 200 * us // the loop's poll interval
		think = 50 * us
	)
	for _, bounded := range []bool{true, false} {
		clk := &clock{t: 10 * 1000 * ms}
		m := New(Config{Now: clk.now})
		start, busy := clk.t, uint64(0)
		for i := 0; clk.t < start+2000*ms; i++ {
			t0 := clk.t
			for k := 0; k < 3; k++ {
				m.Observe(launchFn(1, 100, t0, 7, 0xa, 100))
			}
			m.Observe(&ioctlspy.EventRecord{Header: hdr(1, 100, t0, t0), Event: 0xe, Stream: 7})
			m.Observe(waitBegin(1, 100, "event", 0xe, t0))
			done := t0 + work
			notDone := done - poll*uint64(1+i%19)/20 // the completion falls anywhere in the interval
			e := proofOf("event", hdr(1, 100, t0, notDone+poll), 7, 0xe, true)
			if bounded {
				e.NotDoneAt = notDone
			}
			clk.t = notDone + poll
			m.Observe(e)
			if clk.t >= start+1000*ms {
				busy += work
			}
			clk.t += think
		}
		m.Tick()
		_, cs := m.Contexts(time.Second)
		truth := float64(busy) / float64(clk.t-(start+1000*ms))
		t.Logf("last not-done query known %v: estimated %.3f for a true %.3f", bounded, cs[0].Share, truth)
		if off := cs[0].Share - truth; bounded && math.Abs(off) > 0.02 || !bounded && off < 0.05 {
			t.Errorf("last not-done query known %v: estimated %.3f for a true %.3f", bounded, cs[0].Share, truth)
		}
	}
}

// twoBacklogged is a meter with two contexts (pids 1 and 2, cgroups 100
// and 200) of 2000 learned 1 ms kernels each, launched at clk's time, at
// timeslice slice (0: the GPU's).
func twoBacklogged(clk *clock, slice time.Duration) *Meter {
	m := New(Config{Now: clk.now})
	for pid := uint32(1); pid <= 2; pid++ {
		c := m.context(&ioctlspy.Header{PID: pid, CgroupID: 100 * uint64(pid)})
		c.costs[costKey{}] = &cost{ns: float64(ms), learned: true}
		c.learned = true
		if slice > 0 {
			m.Observe(Timeslice(pid, 0, slice))
		}
		for i := 0; i < 2000; i++ {
			m.Observe(launchFn(pid, 100*uint64(pid), clk.t, 7, 0, 1))
		}
	}
	return m
}

// The replay gives each context its own timeslice: 3:1 slices split two
// backlogged contexts 75/25; a paused one runs nothing until resumed.
func TestTimeslicesAndPauses(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := twoBacklogged(clk, 0)
	m.Observe(Timeslice(1, 0, 3*time.Millisecond))
	clk.t = base + 1000*ms
	got := byCgroup(m.Snapshot())
	if math.Abs(got[100].Share-0.75) > 0.01 || math.Abs(got[200].Share-0.25) > 0.01 {
		t.Errorf("3:1 timeslices: %.3f / %.3f, want 0.75 / 0.25", got[100].Share, got[200].Share)
	}
	m.Observe(Pause(1, 0, true, clk.t))
	clk.t += 1000 * ms
	got = byCgroup(m.Snapshot())
	if got[100].Share != 0 || math.Abs(got[200].Share-1) > 0.01 {
		t.Errorf("first paused: %.3f / %.3f, want 0 / 1", got[100].Share, got[200].Share)
	}
	m.Observe(Pause(1, 0, false, clk.t))
	clk.t += 1000 * ms
	if got = byCgroup(m.Snapshot()); math.Abs(got[100].Share-0.75) > 0.01 {
		t.Errorf("resumed: %.3f, want 0.75", got[100].Share)
	}
}

// A tenant whose channel group gpuarb pauses part of every period (60% of
// each 100 ms here) has a pause inside every sync: those syncs still teach
// its costs, since the replay keeps the group off the GPU as the GPU does.
// Taken as stops they taught nothing (fuzz seed 11: 1–2 ms kernels kept
// the first guess of 20 ms all run long, and took the others' time in
// the replay).
func TestPausedEveryPeriodStillLearns(t *testing.T) {
	const (
		kernel = 1200 * us
		n      = 40 // launches a sync
		period = 100 * ms
		run    = 40 * ms // of each period; paused for the rest
	)
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	base := clk.t
	// finish is when work ns queued at t complete on a GPU that runs the
	// group only in the first run ns of each period.
	finish := func(t, work uint64) uint64 {
		for work > 0 {
			off := (t - base) % period
			if off >= run {
				t += period - off
				continue
			}
			d := min(work, run-off)
			t, work = t+d, work-d
		}
		return t
	}
	paused := false
	setPause := func(upTo uint64) { // the pauses and resumes up to upTo
		for p := base; p <= upTo; p += period {
			for _, ev := range []struct {
				at    uint64
				pause bool
			}{{p, false}, {p + run, true}} {
				if ev.at <= upTo && ev.at >= clk.t && paused != ev.pause {
					m.Observe(Pause(1, 0, ev.pause, ev.at))
					paused = ev.pause
				}
			}
		}
	}
	for clk.t < base+3000*ms {
		t0 := clk.t
		for range n {
			m.Observe(launchFn(1, 100, t0, 7, 0xa, 100))
		}
		m.Observe(waitBegin(1, 100, "stream", 7, t0))
		done := finish(t0, n*kernel)
		setPause(done)
		clk.t = done + 50*us
		ev := syncEv(1, 100, "cuStreamSynchronize", 7, t0, clk.t).(*ioctlspy.Sync)
		ev.Woken = done
		m.Observe(ev)
		clk.t += 100 * us
		setPause(clk.t)
	}
	m.Tick()
	_, cs := m.Contexts(time.Second)
	if got := cs[0].LaunchNS; math.Abs(got/float64(kernel)-1) > 0.1 {
		t.Errorf("cost of a launch %.2f ms, want %.2f ms ± 10%% (paused 60%% of every period)", got/1e6, float64(kernel)/1e6)
	}
	if got := cs[0].Share; math.Abs(got-0.4) > 0.03 {
		t.Errorf("share %.3f, want 0.4 (it runs 40%% of every period)", got)
	}
}

// Graphs and kernels learn apart: a graph of a hundred kernels costs what
// its launches take, and the kernels of the same process keep theirs.
func TestGraphsLearnApartFromKernels(t *testing.T) {
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	start := clk.t
	for clk.t < start+1000*ms {
		clk.t = burst(m, clk, 1, 0xa, 1000, 2, 2*ms, ms, clk.t) // 1 ms kernels
		m.Observe(&ioctlspy.GraphLaunch{Header: hdr(1, 100, clk.t, clk.t), Exec: 0xe, Stream: 7})
		m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, clk.t, clk.t+5*ms)) // a 5 ms graph
		clk.t += 6 * ms
	}
	c := m.ctxs[ctxKey{pid: 1}]
	if k, g := c.costs[costKey{handle: 0xa}].ns, c.costs[costKey{graph: true, handle: 0xe}].ns; math.Abs(k/1000-1) > 0.05 ||
		math.Abs(g/5e6-1) > 0.05 {
		t.Errorf("kernel %.0f ns a block (true 1000), graph %.0f ns a launch (true 5e6)", k, g)
	}
}

// An exit the probes never delivered (a full ring buffer) is found by
// Reconcile: the process's queued work stops where it is found gone, as
// an observed exit would stop it, and live processes are left alone.
func TestReconcileEndsProcessesWhoseExitWasLost(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	m.Observe(launch(1, 100, base, 7))
	m.Observe(launch(2, 200, base, 7))
	clk.t = base + 600*ms
	if n := m.Reconcile(func(pid uint32) bool { return pid == 2 }); n != 1 {
		t.Fatalf("reconciled %d processes, want 1", n)
	}
	if n := m.Reconcile(func(uint32) bool { return false }); n != 1 {
		t.Fatalf("second pass reconciled %d, want 1 (pid 2 only)", n)
	}
	clk.t = base + 1000*ms
	got := byCgroup(m.Snapshot())
	// Both shared the GPU until 600 ms; pid 2, ended by the second pass
	// at 600 ms too, ran no more either.
	if !near(got[100].Share, 0.3) || !near(got[200].Share, 0.3) {
		t.Errorf("shares %.3f and %.3f, want 0.3 each (the GPU idle after 600 ms)", got[100].Share, got[200].Share)
	}
	clk.t = base + 3000*ms
	m.Tick()
	if n := m.Reconcile(func(uint32) bool { return false }); n != 0 {
		t.Errorf("ended processes reconciled again: %d", n)
	}
	if len(m.ctxs) != 0 {
		t.Errorf("%d contexts kept after the window, want the ended ones pruned", len(m.ctxs))
	}
}

// A cost learned far too low (a first proof taken from a short wait, as a
// tenant of 7.6 ms kernels paused by gpuarb once learned 0.11 ms) is
// corrected within a few seconds of closed-loop syncs: proofs whose
// lateness sums evidenceWork correct at once, by a whole maxStep while the
// evidence says the cost is off by more, however little modeled work they
// covered.
func TestFarTooLowCostRecovers(t *testing.T) {
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	const fn = 0xc
	clk.t = burst(m, clk, 1, fn, 100, 8, 80*ms, 4*ms, clk.t) // 8 × 10 ms: learned right
	c := m.ctxs[ctxKey{pid: 1}]
	k := costKey{handle: fn}
	c.costs[k].ns /= 70
	start := clk.t
	for clk.t < start+3000*ms {
		clk.t = burst(m, clk, 1, fn, 100, 8, 80*ms, 4*ms, clk.t)
	}
	if got := c.costs[k].ns; math.Abs(got/100000-1) > 0.1 {
		t.Errorf("cost per block %.0f ns 3 s after it was set 70× too low, want 100000 ± 10%%", got)
	}
	m.Tick()
	_, cs := m.Contexts(500 * time.Millisecond)
	if got := cs[0].Share; math.Abs(got-80.0/84) > 0.03 {
		t.Errorf("share %.3f, want %.3f (80 ms of work, 4 ms of thought)", got, 80.0/84)
	}
}

// A process whose launches no probe sees (ProcessUnprobed) takes its turns
// beside the others whenever it may run, wants the GPU all the time, and
// runs nothing while its cgroup is frozen or its group paused.
func TestUnprobedProcessIsABusyContext(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	c := m.context(&ioctlspy.Header{PID: 1, CgroupID: 100})
	c.costs[costKey{}] = &cost{ns: float64(ms), learned: true}
	c.learned = true
	for i := 0; i < 3000; i++ {
		m.Observe(launchFn(1, 100, base, 7, 0, 1))
	}
	m.Observe(Unprobed(2, 200, 0, base))
	m.Observe(Unprobed(2, 200, 0, base)) // again: no change
	clk.t = base + 1000*ms
	got := byCgroup(m.Snapshot())
	if !near(got[100].Share, 0.5) || !near(got[200].Share, 0.5) || !got[200].Busy {
		t.Errorf("beside a hog: %.3f / %.3f (busy %v), want 0.5 / 0.5, busy", got[100].Share, got[200].Share, got[200].Busy)
	}
	// Frozen for the first 600 ms of the next second: the hog alone.
	m.Observe(Freeze(200, clk.t, math.MaxUint64))
	m.Observe(Freeze(200, clk.t, clk.t+600*ms))
	clk.t += 1000 * ms
	got = byCgroup(m.Snapshot())
	if !near(got[100].Share, 0.8) || !near(got[200].Share, 0.2) {
		t.Errorf("frozen 600 ms of 1000: %.3f / %.3f, want 0.8 / 0.2", got[100].Share, got[200].Share)
	}
	_, ctxs := m.Contexts(time.Second)
	for _, cs := range ctxs {
		if cs.PID == 2 && math.Abs(float64(cs.WantNS)/float64(time.Second)-1) > 0.01 {
			t.Errorf("unprobed context wanted %v of the second, want all of it (frozen counts)", time.Duration(cs.WantNS))
		}
	}
	m.Observe(Pause(2, 0, true, clk.t))
	clk.t += 1000 * ms
	if got = byCgroup(m.Snapshot()); got[200].Share != 0 || !near(got[100].Share, 1) {
		t.Errorf("paused: %.3f / %.3f, want 0 / 1", got[100].Share, got[200].Share)
	}
	m.Observe(&ioctlspy.ProcessExit{Header: hdr(2, 200, clk.t, clk.t)})
	m.Observe(Unprobed(2, 200, 0, clk.t)) // a late report of an exited process
	m.Observe(Pause(2, 0, false, clk.t))
	clk.t += 1000 * ms
	if got = byCgroup(m.Snapshot()); got[200].Share != 0 {
		t.Errorf("after its exit: %.3f, want 0", got[200].Share)
	}
	clk.t += 3000 * ms
	m.Tick()
	if m.ctxs[ctxKey{pid: 2}] != nil || m.unprobed != 0 {
		t.Errorf("exited unprobed context kept (%d counted)", m.unprobed)
	}
}

// A process that passes ever new stream and kernel handles costs the
// meter a bounded context: drained streams make way, the rest goes to one
// overflow stream and cost; its work is still charged, and its share is
// still read.
func TestContextStateIsBounded(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	m.Observe(launch(2, 200, base, 7)) // a plain hog beside it
	for i := uint64(0); i < 20000; i++ {
		m.Observe(launchFn(1, 100, base+i*1000, 1000+i, 5000+i, 1))
	}
	c := m.ctxs[ctxKey{pid: 1}]
	if len(c.streams) > maxStreams || len(c.costs) > maxCostKeys+1 { // +1: the overflow key
		t.Errorf("context keeps %d streams, %d costs; bounds %d, %d", len(c.streams), len(c.costs), maxStreams, maxCostKeys)
	}
	if folded := m.Folded(); folded < 20000-maxCostKeys {
		t.Errorf("folded %d launches, want ≥ %d", folded, 20000-maxCostKeys)
	}
	clk.t = base + 1000*ms
	got := byCgroup(m.Snapshot())
	if !near(got[100].Share, 0.5) || !near(got[200].Share, 0.5) {
		t.Errorf("shares %.3f / %.3f, want 0.5 each: the folded work still runs", got[100].Share, got[200].Share)
	}
}

// A sync's wake-up bounds when its work completed: a closed loop of six
// 25 µs kernels whose syncs return 150 µs after the GPU is done (the
// thread's wait for a CPU and the return path, as on a busy VM) is
// metered at its work, not at its work and that latency.
func TestWakeUpBoundsTheCompletion(t *testing.T) {
	const (
		work    = 150 * us // six kernels of 25 µs
		latency = 150 * us // from the completion to the sync's return
		think   = 100 * us
	)
	for _, woken := range []bool{true, false} {
		clk := &clock{t: 10 * 1000 * ms}
		m := New(Config{Now: clk.now})
		start := clk.t
		for clk.t < start+1000*ms {
			t0 := clk.t
			for range 6 {
				m.Observe(launchFn(1, 100, t0, 7, 0xa, 100))
			}
			m.Observe(waitBegin(1, 100, "stream", 7, t0))
			s := syncEv(1, 100, "cuStreamSynchronize", 7, t0, t0+work+latency).(*ioctlspy.Sync)
			if woken {
				s.Woken = t0 + work + 10*us // the completion's wake-up, 10 µs late
			}
			clk.t = t0 + work + latency
			m.Observe(s)
			clk.t += think
		}
		m.Tick()
		_, cs := m.Contexts(500 * time.Millisecond)
		got, truth := cs[0].Share, float64(work)/float64(work+latency+think)
		t.Logf("wake-up seen %v: share %.3f, true %.3f", woken, got, truth)
		// The round trip from the wake-up to the next launch is the loop's
		// own, nothing outstanding: not wanted (its demand alone is its
		// share, not the whole GPU).
		wanted := float64(cs[0].WantNS) / float64(500*time.Millisecond)
		if wantTruth := float64(work+10*us) / float64(work+latency+think); woken && math.Abs(wanted-wantTruth) > 0.03 {
			t.Errorf("wanted %.3f of the window with the wake-up seen, want %.3f ± 0.03 (its waits up to the completion)", wanted, wantTruth)
		}
		switch {
		case woken && math.Abs(got-truth) > 0.03:
			t.Errorf("share %.3f with the wake-up seen, want %.3f ± 0.03", got, truth)
		case !woken && got < truth+0.1:
			t.Errorf("share %.3f from the returns alone, want the latency counted (> %.3f): the test shows nothing", got, truth+0.1)
		}
	}
}

// A closed loop of short kernels, alone: its launches reach the GPU 20 µs
// after the probe sees them and its completions reach the thread 20 µs
// after the GPU is done. Those latencies are host time it spends alone
// too: it wants the GPU for its modeled work (its share, whatever the
// proofs' tolerance let its costs settle at), not for its waits' whole
// length, which would read it as wanting 0.83 of the GPU where it takes
// 0.67. A wait for work the replay has not run out of stays whole.
func TestHostLatencyIsNotWanted(t *testing.T) {
	const (
		launchGap = 20 * us // from one launch's probe to the next
		toGPU     = 20 * us // a launch's way to the GPU
		kernel    = 40 * us
		wake      = 20 * us // the completion's way to the thread
		back      = 40 * us // the return path and the next launch's probe
	)
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	start := clk.t
	var period uint64
	for clk.t < start+1000*ms {
		t0 := clk.t
		for i := range uint64(4) {
			m.Observe(launchFn(1, 100, t0+i*launchGap, 7, 0xa, 100))
		}
		entered := t0 + 4*launchGap
		m.Observe(waitBegin(1, 100, "stream", 7, entered))
		woken := t0 + toGPU + 4*kernel + wake
		s := syncEv(1, 100, "cuStreamSynchronize", 7, entered, woken+10*us).(*ioctlspy.Sync)
		s.Woken = woken
		clk.t = woken + 10*us
		m.Observe(s)
		clk.t = woken + back
		period = clk.t - t0
	}
	m.Tick()
	_, cs := m.Contexts(500 * time.Millisecond)
	share, wanted := cs[0].Share, float64(cs[0].WantNS)/float64(500*time.Millisecond)
	truth, whole := float64(4*kernel)/float64(period), float64(toGPU+4*kernel+wake)/float64(period)
	t.Logf("share %.3f (true %.3f), wanted %.3f (its waits whole: %.3f)", share, truth, wanted, whole)
	if wanted > share+0.02 || wanted > whole-0.05 {
		t.Errorf("wanted %.3f of the window, want its share %.3f (+0.02), not its waits whole (%.3f)", wanted, share, whole)
	}

	// The same loop's next burst wakes 400 µs after the replay ran it dry
	// (the GPU served another context meanwhile): a drain that early is
	// the replay's error, not host latency — the wait counts whole.
	t0 := clk.t
	for i := range uint64(4) {
		m.Observe(launchFn(1, 100, t0+i*launchGap, 7, 0xa, 100))
	}
	entered := t0 + 4*launchGap
	m.Observe(waitBegin(1, 100, "stream", 7, entered))
	woken := t0 + toGPU + 4*kernel + wake + 400*us
	s := syncEv(1, 100, "cuStreamSynchronize", 7, entered, woken+10*us).(*ioctlspy.Sync)
	s.Woken = woken
	clk.t = woken + 10*us
	m.Observe(s)
	if w := m.ctxs[ctxKey{pid: 1}].waitedFor; len(w) == 0 || w[len(w)-1] != (span{entered, woken}) {
		t.Errorf("a wait woken 400 µs after the replay's drain recorded as %v, want it whole: [%d, %d]", w[max(len(w)-1, 0):], entered, woken)
	}

	// Work the replay still has queued (a guessed cost: the backlog
	// assumed) when the wait ends: the wait is the evidence — wanted whole.
	m = New(Config{Now: clk.now})
	clk.t = start
	m.Observe(launchFn(1, 100, clk.t, 7, 0xa, 1))
	m.Observe(waitBegin(1, 100, "stream", 7, clk.t))
	clk.t += 2 * ms
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, start, clk.t))
	c := m.ctxs[ctxKey{pid: 1}]
	if c == nil || len(c.waitedFor) != 1 || c.waitedFor[0] != (span{start, clk.t}) {
		t.Fatalf("a 2 ms wait for a guessed kernel recorded as %v, want [%d, %d]", c.waitedFor, start, clk.t)
	}
}

// A closed loop over four streams: a 1 ms kernel on each, then a sync of
// each stream in turn. The GPU runs a context's kernels one at a time, so
// stream i drains (i+1) ms into the turn: the replay must serve streams
// kernel by kernel too. Shared at once, every sync but the last found
// work still queued in the replay and the costs fell (a 0.95 truth read
// 0.67).
func TestStreamsTakeTurnsKernelByKernel(t *testing.T) {
	const (
		kernel  = ms
		streams = 4
		think   = 200 * us
	)
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	start := clk.t
	for clk.t < start+2000*ms {
		t0 := clk.t
		for i := range uint64(streams) {
			m.Observe(launchFn(1, 100, t0, 10+i, 0xa, 1000))
		}
		for i := range uint64(streams) {
			done := t0 + (i+1)*kernel
			m.Observe(waitBegin(1, 100, "stream", 10+i, max(t0, done-kernel)))
			clk.t = done + 20*us
			s := syncEv(1, 100, "cuStreamSynchronize", 10+i, max(t0, done-kernel), clk.t).(*ioctlspy.Sync)
			s.Woken = done
			m.Observe(s)
		}
		clk.t += think
	}
	m.Tick()
	_, cs := m.Contexts(time.Second)
	truth := float64(streams*kernel) / float64(streams*kernel+20*us+think)
	t.Logf("share %.3f, true %.3f, a kernel %.0f ns a block (true 1000)", cs[0].Share, truth, m.ctxs[ctxKey{pid: 1}].costs[costKey{handle: 0xa}].ns)
	if math.Abs(cs[0].Share-truth) > 0.03 {
		t.Errorf("share %.3f, want %.3f ± 0.03", cs[0].Share, truth)
	}
}

// The first proof of a multi-stream context comes from its last stream,
// whose kernel the replay (one at a time) has not begun: the proof covers
// the context's work, so the first cost is near the truth, not left a
// guess (a stream sync) or collapsed (an event sync: what the replay ran
// of the stream, nothing, over what it covered).
func TestFirstProofFromALaterStream(t *testing.T) {
	for _, of := range []ioctlspy.WaitTarget{ioctlspy.WaitStream, ioctlspy.WaitEvent} {
		t.Run(string(of), func(t *testing.T) {
			clk := &clock{t: 10 * 1000 * ms}
			m := New(Config{Now: clk.now})
			t0 := clk.t
			for i := range uint64(4) {
				m.Observe(launchFn(1, 100, t0, 10+i, 0xa, 1000)) // 1 ms kernels: 1 µs a block
			}
			m.Observe(&ioctlspy.EventRecord{Header: hdr(1, 100, t0, t0), Event: 0xe, Stream: 13})
			clk.t = t0 + 4*ms
			m.Observe(proofOf(of, hdr(1, 100, t0, clk.t), 13, 0xe, false))
			c := m.ctxs[ctxKey{pid: 1}]
			got := c.costs[costKey{handle: 0xa}].ns
			t.Logf("first cost %.0f ns a block (true 1000), learned %v", got, c.learned)
			if !c.learned || got < 500 || got > 2000 {
				t.Errorf("first cost %.0f ns a block (learned %v), want 1000 within 2×", got, c.learned)
			}
		})
	}
}

// proofOf is a completion proof of a stream's work, by a stream sync or by
// a sync on the event recorded after it (of "stream" or "event"); polled:
// by a query that found it done.
func proofOf(of ioctlspy.WaitTarget, h ioctlspy.Header, stream, event uint64, polled bool) *ioctlspy.Sync {
	s := &ioctlspy.Sync{Header: h, Func: "cuStreamSynchronize", Of: ioctlspy.WaitStream, Handle: stream, Polled: polled}
	if of == ioctlspy.WaitEvent {
		s.Func, s.Of, s.Handle = "cuEventSynchronize", ioctlspy.WaitEvent, event
	}
	if polled {
		s.Func = map[ioctlspy.WaitTarget]string{ioctlspy.WaitStream: "cuStreamQuery", ioctlspy.WaitEvent: "cuEventQuery"}[s.Of]
	}
	return s
}

// A first proof that comes before the replay gave the context any turn
// teaches nothing: the replay's phase is off (another context's slice
// still ran there), not the costs. Taken as evidence, the work it covers
// would cost almost nothing (a scale of 1 ns over the guess): a loop of
// 20–60 µs kernels polled by event queries beside hogs learned 0.1 ns a
// launch, read 0% while it took 2%, and got 2% of a 12% target (fuzz
// seed 31).
func TestProofBeforeTheReplaysTurnTeachesNothing(t *testing.T) {
	for _, of := range []ioctlspy.WaitTarget{ioctlspy.WaitStream, ioctlspy.WaitEvent} {
		t.Run(string(of), func(t *testing.T) {
			clk := &clock{t: 10 * 1000 * ms}
			var proofs []Proof
			m := New(Config{Now: clk.now, Proofs: func(p Proof) { proofs = append(proofs, p) }})
			t0 := clk.t
			for range 50 {
				m.Observe(launchFn(1, 100, t0, 1, 0xa, 20000)) // the hog holds the GPU in the replay
			}
			tiny := t0 + 100*us
			for range 7 {
				m.Observe(launchFn(2, 200, tiny, 3, 0xb, 30))
			}
			m.Observe(&ioctlspy.EventRecord{Header: hdr(2, 200, tiny, tiny), Event: 0xe, Stream: 3})
			m.Observe(waitBegin(2, 200, of, 3, tiny+10*us))
			clk.t = tiny + 400*us // before the hog's first slice ends in the replay
			m.Observe(proofOf(of, hdr(2, 200, tiny+10*us, clk.t), 3, 0xe, true))
			c := m.ctxs[ctxKey{pid: 2}]
			k := c.costOf(costKey{handle: 0xb})
			t.Logf("after the proof: %.3g ns a block, learned %v", k.ns, c.learned)
			if c.learned || k.learned {
				t.Errorf("the proof taught %.3g ns a block (learned %v); a proof before the context's turn in the replay should teach nothing", k.ns, c.learned)
			}
			// Config.Proofs hears of it, and of why it taught nothing.
			if len(proofs) != 1 || proofs[0].PID != 2 || proofs[0].Skipped != "the replay had not begun the proven work" || proofs[0].LeftNS <= 0 {
				t.Errorf("proofs traced: %+v; want pid 2's, skipped as not begun, with its work left", proofs)
			}
		})
	}
}

// closedLoopsBesideHogs simulates a preemptive round-robin GPU (1024 µs
// slices, in the order the processes allocated their channel groups)
// shared by `loops` closed-loop processes (cgroup 100: perSync kernels of
// kernel on one stream, a stream sync whose thread is woken 20 µs after
// the completion plus an exponential delay of mean jitter, 150 µs of host
// round trip) and `hogs` processes that keep 8 kernels of hogKernel
// queued and never sync (cgroup 200). They first launch in another order,
// a loop, a hog, a loop… It returns the probes' events and each cgroup's
// true share of the last second.
func closedLoopsBesideHogs(loops, hogs, perSync int, kernel, hogKernel, jitter time.Duration, seconds int) (evs []ioctlspy.Event, truth map[uint64]float64, end uint64) {
	var procs []simProc
	for range loops {
		procs = append(procs, simProc{cg: 100, kernels: []time.Duration{kernel}, perSync: perSync})
	}
	for range hogs {
		procs = append(procs, simProc{cg: 200, kernels: []time.Duration{hogKernel}})
	}
	return simulateGPU(procs, jitter, 0, seconds, 0)
}

// simProc is one process of simulateGPU: a closed loop (perSync launches,
// each of one of kernels at random, then a stream sync) or, where perSync
// is 0, a hog that keeps 8 kernels of kernels[0] queued and never syncs;
// its channel group's timeslice is slice (0: 1024 µs). Where run is set,
// gpuarb pauses the group for the rest of every simPeriod after its first
// run (simPaused).
type simProc struct {
	cg      uint64
	kernels []time.Duration
	perSync int
	slice   time.Duration
	run     time.Duration
}

// simPeriod is the period of simProc's pauses, gpuarb's default.
const simPeriod = 100 * ms

// simPaused tells whether gpuarb keeps p's group off the GPU at t.
func simPaused(p simProc, t uint64) bool {
	return p.run > 0 && (t-10*1000*ms)%simPeriod >= uint64(p.run)
}

// feedWithPauses plays evs into m, telling it of procs' pauses and
// resumes as they come (SetPaused), as gpuarb's steering does.
func feedWithPauses(m *Meter, clk *clock, procs []simProc, evs []ioctlspy.Event) {
	paused := make([]bool, len(procs))
	next := uint64(10 * 1000 * ms)
	for _, ev := range evs {
		for ; next <= ev.Hdr().End; next += 100 * us {
			for i, p := range procs {
				if now := simPaused(p, next); now != paused[i] {
					m.Observe(Pause(uint32(i+1), 0, now, next))
					paused[i] = now
				}
			}
		}
		clk.t = ev.Hdr().End
		m.Observe(ev)
	}
}

// simulateGPU runs procs on a simulated preemptive GPU (the groups in
// round robin, each for its timeslice while another has work, a switch
// to another group taking switchCost of the incoming group's time) for
// seconds after a 10 s base, and returns the events the probes would
// see, each cgroup's true share of the last second, and the end. A
// loop's thread wakes 20 µs after its work completes, later by an
// exponential jitter of mean jitter, and launches again 150 µs later;
// kernel picks draw from seed.
func simulateGPU(procs []simProc, jitter, switchCost time.Duration, seconds int, seed uint64) (evs []ioctlspy.Event, truth map[uint64]float64, end uint64) {
	const (
		step         = 10 * us
		defaultSlice = 1024 * us
		wake         = 20 * us  // completion to the waiting thread's wake-up, at least
		trip         = 150 * us // wake-up to the next launch
	)
	type proc struct {
		simProc
		queue     []uint64 // work of each queued kernel, the head's what is left
		resume    uint64   // when a loop launches again; 0 while it waits
		syncStart uint64
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := rand.New(rand.NewPCG(seed, 3))
	base := 10 * 1000 * ms
	end = base + uint64(seconds)*1000*ms
	loops := 0
	for _, p := range procs {
		if p.perSync > 0 {
			loops++
		}
	}
	ps := make([]*proc, len(procs))
	for i, sp := range procs {
		ps[i] = &proc{simProc: sp, resume: base + 100*us + uint64(i%max(loops, 1))*37*us}
		if sp.perSync == 0 {
			ps[i].resume += 18 * us // first launches: a loop, a hog, a loop…
		}
		if sp.slice == 0 {
			ps[i].slice = time.Duration(defaultSlice)
		}
	}
	for i, p := range ps {
		evs = append(evs, &ioctlspy.TSGAllocated{ObjectAllocated: ioctlspy.ObjectAllocated{Header: hdr(uint32(i+1), p.cg, base+uint64(i)*us, base+uint64(i)*us)}})
	}
	truth = map[uint64]float64{}
	holder, sliceEnd := -1, uint64(0)
	last, switchLeft := -1, uint64(0) // who ran last; the switch to the holder in progress
	for t := base; t < end; t += step {
		for i, p := range ps {
			pid := uint32(i + 1)
			switch {
			case p.perSync > 0 && p.resume != 0 && t >= p.resume:
				for range p.perSync {
					k := 0
					if len(p.kernels) > 1 {
						k = pick.IntN(len(p.kernels))
					}
					evs = append(evs, launchFn(pid, p.cg, t, 7, 0xa+0x10*uint64(k), uint32(p.kernels[k]/time.Microsecond)))
					p.queue = append(p.queue, uint64(p.kernels[k]))
				}
				evs = append(evs, waitBegin(pid, p.cg, "stream", 7, t+5*us))
				p.resume, p.syncStart = 0, t+5*us
			case p.perSync == 0 && t >= p.resume:
				for len(p.queue) < 8 {
					evs = append(evs, launchFn(pid, p.cg, t, 7, 0xb, uint32(p.kernels[0]/time.Microsecond)))
					p.queue = append(p.queue, uint64(p.kernels[0]))
				}
			}
		}
		runnable := func(j int) bool { return len(ps[j].queue) > 0 && !simPaused(ps[j].simProc, t) }
		next := func(after int) int {
			for k := 1; k <= len(ps); k++ {
				if j := (after + k + len(ps)) % len(ps); runnable(j) {
					return j
				}
			}
			return -1
		}
		if holder >= 0 && simPaused(ps[holder].simProc, t) {
			holder = -1 // taken off the GPU at once
		}
		if holder < 0 || len(ps[holder].queue) == 0 || t >= sliceEnd {
			if n := next(holder); n >= 0 && (holder < 0 || n != holder || len(ps[holder].queue) == 0) {
				holder, sliceEnd = n, t+uint64(ps[n].slice)
			} else if holder >= 0 && runnable(holder) {
				sliceEnd = t + uint64(ps[holder].slice) // nobody else waits: the slice renews
			} else {
				holder = -1
			}
		}
		if holder < 0 {
			continue
		}
		if holder != last {
			last, switchLeft = holder, uint64(switchCost)
		}
		if switchLeft > 0 { // the switch is the incoming group's time
			run := min(step, switchLeft)
			switchLeft -= run
			if t >= end-1000*ms {
				truth[ps[holder].cg] += float64(run) / float64(1000*ms)
			}
			continue
		}
		p := ps[holder]
		run := min(step, p.queue[0])
		p.queue[0] -= run
		if t >= end-1000*ms {
			truth[p.cg] += float64(run) / float64(1000*ms)
		}
		if p.queue[0] == 0 {
			p.queue = p.queue[1:]
			if p.perSync > 0 && len(p.queue) == 0 {
				woken := t + run + wake + uint64(rng.ExpFloat64()*float64(jitter))
				s := syncEv(uint32(holder+1), p.cg, "cuStreamSynchronize", 7, p.syncStart, woken+10*us).(*ioctlspy.Sync)
				s.Woken = woken
				evs = append(evs, s)
				p.resume = woken + trip
			}
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Hdr().End < evs[j].Hdr().End })
	return evs, truth, end
}

// Closed loops whose burst is a slice and a remainder (3 kernels of 0.47
// ms per sync, 1024 µs slices) beside hogs, one to four processes each,
// their wake-ups late by 0 to 150 µs on average: the replay rotates in
// the order the channel groups were allocated, as the GPU, not in the
// order the processes first launched, and the loops read within 2 pp.
// (In launch order, out of phase with the GPU at every turn, four loops
// read 46.9% for 40.2%, with or without the wake-up jitter.) A rule that took a late
// drain less the rotations it waited as the missed work read them at
// 37.0%.
func TestClosedLoopsBesideHogs(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		for _, jitter := range []time.Duration{0, 50 * time.Microsecond, 150 * time.Microsecond} {
			t.Run(fmt.Sprintf("%d loops, %d hogs, jitter %v", n, n, jitter), func(t *testing.T) {
				evs, truth, end := closedLoopsBesideHogs(n, n, 3, 465*time.Microsecond, 3469*time.Microsecond, jitter, 4)
				got := playedShares(evs, end)
				t.Logf("loops: true %.3f, estimated %.3f; hogs: true %.3f, estimated %.3f", truth[100], got[100].Share, truth[200], got[200].Share)
				if math.Abs(got[100].Share-truth[100]) > 0.02 {
					t.Errorf("loops estimated at %.3f, true %.3f: want within 2 pp", got[100].Share, truth[100])
				}
			})
		}
	}
}

// Two closed loops of one kernel per sync, drawn at random from 61 µs
// to 2.5 ms, beside three hogs of 86 µs kernels (fuzz seed 97), on a GPU
// whose switches take 20 µs of the incoming group's time and whose
// completions reach the loops' threads late by 300 µs on average (a host
// short of CPUs), at the slices gpuarb might set: the loops read within
// 3 pp (within 1 pp here). Each loop waits a rotation of the hogs'
// slices for every kernel; the replay, rotating on its own between
// proofs, ran many of their kernels at once, drained them milliseconds
// early and learned the 61 µs kernels at several times their cost: the
// loops read 3.5 to 6.3 pp high. A proof that finds the replay out of
// phase puts its rotation back in step (replay.anchor).
func TestLoopsBesideHogsStayInPhase(t *testing.T) {
	mix := []time.Duration{61 * time.Microsecond, 1333 * time.Microsecond, 61 * time.Microsecond, 2544 * time.Microsecond}
	for _, slices := range [][2]time.Duration{{0, 0}, {2 * time.Millisecond, 800 * time.Microsecond}, {800 * time.Microsecond, 1500 * time.Microsecond}} {
		t.Run(fmt.Sprintf("slices %v", slices), func(t *testing.T) {
			var procs []simProc
			for range 2 {
				procs = append(procs, simProc{cg: 100, kernels: mix, perSync: 1, slice: slices[0]})
			}
			for range 3 {
				procs = append(procs, simProc{cg: 200, kernels: []time.Duration{86 * time.Microsecond}, slice: slices[1]})
			}
			evs, truth, end := simulateGPU(procs, 300*time.Microsecond, 20*time.Microsecond, 6, 1)
			clk := &clock{}
			m := New(Config{Now: clk.now})
			for _, ev := range evs {
				clk.t = ev.Hdr().End
				m.Observe(ev)
				if pid := ev.Hdr().PID; procs[pid-1].slice > 0 {
					m.Observe(Timeslice(pid, 0, procs[pid-1].slice)) // as gpuarb's steering tells it
				}
			}
			clk.t = end
			m.Tick()
			got := byCgroup(m.Snapshot())[100].Share
			t.Logf("loops: true %.3f, estimated %.3f", truth[100], got)
			if math.Abs(got-truth[100]) > 0.03 {
				t.Errorf("loops estimated at %.3f, true %.3f: want within 3 pp", got, truth[100])
			}
		})
	}
}

// An early drain counts what the context would have received meanwhile:
// its timeslice's part of the rotation of the contexts with work, not one
// over their number (a tenant of 9 ms slices beside one of 1 ms receives
// 90% of the GPU while both have work; at half, it learned its costs
// ever lower under gpuarb's weighted slices).
func TestEarlyDrainCountsTheContextsTurnPart(t *testing.T) {
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	var cs []*gpuContext
	for pid := uint32(1); pid <= 3; pid++ {
		c := m.context(&ioctlspy.Header{PID: pid, CgroupID: 100 * uint64(pid)})
		c.costs[costKey{}] = &cost{ns: float64(ms), learned: true}
		c.learned = true
		cs = append(cs, c)
	}
	for pid := uint32(1); pid <= 2; pid++ {
		for i := 0; i < 100; i++ {
			m.Observe(launchFn(pid, 100*uint64(pid), clk.t, 7, 0, 1))
		}
	}
	m.Observe(Timeslice(1, 0, 9*time.Millisecond))
	m.Observe(Timeslice(2, 0, time.Millisecond))
	m.Observe(Timeslice(3, 0, time.Millisecond))
	early := float64(10 * ms)
	for i, want := range []float64{-0.9 * early, -0.1 * early, -early / 11} {
		// The third has no work: it takes no turn, and an early drain of
		// its own would take one beside the two (1 ms of 11 ms).
		if got := m.lateness(cs[i], 0, early); math.Abs(got-want) > 1 {
			t.Errorf("context %d: an early drain of 10 ms counts %.0f ns, want %.0f", i+1, got, want)
		}
	}
	m.Observe(Pause(2, 0, true, clk.t))
	if got := m.lateness(cs[0], 0, early); got != -early {
		t.Errorf("beside a paused context: %.0f ns, want the whole %.0f", got, -early)
	}
}

// RecentBurstNS follows a loop's bursts from 2 ms to 0.2 ms within a few
// of them, where the window's mean still reads more than 1 ms; RunNS is
// the GPU time since its work last ran out: 6 ms into a burst of ten 1 ms
// kernels, 6 ms.
func TestRecentBurstsAndTheTurnInProgress(t *testing.T) {
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	start := clk.t
	for clk.t < start+500*ms {
		clk.t = burst(m, clk, 1, 0xa, 1000, 2, 2*ms, ms, clk.t) // two 1 ms kernels
	}
	for range 20 {
		clk.t = burst(m, clk, 1, 0xa, 100, 2, 200*us, ms, clk.t) // two 0.1 ms kernels
	}
	m.Tick()
	_, cs := m.Contexts(300 * time.Millisecond)
	if len(cs) != 1 || cs[0].Drains == 0 {
		t.Fatalf("contexts %+v, want one that drained", cs)
	}
	if got, mean := float64(cs[0].RecentBurstNS), float64(cs[0].GPUNS)/float64(cs[0].Drains); math.Abs(got-float64(200*us)) > float64(20*us) || mean < float64(ms) {
		t.Errorf("last bursts %.0f ns, window's mean %.0f ns: want 0.2 ms, and the mean still above 1 ms", got, mean)
	}
	for range 10 {
		m.Observe(launchFn(1, 100, clk.t, 7, 0xa, 1000))
	}
	clk.t += 6 * ms
	m.Tick()
	if _, cs = m.Contexts(300 * time.Millisecond); math.Abs(float64(cs[0].RunNS)-float64(6*ms)) > float64(100*us) {
		t.Errorf("turn in progress %d ns, want 6 ms", cs[0].RunNS)
	}
}

// A closed loop whose channel group gpuarb pauses for part of every
// period (run of each 100 ms), beside a loop of short kernels and hogs
// (fuzz seed 1's t1: 18, 0.85 and 0.34 ms kernels, five a sync, beside
// four loops of 0.35 and 0.04 ms kernels) reads within 2 pp: the replay
// keeps the group off the GPU as the GPU does, and the syncs across the
// pauses teach its costs as any others.
func TestPausedLoopBesideOthersReadsTrue(t *testing.T) {
	for _, run := range []time.Duration{100 * time.Millisecond, 60 * time.Millisecond, 30 * time.Millisecond} {
		t.Run(fmt.Sprintf("runs %v of 100 ms", run), func(t *testing.T) {
			procs := []simProc{{cg: 100, kernels: []time.Duration{18024 * time.Microsecond, 846 * time.Microsecond, 339 * time.Microsecond}, perSync: 5}}
			if run < 100*time.Millisecond {
				procs[0].run = run
			}
			for range 4 {
				procs = append(procs, simProc{cg: 200, kernels: []time.Duration{348 * time.Microsecond, 42 * time.Microsecond}, perSync: 6})
			}
			for range 2 {
				procs = append(procs, simProc{cg: 300, kernels: []time.Duration{12915 * time.Microsecond}})
			}
			evs, truth, end := simulateGPU(procs, 50*time.Microsecond, 0, 6, 1)
			clk := &clock{}
			m := New(Config{Now: clk.now})
			feedWithPauses(m, clk, procs, evs)
			clk.t = end
			m.Tick()
			got := byCgroup(m.Snapshot())
			t.Logf("paused loop: true %.3f, estimated %.3f; short loops: true %.3f, estimated %.3f; hogs: true %.3f, estimated %.3f",
				truth[100], got[100].Share, truth[200], got[200].Share, truth[300], got[300].Share)
			if math.Abs(got[100].Share-truth[100]) > 0.02 {
				t.Errorf("paused loop estimated at %.3f, true %.3f: want within 2 pp", got[100].Share, truth[100])
			}
		})
	}
}

// Four closed loops of 0.35/0.04 ms kernels (a sync every 6) beside two
// hogs on the simulated GPU, whose control node answers every RM_ALLOC
// with ENOTTY: the loops created their contexts (cuCtxCreate's entry,
// the first event the meter acts on) in the reverse of the order they
// allocated their channel groups, which is the GPU's runlist order. The
// replay rotates in the groups' order and every loop reads within 2 pp.
// In the contexts' order, one loop's proofs found its work not begun at
// every other turn while its neighbour's drained early (fuzz seed 1).
func TestRunlistFollowsGroupAllocation(t *testing.T) {
	var procs []simProc
	for i := range 4 {
		procs = append(procs, simProc{cg: uint64(101 + i), kernels: []time.Duration{348 * time.Microsecond, 42 * time.Microsecond}, perSync: 6})
	}
	for range 2 {
		procs = append(procs, simProc{cg: 200, kernels: []time.Duration{2 * time.Millisecond}})
	}
	evs, truth, end := simulateGPU(procs, 100*time.Microsecond, 20*time.Microsecond, 4, 1)
	var created []ioctlspy.Event
	for _, ev := range evs {
		if e, ok := ev.(*ioctlspy.TSGAllocated); ok {
			e.Ret = -25 // ENOTTY, as the simulated GPU's control node answers
			i := uint64(e.PID - 1)
			h := hdr(e.PID, e.CgroupID, e.Start-1000*us-i*100*us, e.End+50*us)
			created = append(created, &ioctlspy.ContextCreated{Header: h, Func: "cuCtxCreate_v2"})
		}
	}
	evs = append(created, evs...)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Hdr().End < evs[j].Hdr().End })
	got := playedShares(evs, end)
	for cg := uint64(101); cg <= 104; cg++ {
		t.Logf("loop %d: true %.3f, estimated %.3f", cg-100, truth[cg], got[cg].Share)
		if math.Abs(got[cg].Share-truth[cg]) > 0.02 {
			t.Errorf("loop %d estimated at %.3f, true %.3f: want within 2 pp", cg-100, got[cg].Share, truth[cg])
		}
	}
}

// A channel group descheduled while the replay runs it keeps the GPU to
// the end of its slice (the driver leaves what runs to finish it), then
// is paused; one paused is off at once, and one descheduled while another
// runs takes no further turn.
func TestDescheduledFinishesItsSlice(t *testing.T) {
	for _, tc := range []struct {
		name       string
		deschedule bool
		want       float64 // the first context's share of the second
	}{{"paused", false, 0.002}, {"descheduled", true, 0.010}} {
		base := 10 * 1000 * ms
		clk := &clock{t: base}
		m := twoBacklogged(clk, 10*time.Millisecond)
		clk.t = base + 2*ms
		if tc.deschedule {
			m.Observe(Deschedule(1, 0, clk.t))
			m.Observe(Deschedule(2, 0, clk.t)) // not on the GPU: off at once
		} else {
			m.Observe(Pause(1, 0, true, clk.t))
		}
		if r := m.replayOf(0); r.t != clk.t || r.holder == nil || r.holder.pid != 1 {
			t.Fatalf("%s: the replay at %d ms runs %+v, want the first context", tc.name, (r.t-base)/ms, r.holder)
		}
		clk.t = base + 1000*ms
		got := byCgroup(m.Snapshot())
		if math.Abs(got[100].Share-tc.want) > 0.001 {
			t.Errorf("%s at 2 ms of a 10 ms slice: the first context %.4f of the second, want %.3f", tc.name, got[100].Share, tc.want)
		}
		if tc.deschedule && got[200].Share > 0.001 {
			t.Errorf("the second context, descheduled while the first ran: %.4f of the second, want 0", got[200].Share)
		}
		m.Observe(Pause(1, 0, false, clk.t))
		m.Observe(Pause(2, 0, false, clk.t))
		clk.t += 1000 * ms
		if got = byCgroup(m.Snapshot()); math.Abs(got[100].Share-0.5) > 0.01 {
			t.Errorf("%s, then resumed: %.3f, want 0.5", tc.name, got[100].Share)
		}
	}
}

// A process whose four threads each made a context of their own
// (cuCtxCreate) takes four turns of the round robin to a one-context
// process's one: backlogged beside it, 80/20 at equal slices, and 50/50
// once gpuarb gives its groups a quarter of the other's slice. Each
// thread's launches go to its own context; the process is listed once
// per context.
func TestContextPerThreadTakesATurnPerContext(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	for tid := uint32(11); tid <= 14; tid++ {
		h := ioctlspy.Header{PID: 1, TID: tid, CgroupID: 100, Start: clk.t, End: clk.t}
		m.Observe(&ioctlspy.ContextCreated{Header: h, Func: "cuCtxCreate_v2", Ctx: 0xc000 + uint64(tid)})
	}
	m.context(&ioctlspy.Header{PID: 2, TID: 2, CgroupID: 200})
	for _, c := range m.ctxs {
		c.costs[costKey{}] = &cost{ns: float64(ms), learned: true}
		c.learned = true
	}
	for i := 0; i < 2000; i++ {
		for tid := uint32(11); tid <= 14; tid++ {
			ev := launchFn(1, 100, clk.t, 7, 0, 1)
			ev.(*ioctlspy.Launch).TID = tid
			m.Observe(ev)
		}
		m.Observe(launchFn(2, 200, clk.t, 7, 0, 1))
	}
	clk.t = base + 1000*ms
	got := byCgroup(m.Snapshot())
	if math.Abs(got[100].Share-0.8) > 0.01 || got[100].Processes != 1 {
		t.Errorf("four contexts beside one, equal slices: %.3f over %d processes, want 0.8 over 1", got[100].Share, got[100].Processes)
	}
	_, cs := m.Contexts(time.Second)
	if n := len(cs); n != 5 {
		t.Errorf("%d contexts listed, want 5 (four of pid 1, one of pid 2)", n)
	}
	m.Observe(Timeslice(1, 0, 256*time.Microsecond))
	clk.t += 1000 * ms
	if got = byCgroup(m.Snapshot()); math.Abs(got[100].Share-0.5) > 0.01 {
		t.Errorf("four contexts at a quarter of the other's slice: %.3f, want 0.5", got[100].Share)
	}
}

// The channel group and timeslice a cuCtxCreate sets up before it returns
// belong to the context it reports, not to the context its thread used
// before (none here): the context runs with its 2048 µs slice against
// the other's default 1024 µs, two thirds of the GPU, and no context is
// listed for the thread's setup alone.
func TestContextSetupBelongsToTheContextMade(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	h := func(pid, tid uint32, cg, at uint64) ioctlspy.Header {
		return ioctlspy.Header{PID: pid, TID: tid, CgroupID: cg, Start: at, End: at}
	}
	call := h(1, 11, 100, clk.t)
	call.End = clk.t + 3*us
	m.Observe(&ioctlspy.TSGAllocated{ObjectAllocated: ioctlspy.ObjectAllocated{Header: h(1, 11, 100, clk.t+us)}})
	m.Observe(&ioctlspy.TSGControl{RMControl: ioctlspy.RMControl{Header: h(1, 11, 100, clk.t+2*us), CtrlCmd: nvrm.CtrlTSGSetTimeslice}, Name: "SET_TIMESLICE", TimesliceUS: 2048})
	m.Observe(&ioctlspy.ContextCreated{Header: call, Func: "cuCtxCreate_v2", Ctx: 0xc1})
	m.context(&ioctlspy.Header{PID: 2, TID: 2, CgroupID: 200})
	for _, c := range m.ctxs {
		c.costs[costKey{}] = &cost{ns: float64(ms), learned: true}
		c.learned = true
	}
	for i := 0; i < 2000; i++ {
		ev := launchFn(1, 100, clk.t, 7, 0, 1)
		ev.(*ioctlspy.Launch).TID = 11
		m.Observe(ev)
		m.Observe(launchFn(2, 200, clk.t, 7, 0, 1))
	}
	clk.t = base + 1000*ms
	if _, cs := m.Contexts(time.Second); len(cs) != 2 || cs[0].Ctx != 0xc1 || cs[0].Timeslice != 2048*time.Microsecond {
		t.Fatalf("contexts %+v, want pid 1's context 0xc1 with its 2048 µs slice, and pid 2's", cs)
	}
	if got := byCgroup(m.Snapshot()); math.Abs(got[100].Share-2.0/3) > 0.01 {
		t.Errorf("2048 µs slice beside 1024 µs: %.3f, want 0.667", got[100].Share)
	}
}

// A release the arbiter reports at the clock's present, ahead of events
// of other processes still on their way from the probes, runs the held
// launches at its time without running the GPU past those events: the
// other process's launches, read after the release, run when they were
// made (within the 12 ms before the release), not after it.
func TestReleaseAheadOfTheReplayWaitsForItsTime(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	for _, h := range []ioctlspy.Header{{PID: 1, TID: 1, CgroupID: 100, Start: base}, {PID: 2, TID: 2, CgroupID: 200, Start: base}} {
		c := m.context(&h)
		c.costs[costKey{}] = &cost{ns: float64(ms), learned: true}
		c.learned = true
	}
	held := launchFn(1, 100, base, 7, 0, 10) // 10 ms, held at the launch gate
	held.Hdr().Held = true
	m.Observe(held)
	m.Observe(launchFn(2, 200, base+ms, 7, 0, 1))
	clk.t = base + 20*ms
	m.Observe(Release(1, base, clk.t))
	for i := uint64(2); i <= 10; i++ { // read from the ring after the release
		m.Observe(launchFn(2, 200, base+i*ms, 7, 0, 1))
	}
	clk.t = base + 12*ms
	_, cs := m.Contexts(12 * time.Millisecond)
	got := map[uint32]float64{}
	for _, c := range cs {
		got[c.PID] = float64(c.GPUNS) / float64(ms)
	}
	if got[1] != 0 || math.Abs(got[2]-10) > 0.01 {
		t.Errorf("GPU ms in the 12 ms before the release: held process %.2f, other %.2f; want 0 and 10", got[1], got[2])
	}
	clk.t = base + 40*ms
	_, cs = m.Contexts(40 * time.Millisecond)
	for _, c := range cs {
		got[c.PID] = float64(c.GPUNS) / float64(ms)
	}
	if math.Abs(got[1]-10) > 0.01 || math.Abs(got[2]-10) > 0.01 {
		t.Errorf("GPU ms in the 40 ms: held process %.2f, other %.2f; want 10 each", got[1], got[2])
	}
}

// A held launch read after its release, while a later hold's launches
// wait, runs at its release: it does not wait with them.
func TestLateHeldLaunchDoesNotWaitForALaterHold(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	c := m.context(&ioctlspy.Header{PID: 1, TID: 1, CgroupID: 100, Start: base})
	c.costs[costKey{}] = &cost{ns: float64(ms), learned: true}
	c.learned = true
	heldAt := func(t uint64) ioctlspy.Event {
		ev := launchFn(1, 100, t, 7, 0, 1)
		ev.Hdr().Held = true
		return ev
	}
	m.Observe(heldAt(base))
	m.Observe(launchFn(2, 200, base+6*ms, 7, 0, 1)) // the replay is past the release below
	m.Observe(Release(1, base, base+5*ms))
	m.Observe(heldAt(base + 8*ms)) // held again
	m.Observe(heldAt(base + ms))   // the first hold's, read late
	if len(c.deferred) != 1 {
		t.Errorf("%d launches wait for the second hold's release, want its one", len(c.deferred))
	}
}

// What the GPU's scheduler does to a process's channel groups on one GPU
// reaches its context there alone: pid 1, a context on each of two GPUs,
// is paused on GPU 0 and given a 3 ms slice on GPU 1. GPU 0 is pid 2's,
// and on GPU 1 pid 1 runs 3 ms slices to pid 3's 1 ms: 75% (unsteered on
// GPU 1, pid 1 would be paused there too and pid 3 take all of it).
func TestEffectsActOnTheirGPU(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	made := func(pid, tid uint32, cg, ctx uint64, gpu int32) {
		h := hdr(pid, cg, base-2*ms, base-ms)
		h.TID = tid
		m.Observe(&ioctlspy.ContextCreated{Header: h, Func: "cuCtxCreate_v2", Ctx: ctx, Device: gpu})
	}
	made(1, 11, 100, 0xa, 0)
	made(1, 12, 100, 0xb, 1)
	made(2, 2, 200, 0xc, 0)
	made(3, 3, 300, 0xd, 1)
	for _, c := range m.ctxs {
		c.costs[costKey{}] = &cost{ns: float64(ms), learned: true}
		c.learned = true
	}
	m.Observe(Pause(1, 0, true, base))
	m.Observe(Timeslice(1, 1, 3*time.Millisecond))
	for i := 0; i < 2000; i++ {
		for _, l := range []struct {
			pid, tid uint32
			cg       uint64
		}{{1, 11, 100}, {1, 12, 100}, {2, 2, 200}, {3, 3, 300}} {
			ev := launchFn(l.pid, l.cg, base, 7, 0, 1)
			ev.(*ioctlspy.Launch).TID = l.tid
			m.Observe(ev)
		}
	}
	clk.t = base + 1000*ms
	got := map[[2]int]float64{}
	for _, s := range m.Snapshot().Tenants {
		got[[2]int{int(s.CgroupID), s.GPU}] = s.Share
	}
	for k, want := range map[[2]int]float64{{100, 0}: 0, {200, 0}: 1, {100, 1}: 0.75, {300, 1}: 0.25} {
		if math.Abs(got[k]-want) > 0.01 {
			t.Errorf("cgroup %d on GPU %d: %.3f, want %.2f (all: %v)", k[0], k[1], got[k], want, got)
		}
	}
}

// Work a daemon before this one modeled queued runs in the replay at the
// context's turns: two restored contexts with 600 and 200 ms queued and
// nothing launched since share the GPU until the smaller is done, then
// the other runs alone (600 and 200 ms of the next second). A context the
// meter does not know takes nothing, and the first sync teaches nothing.
func TestRestoredBacklogRunsAtItsTurns(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	m.Observe(&ioctlspy.ContextCreated{Header: hdr(1, 100, base, base), Func: "cuCtxCreate_v2", Ctx: 0xc1})
	m.Observe(&ioctlspy.ContextCreated{Header: hdr(2, 200, base, base), Func: "cuCtxCreate_v2", Ctx: 0xc2})
	_, cs := m.Contexts(time.Second)
	ctxOf := map[uint32]uint64{}
	for _, c := range cs {
		ctxOf[c.PID] = c.Ctx
	}
	m.RestoreBacklog(1, ctxOf[1], float64(600*ms))
	m.RestoreBacklog(2, ctxOf[2], float64(200*ms))
	m.RestoreBacklog(3, 0, float64(900*ms)) // no such context
	clk.t = base + 1000*ms
	_, cs = m.Contexts(time.Second)
	got := map[uint32]float64{}
	for _, c := range cs {
		got[c.PID] = c.Share
	}
	if len(got) != 2 || !near(got[1], 0.6) || !near(got[2], 0.2) {
		t.Errorf("shares %v, want pid 1 at 0.6 and pid 2 at 0.2, nothing else", got)
	}
	// Ten launches of 10 ms and a context sync: the first proof covers the
	// restored work, unseen, and teaches nothing; the next one does.
	for i := 0; i < 10; i++ {
		m.Observe(launch(1, 100, base+1000*ms, 7))
	}
	m.RestoreBacklog(1, ctxOf[1], float64(300*ms))
	m.Observe(syncEv(1, 100, "cuCtxSynchronize", 0, base+1000*ms, base+1100*ms))
	for i := 0; i < 10; i++ {
		m.Observe(launch(1, 100, base+1200*ms, 7))
	}
	m.Observe(syncEv(1, 100, "cuStreamSynchronize", 7, base+1200*ms, base+1300*ms))
	clk.t = base + 1300*ms
	_, cs = m.Contexts(time.Second)
	for _, c := range cs {
		if c.PID == 1 && math.Abs(c.LaunchNS-10e6)/10e6 > 0.01 {
			t.Errorf("cost %.0f ns, want 10 ms a launch (from the second sync only)", c.LaunchNS)
		}
	}
}

// A runtime-API process with a thread per GPU (each retains its device's
// primary context, as cudaSetDevice does) has a context on each GPU: each
// thread's launches are metered on its own GPU, beside a one-context
// process on each (50/50 on both). Its threads on one GPU share that
// GPU's primary context: a third thread retaining GPU 0's again makes no
// third context.
func TestPrimaryContextPerGPU(t *testing.T) {
	base := 10 * 1000 * ms
	clk := &clock{t: base}
	m := New(Config{Now: clk.now})
	retain := func(tid uint32, ctx uint64, dev int32) {
		h := ioctlspy.Header{PID: 1, TID: tid, CgroupID: 100, Start: clk.t, End: clk.t}
		m.Observe(&ioctlspy.ContextCreated{Header: h, Func: "cuDevicePrimaryCtxRetain", Ctx: ctx, Device: dev})
	}
	retain(11, 0xa0, 0)
	retain(12, 0xa1, 1)
	retain(13, 0xa0, 0)
	for pid, dev := range map[uint32]int32{2: 0, 3: 1} {
		h := ioctlspy.Header{PID: pid, TID: pid, CgroupID: 100 * uint64(pid), Start: clk.t, End: clk.t}
		m.Observe(&ioctlspy.ContextCreated{Header: h, Func: "cuDevicePrimaryCtxRetain", Ctx: 0xb0, Device: dev})
	}
	for _, c := range m.ctxs {
		c.costs[costKey{}] = &cost{ns: float64(ms), learned: true}
		c.learned = true
	}
	for i := 0; i < 2000; i++ {
		for _, tid := range []uint32{11, 12, 13} {
			ev := launchFn(1, 100, clk.t, 7, 0, 1)
			ev.(*ioctlspy.Launch).TID = tid
			m.Observe(ev)
		}
		m.Observe(launchFn(2, 200, clk.t, 7, 0, 1))
		m.Observe(launchFn(3, 300, clk.t, 7, 0, 1))
	}
	clk.t = base + 1000*ms
	_, cs := m.Contexts(time.Second)
	if len(cs) != 4 {
		t.Fatalf("%d contexts, want 4 (pid 1 on GPUs 0 and 1, pids 2 and 3): %+v", len(cs), cs)
	}
	for _, c := range cs {
		if math.Abs(c.Share-0.5) > 0.01 || c.PID == 1 && c.Ctx == 0 && c.GPU != 0 || c.PID == 1 && c.Ctx == 0xa1 && c.GPU != 1 {
			t.Errorf("pid %d context 0x%x on GPU %d: %.3f, want 0.5 (pid 1's first primary on GPU 0, 0xa1 on GPU 1)", c.PID, c.Ctx, c.GPU, c.Share)
		}
	}
}
