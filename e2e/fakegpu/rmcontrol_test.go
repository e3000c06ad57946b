package fakegpu

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/nvrm"
)

// TestControlChecks runs the simulated driver's checks of RM controls:
// sizes, commands, handles, privilege, and FIFO_DISABLE_CHANNELS' list.
func TestControlChecks(t *testing.T) {
	s, g := newTestGPU(t)
	const client, tsg, subdev, channel = 0xc1e00001, 0x5c000010, 0x5c000003, 0x5c000011
	x, err := g.addContext(1, 42, "/", client, tsg, subdev, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.removeContext(x)
	x.chans[0].handle = channel
	le := binary.LittleEndian
	disable := func(foreign bool, event uint64) []byte {
		p := make([]byte, 536)
		p[0] = 1
		le.PutUint32(p[4:], 1)
		le.PutUint64(p[16:], event)
		c := uint32(client)
		if foreign {
			c = 0xc1e00099
		}
		le.PutUint32(p[24:], c)
		le.PutUint32(p[280:], channel)
		return p
	}
	for _, tc := range []struct {
		name           string
		client, object uint32
		cmd            uint32
		params         []byte
		admin          bool
		want           uint32
	}{
		{"GET_INFO", client, tsg, CtrlTSGGetInfo, make([]byte, 4), false, nvOK},
		{"unknown client", 0x1234, tsg, CtrlTSGGetInfo, make([]byte, 4), false, nvErrInvalidClient},
		{"unknown object", client, 0x1234, CtrlTSGGetInfo, make([]byte, 4), false, nvErrInvalidObject},
		{"wrong params size", client, tsg, CtrlTSGSetTimeslice, make([]byte, 4), false, nvErrInvalidParamSize},
		{"unknown control", client, tsg, 0xa06c01ff, nil, false, nvErrInvalidCommand},
		{"timeslice below the minimum", client, tsg, CtrlTSGSetTimeslice, le.AppendUint64(nil, 10), false, nvErrInvalidArgument},
		{"restart without privilege", client, channel, CtrlChannelRestartRunlist, []byte{1, 0}, false, nvErrInsufficientPerms},
		{"restart", client, channel, CtrlChannelRestartRunlist, []byte{1, 0}, true, nvOK},
		{"restart through a handle that is no channel", client, tsg, CtrlChannelRestartRunlist, []byte{1, 0}, true, nvErrInvalidObject},
		{"disable", client, subdev, CtrlSubdevFIFODisableChans, disable(false, 0), true, nvOK},
		{"disable another client's channel", client, subdev, CtrlSubdevFIFODisableChans, disable(true, 0), true, nvErrInvalidClient},
		{"disable with a preempt event", client, subdev, CtrlSubdevFIFODisableChans, disable(false, 1), true, nvErrInvalidArgument},
		{"disable through a handle that is no subdevice", client, tsg, CtrlSubdevFIFODisableChans, disable(false, 0), true, nvErrInvalidObject},
	} {
		if status, _ := s.control(tc.client, tc.object, tc.cmd, tc.params, tc.admin); status != tc.want {
			t.Errorf("%s: status 0x%x, want 0x%x", tc.name, status, tc.want)
		}
	}
	// A timeslice set on a group that has run waits for a restart.
	x.scheduled = true
	if status, _ := s.control(client, tsg, CtrlTSGSetTimeslice, le.AppendUint64(nil, 3000), false); status != nvOK {
		t.Fatalf("SET_TIMESLICE: 0x%x", status)
	}
	if x.timeslice != 0 || !x.chans[0].nextDisabled || x.chans[0].disabled {
		t.Errorf("before the restart: timeslice %v, disabled %v (next %v)", x.timeslice, x.chans[0].disabled, x.chans[0].nextDisabled)
	}
	g.restartRunlist()
	if x.timeslice != 3*time.Millisecond || !x.chans[0].disabled {
		t.Errorf("after the restart: timeslice %v, disabled %v", x.timeslice, x.chans[0].disabled)
	}
}

// A disable evicts a running group at the runlist's restart; one with
// bOnlyDisableScheduling leaves it running until its slice ends, as the
// driver leaves what runs in hardware.
func TestDisableEvictsUnlessOnlyScheduling(t *testing.T) {
	for _, onlyScheduling := range []bool{false, true} {
		s, g := newTestGPU(t)
		const client, tsg, subdev, channel = 0xc1e00001, 0x5c000010, 0x5c000003, 0x5c000011
		x, err := g.addContext(1, 42, "/", client, tsg, subdev, 0)
		if err != nil {
			t.Fatal(err)
		}
		x.chans[0].handle = channel
		x.timeslice = 50 * time.Millisecond
		g.mu.Lock()
		now := monotonicNS()
		g.vt = now - int64(20*time.Millisecond)
		ch := &x.shm.Ch[0]
		ch.Ring[0] = entry{Kind: entryKernel, Event: 1, CostNS: uint64(time.Second)}
		atomic.StoreUint64(&ch.RingAt, uint64(g.vt))
		atomic.OrUint32(&x.shm.Chans, 1) // the client marks the channel used before its first entry
		atomic.StoreUint64(&ch.GPPut, 1)
		atomic.AddUint32(&g.db.Ring, 1)
		g.catchUp()
		if !g.running || g.cur != x || g.sliceEnd <= g.vt {
			g.mu.Unlock()
			t.Fatalf("the group is not running in its 50 ms slice: running %v, slice ends in %v", g.running, time.Duration(g.sliceEnd-g.vt))
		}
		g.mu.Unlock()
		p := make([]byte, 536)
		p[0] = 1
		if onlyScheduling {
			p[8] = 1
		}
		le := binary.LittleEndian
		le.PutUint32(p[4:], 1)
		le.PutUint32(p[24:], client)
		le.PutUint32(p[280:], channel)
		if status, _ := s.control(client, subdev, CtrlSubdevFIFODisableChans, p, true); status != nvOK {
			t.Fatalf("FIFO_DISABLE_CHANNELS: 0x%x", status)
		}
		g.restartRunlist()
		g.mu.Lock()
		g.catchUp()
		running := g.running && g.cur == x
		g.mu.Unlock()
		if running != onlyScheduling {
			t.Errorf("bOnlyDisableScheduling %v: the group still running after the restart: %v", onlyScheduling, running)
		}
		g.removeContext(x)
	}
}

// GET_PID_INFO answers, per process asked for, the device memory its
// contexts hold on the subdevice's GPU, the contexts' baseline included,
// and 0 for a process with none there; an index other than
// VIDEO_MEMORY_USAGE fails its entry alone.
func TestPIDInfoCountsEachProcessOnTheGPU(t *testing.T) {
	s, g := newTestGPU(t)
	const client, subdev = 0xc1e00001, 0x5c000003
	s.cfg.ContextMemory = 8 << 20
	var xs []*gpuContext
	for i, pid := range []int{42, 42, 43} {
		x, err := g.addContext(uint64(i+1), pid, "/", uint32(client+i), uint32(0x5c000010+i), uint32(subdev+i), 0)
		if err != nil {
			t.Fatal(err)
		}
		xs = append(xs, x)
	}
	defer func() {
		for _, x := range xs {
			g.removeContext(x)
		}
	}()
	if r := g.alloc(xs[1], 100<<20); r.status != 0 {
		t.Fatalf("alloc: status %d", r.status)
	}
	le := binary.LittleEndian
	p := make([]byte, 14408)
	le.PutUint32(p, 4)
	for i, pid := range []uint32{42, 43, 44, 42} {
		le.PutUint32(p[8+72*i:], pid)
	}
	le.PutUint32(p[8+72*3+4:], 1) // no such index
	if status, _ := s.control(client, subdev, CtrlSubdevGetPIDInfo, p, false); status != nvOK {
		t.Fatalf("status 0x%x", status)
	}
	for i, want := range []struct {
		result uint32
		bytes  uint64
	}{{nvOK, 2*8<<20 + 100<<20}, {nvOK, 8 << 20}, {nvOK, 0}, {nvErrInvalidArgument, 0}} {
		e := p[8+72*i:]
		if got, bytes := le.Uint32(e[8:]), le.Uint64(e[16:]); got != want.result || bytes != want.bytes {
			t.Errorf("entry %d (pid %d): result 0x%x, %d bytes; want 0x%x, %d", i, le.Uint32(e), got, bytes, want.result, want.bytes)
		}
	}
	le.PutUint32(p, 0)
	if status, _ := s.control(client, subdev, CtrlSubdevGetPIDInfo, p, false); status != nvErrInvalidArgument {
		t.Errorf("an empty list: status 0x%x, want NV_ERR_INVALID_ARGUMENT", status)
	}
	le.PutUint32(p, 1)
	if status, _ := s.control(client, 0x5c000010, CtrlSubdevGetPIDInfo, p, false); status != nvErrInvalidObject {
		t.Errorf("through a handle that is no subdevice: status 0x%x, want NV_ERR_INVALID_OBJECT_HANDLE", status)
	}
}

// FB_GET_INFO_V2 answers the GPU's size and what its contexts leave free,
// in KiB, through a subdevice, and refuses an index it does not know.
func TestFBInfoAnswersTheGPUsMemory(t *testing.T) {
	s, g := newTestGPU(t)
	const client, subdev = 0xc1e00001, 0x5c000003
	s.cfg.Memory, s.cfg.ContextMemory = 16<<30, 8<<20
	x, err := g.addContext(1, 42, "/", client, 0x5c000010, subdev, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.removeContext(x)
	if r := g.alloc(x, 100<<20); r.status != 0 {
		t.Fatalf("alloc: status %d", r.status)
	}
	le := binary.LittleEndian
	p := make([]byte, controlSize[CtrlSubdevFBGetInfoV2])
	le.PutUint32(p, 3)
	for i, idx := range []uint32{fbInfoHeapSize, fbInfoTotalRAMSize, fbInfoHeapFree} {
		le.PutUint32(p[4+8*i:], idx)
	}
	if status, _ := s.control(client, subdev, CtrlSubdevFBGetInfoV2, p, false); status != nvOK {
		t.Fatalf("status 0x%x", status)
	}
	for i, want := range []uint32{16 << 20, 16 << 20, (16<<30 - 108<<20) >> 10} {
		if got := le.Uint32(p[8+8*i:]); got != want {
			t.Errorf("entry %d (index 0x%x): %d KiB, want %d", i, le.Uint32(p[4+8*i:]), got, want)
		}
	}
	le.PutUint32(p[4:], 0x7f)
	if status, _ := s.control(client, subdev, CtrlSubdevFBGetInfoV2, p, false); status != nvErrInvalidArgument {
		t.Errorf("an unknown index: status 0x%x, want NV_ERR_INVALID_ARGUMENT", status)
	}
	if status, _ := s.control(client, subdev, CtrlSubdevFBGetInfoV2, p[:nvrm.FBInfoSize(55)], false); status != nvErrInvalidParamSize {
		t.Errorf("an earlier driver's list length: status 0x%x, want NV_ERR_INVALID_PARAM_STRUCT", status)
	}
}

// The simulated driver's controls and statuses are the real driver's
// that gpuarb speaks (package nvrm).
func TestSimulatedDriverSpeaksGpuarbsVocabulary(t *testing.T) {
	for _, c := range []struct {
		name            string
		simulated, real uint32
	}{
		{"TSG SET_TIMESLICE", CtrlTSGSetTimeslice, nvrm.CtrlTSGSetTimeslice},
		{"TSG GET_TIMESLICE", CtrlTSGGetTimeslice, nvrm.CtrlTSGGetTimeslice},
		{"TSG PREEMPT", CtrlTSGPreempt, nvrm.CtrlTSGPreempt},
		{"TSG GET_INFO", CtrlTSGGetInfo, nvrm.CtrlTSGGetInfo},
		{"channel RESTART_RUNLIST", CtrlChannelRestartRunlist, nvrm.CtrlRestartRunlist},
		{"subdevice FIFO_DISABLE_CHANNELS", CtrlSubdevFIFODisableChans, nvrm.CtrlFIFODisableChannels},
		{"FIFO_DISABLE_CHANNELS size", uint32(controlSize[CtrlSubdevFIFODisableChans]), nvrm.FIFODisableSize},
		{"FIFO_DISABLE_CHANNELS length", maxDisable, nvrm.FIFODisableMax},
		{"subdevice GET_PID_INFO", CtrlSubdevGetPIDInfo, nvrm.CtrlGPUGetPIDInfo},
		{"GET_PID_INFO size", uint32(controlSize[CtrlSubdevGetPIDInfo]), nvrm.PIDInfoSize},
		{"GET_PID_INFO length", maxPIDInfo, nvrm.PIDInfoMax},
		{"subdevice FB_GET_INFO_V2", CtrlSubdevFBGetInfoV2, nvrm.CtrlFBGetInfoV2},
		{"FB_GET_INFO_V2 size", uint32(controlSize[CtrlSubdevFBGetInfoV2]), uint32(nvrm.FBInfoSize(nvrm.FBInfoMaxLists[0]))},
		{"FB_GET_INFO_V2 HEAP_SIZE", fbInfoHeapSize, nvrm.FBInfoHeapSize},
		{"FB_GET_INFO_V2 TOTAL_RAM_SIZE", fbInfoTotalRAMSize, nvrm.FBInfoTotalRAMSize},
		{"FB_GET_INFO_V2 HEAP_FREE", fbInfoHeapFree, nvrm.FBInfoHeapFree},
		{"NV_OK", nvOK, nvrm.StatusOK},
		{"NV_ERR_INSUFFICIENT_PERMISSIONS", nvErrInsufficientPerms, nvrm.StatusInsufficientPerms},
		{"NV_ERR_INVALID_ARGUMENT", nvErrInvalidArgument, nvrm.StatusInvalidArgument},
		{"NV_ERR_INVALID_CLIENT", nvErrInvalidClient, nvrm.StatusInvalidClient},
		{"NV_ERR_INVALID_COMMAND", nvErrInvalidCommand, nvrm.StatusInvalidCommand},
		{"NV_ERR_INVALID_OBJECT_HANDLE", nvErrInvalidObject, nvrm.StatusInvalidObject},
		{"NV_ERR_INVALID_PARAM_STRUCT", nvErrInvalidParamSize, nvrm.StatusInvalidParamSize},
	} {
		if c.simulated != c.real {
			t.Errorf("%s: the simulator has %#x, gpuarb %#x", c.name, c.simulated, c.real)
		}
	}
}
