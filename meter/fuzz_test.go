package meter

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/ioctlspy"
)

// FuzzEventStream feeds the meter event streams a hostile or broken
// process could produce (any order, any handles, times going back, syncs
// of what was never launched, exits and reuse of a pid, held launches,
// pauses, freezes, unprobed processes, polls) and checks what it must hold
// whatever comes: no panic, every share and GPU busy fraction within
// [0, 1], no GPU's tenants summing past it, and bounded contexts.
func FuzzEventStream(f *testing.F) {
	f.Add([]byte{0, 1, 0, 10, 0, 0, 0, 0, 1, 0, 0, 5, 0, 0, 0, 0})
	f.Add([]byte{0, 1, 0, 10, 7, 7, 1, 0, 2, 1, 0, 50, 7, 0, 0, 0, 3, 1, 0, 60, 7, 0, 0, 0, 4, 2, 1, 0, 7, 0, 0, 0})
	f.Add([]byte{9, 2, 0, 1, 0, 0, 0, 0, 10, 2, 1, 200, 0, 0, 0, 0, 11, 1, 0, 10, 1, 0, 0, 0, 5, 1, 0, 1, 0, 0, 0, 0})
	f.Add([]byte{0, 1, 0, 10, 7, 0, 0, 0, 4, 1, 0, 1, 7, 0, 0, 0, 7, 1, 0, 1, 7, 0, 0, 0, 14, 1, 0, 40, 7, 30, 200, 0, 14, 1, 0, 4, 7, 255, 1, 0})
	f.Fuzz(checkEventStream)
}

// checkEventStream plays the events data encodes (8 bytes each) into a
// meter and checks its figures.
func checkEventStream(t *testing.T, data []byte) {
	clk := &clock{t: 10 * uint64(time.Second)}
	m := New(Config{Now: clk.now, Window: time.Second})
	for len(data) >= 8 {
		b := data[:8]
		data = data[8:]
		pid, cg := uint32(b[1]%4)+1, uint64(b[2]%3)+100
		// Times mostly move on, now and then go back.
		step := uint64(b[3]) * uint64(time.Millisecond) / 4
		if b[3] == 255 {
			clk.t -= min(clk.t/2, uint64(50*time.Millisecond))
		} else {
			clk.t += step
		}
		handle := uint64(b[4] % 8)
		arg := binary.LittleEndian.Uint16(b[6:])
		h := hdr(pid, cg, clk.t, clk.t+uint64(arg)*uint64(time.Microsecond))
		h.Held = b[5]&1 == 1
		switch b[0] % 15 {
		case 0:
			m.Observe(&ioctlspy.Launch{Header: h, Function: handle, Stream: uint64(b[5] % 4), Grid: [3]uint32{uint32(arg), 1, 1}})
		case 1:
			m.Observe(&ioctlspy.Sync{Header: h, Func: "cuStreamSynchronize", Of: ioctlspy.WaitStream, Handle: uint64(b[5] % 4)})
		case 2:
			m.Observe(&ioctlspy.Sync{Header: h, Func: "cuCtxSynchronize", Of: ioctlspy.WaitContext})
		case 3:
			m.Observe(&ioctlspy.Sync{Header: h, Func: "cuEventSynchronize", Of: ioctlspy.WaitEvent, Handle: handle})
		case 4:
			m.Observe(&ioctlspy.EventRecord{Header: h, Event: handle, Stream: uint64(b[5] % 4)})
		case 5:
			m.Observe(&ioctlspy.ProcessExit{Header: h})
		case 6:
			m.Observe(&ioctlspy.GraphLaunch{Header: h, Exec: handle, Stream: uint64(b[5] % 4)})
		case 7:
			m.Observe(&ioctlspy.WaitBegin{Header: h, Func: "cuEventQuery", Of: ioctlspy.WaitEvent, Handle: handle})
		case 8:
			m.Observe(&ioctlspy.MemAlloc{Header: h, DPtr: handle, Bytes: uint64(arg)})
		case 9:
			m.Observe(&ioctlspy.ContextCreated{Header: h, Ctx: handle, Device: int32(b[5] % 2)})
		case 10:
			m.Observe(Freeze(cg, clk.t, clk.t+uint64(arg)*uint64(time.Microsecond)))
		case 11:
			m.Observe(Release(pid, clk.t-min(clk.t, uint64(arg)*uint64(time.Microsecond)), clk.t))
		case 12:
			m.Observe(Pause(pid, 0, b[5]&1 == 1, clk.t))
		case 13:
			m.Observe(Unprobed(pid, cg, int(b[5]%2), clk.t))
		case 14:
			// A polling loop's end, its last not-done query anywhere.
			m.Observe(&ioctlspy.Sync{Header: h, Func: "cuEventQuery", Of: ioctlspy.WaitEvent, Handle: handle, Polled: true,
				NotDoneAt: h.Start + uint64(b[5])*uint64(10*time.Microsecond)})
		}
		if b[0]%5 == 0 {
			m.Tick()
		}
	}
	clk.t += uint64(time.Second)
	snap := m.Snapshot()
	perGPU := map[int]float64{}
	for _, ts := range snap.Tenants {
		if !(ts.Share >= 0 && ts.Share <= 1+1e-9) || math.IsNaN(ts.LongRunShare) {
			t.Fatalf("tenant share %v, long-run %v", ts.Share, ts.LongRunShare)
		}
		perGPU[ts.GPU] += ts.Share
	}
	for gpu, sum := range perGPU {
		if sum > 1+1e-6 {
			t.Fatalf("GPU %d: tenants' shares sum to %v", gpu, sum)
		}
	}
	for _, g := range snap.GPUs {
		if !(g.BusyShare >= 0 && g.BusyShare <= 1+1e-9) {
			t.Fatalf("GPU %d busy %v", g.Index, g.BusyShare)
		}
	}
	_, ctxs := m.Contexts(time.Second)
	for _, c := range ctxs {
		if !(c.Share >= 0 && c.Share <= 1+1e-9) || c.WantNS > uint64(time.Second) || math.IsNaN(c.LaunchNS) {
			t.Fatalf("context %+v", c)
		}
	}
	for _, c := range m.ctxs {
		if len(c.streams) > maxStreams || len(c.costs) > maxCostKeys+1 {
			t.Fatalf("context of pid %d keeps %d streams and %d costs", c.pid, len(c.streams), len(c.costs))
		}
	}
}
