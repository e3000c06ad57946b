package meter

import (
	"math"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/ioctlspy"
)

// A program that captures its graph at start (launches on a capturing
// stream, forked to a second one through an event) and then only replays
// it, synchronizing its context: the captured launches are no work, so
// the graph's cost is learned whole and the share is the truth. Counted
// as work they made the first sync prove a large backlog drained in no
// time (a graph of 29 kernels, 250 ms a replay, read 0–18% for 99.6%).
func TestCapturedLaunchesAreNoWork(t *testing.T) {
	const (
		capStream, side, replay = 5, 6, 7
		fork, join              = 0xf1, 0xf2
		graphCost               = 50 * ms // a replay of the captured graph
		think                   = 5 * ms
	)
	clk := &clock{t: 10 * 1000 * ms}
	m := New(Config{Now: clk.now})
	at := func(pid uint32) ioctlspy.Header { return hdr(pid, 100, clk.t, clk.t) }
	m.Observe(&ioctlspy.StreamCapture{Header: at(1), Stream: capStream, Begin: true})
	m.Observe(&ioctlspy.EventRecord{Header: at(1), Event: fork, Stream: capStream})
	m.Observe(&ioctlspy.StreamWaitEvent{Header: at(1), Stream: side, Event: fork})
	for i := range 58 {
		m.Observe(launchFn(1, 100, clk.t, []uint64{capStream, side}[i%2], 0xa+uint64(i%2), 100))
	}
	m.Observe(&ioctlspy.EventRecord{Header: at(1), Event: join, Stream: side})
	m.Observe(&ioctlspy.StreamWaitEvent{Header: at(1), Stream: capStream, Event: join})
	m.Observe(&ioctlspy.StreamCapture{Header: at(1), Stream: capStream})
	if c := m.ctxs[ctxKey{pid: 1}]; c.capturing(capStream) || c.capturing(side) || len(c.capturedEvents) != 0 {
		t.Fatalf("the capture's end left streams capturing or events remembered")
	}
	clk.t += ms
	start, replays := clk.t, uint64(0)
	for clk.t < start+3000*ms {
		replays += 6
		t0 := clk.t
		for range 6 {
			m.Observe(&ioctlspy.GraphLaunch{Header: at(1), Exec: 0xe, Stream: replay})
		}
		m.Observe(waitBegin(1, 100, "context", 0, t0))
		clk.t = t0 + 6*graphCost
		m.Observe(&ioctlspy.Sync{Header: hdr(1, 100, t0, clk.t), Func: "cuCtxSynchronize", Of: ioctlspy.WaitContext})
		clk.t += think
	}
	// Launched outside a capture, the same stream's work counts again.
	if c := m.ctxs[ctxKey{pid: 1}]; c.capturing(capStream) {
		t.Fatal("the capturing stream still reads as capturing")
	}
	m.Tick()
	_, cs := m.Contexts(time.Second)
	truth := float64(6*graphCost) / float64(6*graphCost+think)
	g := m.ctxs[ctxKey{pid: 1}].costs[costKey{graph: true, handle: 0xe}].ns
	t.Logf("share %.3f (true %.3f), graph %.1f ms a replay (true %d)", cs[0].Share, truth, g/1e6, graphCost/ms)
	if math.Abs(cs[0].Share-truth) > 0.03 || math.Abs(g/float64(graphCost)-1) > 0.05 {
		t.Errorf("share %.3f, graph %.1f ms a replay: want %.3f and %d ms", cs[0].Share, g/1e6, truth, graphCost/ms)
	}
	if n := m.ctxs[ctxKey{pid: 1}].total.Launches; n != replays {
		t.Errorf("%d launches counted for %d graph replays: the captured ones must not count", n, replays)
	}
}
