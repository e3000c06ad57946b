package fakegpu

import (
	"encoding/binary"
	"io"
	"time"
)

// RM controls the simulated driver takes (open-gpu-kernel-modules ctrl
// headers; docs/driver.md §3), with the parameter sizes the driver
// checks exactly.
const (
	CtrlTSGGPFIFOSchedule      = 0xa06c0101 // {bool bEnable, bSkipSubmit, bSkipEnable}: not a pause
	CtrlTSGSetTimeslice        = 0xa06c0103 // {u64 timesliceUs}: takes effect at a runlist restart
	CtrlTSGGetTimeslice        = 0xa06c0104 // {u64 timesliceUs}
	CtrlTSGPreempt             = 0xa06c0105 // {bool bWait; bool bManualTimeout; u32 timeoutUs@4}: one-shot
	CtrlTSGGetInfo             = 0xa06c0106 // {u32 tsgID}
	CtrlTSGSetInterleaveLevel  = 0xa06c0107 // {u32 level}: accepted, not simulated
	CtrlChannelRestartRunlist  = 0xa06f0111 // on a channel: {bool bForceRestart, bBypassWait}
	CtrlSubdevFIFODisableChans = 0x2080110b // on the subdevice: 536 B, see disableChannels
	CtrlSubdevGetPIDInfo       = 0x2080018e // on the subdevice: 14408 B, see pidInfo
	CtrlSubdevFBGetInfoV2      = 0x20801303 // on the subdevice: 1028 B (R580's), see fbInfo
	// CtrlSimSchedCosts is the simulator's own, on a TSG: {u64
	// defaultTimesliceUs; u64 contextSwitchNs; u64 preemptNs}, what its
	// scheduler costs, which gpuarb reads where a real driver's are the
	// real-GPU check's figures (gpusched.Slices).
	CtrlSimSchedCosts = 0xfa6c0001
)

// Parameter sizes of the controls, which must match exactly.
var controlSize = map[uint32]int{CtrlTSGGPFIFOSchedule: 3, CtrlTSGSetTimeslice: 8, CtrlTSGGetTimeslice: 8, CtrlTSGPreempt: 8,
	CtrlTSGGetInfo: 4, CtrlTSGSetInterleaveLevel: 4, CtrlChannelRestartRunlist: 2, CtrlSubdevFIFODisableChans: 536,
	CtrlSubdevGetPIDInfo: 14408, CtrlSubdevFBGetInfoV2: 4 + maxFBInfo*8,
	CtrlSimSchedCosts: 24}

// privileged controls need an administrator (RS_ACCESS_NICE or
// CAP_SYS_ADMIN in the driver; root here).
var privileged = map[uint32]bool{CtrlChannelRestartRunlist: true, CtrlSubdevFIFODisableChans: true, CtrlTSGSetInterleaveLevel: true}

// NV_STATUS values the simulated driver answers.
const (
	nvOK                   = 0x00
	nvErrInsufficientPerms = 0x1b
	nvErrInvalidArgument   = 0x1f
	nvErrInvalidClient     = 0x23
	nvErrInvalidCommand    = 0x24
	nvErrInvalidObject     = 0x33
	nvErrInvalidParamSize  = 0x37
	nvErrTimeout           = 0x65
)

// Costs and limits of the controls the device serves: a one-shot
// preemption blocks its caller this long (measured by third parties,
// docs/driver.md §3), and a runlist restart switches the running group out.
const (
	preemptCost = 300 * time.Microsecond
	// minTimeslice is the simulator's floor for SET_TIMESLICE, gpuarb's
	// shortest slice (arbiter.MinSlice). The open driver has none on Volta
	// and later (kfifoRunlistGetMinTimeSlice returns 0); what shorter
	// slices cost on hardware is the real-GPU check's context-switch step.
	minTimeslice = 100 * time.Microsecond
	// maxDisable is FIFO_DISABLE_CHANNELS' list length.
	maxDisable = 64
)

// rmControl serves FG_OP_RM_CONTROL: an RM_CONTROL as the driver takes it.
// The control is made through the file attached, or the sender's own
// client's file: like the driver, the simulator takes controls on a client
// only through the open file that client is bound to.
func (s *Server) rmControl(cn *conn, req request, fds []int) error {
	defer closeAll(fds)
	size := req.gpu
	if size > maxRMParams {
		_, err := cn.c.Write(response{status: nvErrInvalidParamSize}.bytes())
		return err
	}
	params := make([]byte, size)
	if _, err := io.ReadFull(cn.c, params); err != nil {
		return err
	}
	client := uint32(req.arg0)
	var owner bool
	switch {
	case len(fds) > 0:
		owner = s.reg.sameFile(client, fds[0])
	case cn.file >= 0 && cn.client == client:
		owner = true
	}
	status := uint32(nvErrInvalidClient)
	switch {
	case req.deadline != 0 && monotonicNS() > req.deadline:
		// Its sender gave up waiting: a driver's ioctl is made while its
		// caller waits, or not at all, never later.
		status = nvErrTimeout
	case owner:
		status, params = s.control(client, uint32(req.arg1), uint32(req.arg2), params, cn.uid == 0)
	}
	if _, err := cn.c.Write(response{status: int32(status), val0: uint64(len(params))}.bytes()); err != nil {
		return err
	}
	_, err := cn.c.Write(params)
	return err
}

// control applies one RM control of an owner of the client and returns its
// status and the params as the driver hands them back.
func (s *Server) control(client, object, cmd uint32, params []byte, admin bool) (uint32, []byte) {
	n, known := controlSize[cmd]
	switch {
	case !known:
		return nvErrInvalidCommand, params
	case len(params) != n:
		return nvErrInvalidParamSize, params
	case privileged[cmd] && !admin:
		return nvErrInsufficientPerms, params
	}
	le := binary.LittleEndian
	switch cmd {
	case CtrlChannelRestartRunlist:
		x, _, status := s.find(client, func(x *gpuContext) int { return x.channelOf(object) })
		if status != nvOK {
			return status, params
		}
		x.gpu.restartRunlist()
		return nvOK, params
	case CtrlSubdevFIFODisableChans:
		return s.disableChannels(client, object, params), params
	case CtrlSubdevGetPIDInfo:
		return s.pidInfo(client, object, params), params
	case CtrlSubdevFBGetInfoV2:
		return s.fbInfo(client, object, params), params
	}
	x, _, status := s.find(client, func(x *gpuContext) int {
		if x.tsg == object {
			return 0
		}
		return -1
	})
	if status != nvOK {
		return status, params
	}
	g := x.gpu
	g.mu.Lock()
	defer g.mu.Unlock()
	switch cmd {
	case CtrlTSGSetTimeslice:
		us := le.Uint64(params)
		if time.Duration(us)*time.Microsecond < minTimeslice || us > uint64(time.Hour/time.Microsecond) {
			return nvErrInvalidArgument, params
		}
		x.nextSlice = time.Duration(us) * time.Microsecond
		if !x.scheduled {
			x.timeslice = x.nextSlice // not on the hardware runlist yet
		}
	case CtrlTSGGetTimeslice:
		le.PutUint64(params, uint64(x.slice()/int64(time.Microsecond)))
	case CtrlTSGGetInfo:
		le.PutUint32(params, uint32(x.id))
	case CtrlSimSchedCosts:
		le.PutUint64(params, uint64(g.cfg.Timeslice/time.Microsecond))
		le.PutUint64(params[8:], uint64(g.cfg.ContextSwitch))
		le.PutUint64(params[16:], uint64(preemptCost))
	case CtrlTSGPreempt:
		if g.running && g.cur == x {
			g.cur.chans[g.curCh].busy = false // preempted: it stays runnable
			g.running = false
			g.sliceEnd = g.vt
		}
		if params[0] != 0 { // bWait
			g.mu.Unlock()
			time.Sleep(preemptCost)
			g.mu.Lock()
		}
	case CtrlTSGGPFIFOSchedule, CtrlTSGSetInterleaveLevel:
		// Accepted: a running saturating group keeps running (docs/driver.md §3).
	}
	return nvOK, params
}

// find returns the live context of client for which match returns a
// channel index (0 for the group itself), with that index.
func (s *Server) find(client uint32, match func(*gpuContext) int) (*gpuContext, int, uint32) {
	s.reg.mu.RLock()
	defer s.reg.mu.RUnlock()
	known := false
	for _, x := range s.reg.ctxs {
		if x.client != client {
			continue
		}
		known = true
		if ch := match(x); ch >= 0 {
			return x, ch, nvOK
		}
	}
	if !known {
		return nil, -1, nvErrInvalidClient
	}
	return nil, -1, nvErrInvalidObject
}

// channelOf is the index of the channel with RM handle h, -1 if none. Reads
// handles set under the GPU's lock: a stale read only misses a channel
// being created.
func (x *gpuContext) channelOf(h uint32) int {
	for i := range x.chans {
		if h != 0 && x.chans[i].handle == h {
			return i
		}
	}
	return -1
}

// disableChannels is FIFO_DISABLE_CHANNELS: {bool bDisable@0; u32
// numChannels@4; bool bOnlyDisableScheduling@8; bool bRewindGpPut@9; u64
// pRunlistPreemptEvent@16 (must be 0); u32 hClientList[64]@24; u32
// hChannelList[64]@280}. The channels go off (or back on) the runlist at
// the next restart, which evicts a running one at once unless
// bOnlyDisableScheduling (then its slice runs out first); their queued
// work stays.
func (s *Server) disableChannels(client, subdevice uint32, p []byte) uint32 {
	le := binary.LittleEndian
	disable, onlyScheduling, n := p[0] != 0, p[8] != 0, le.Uint32(p[4:])
	if n > maxDisable || le.Uint64(p[16:]) != 0 {
		return nvErrInvalidArgument
	}
	if _, _, status := s.find(client, func(x *gpuContext) int {
		if x.subdevice == subdevice && subdevice != 0 {
			return 0
		}
		return -1
	}); status != nvOK {
		return status
	}
	type target struct {
		x  *gpuContext
		ch int
	}
	var ts []target
	for i := range n {
		c, h := le.Uint32(p[24+4*i:]), le.Uint32(p[280+4*i:])
		if c != client {
			return nvErrInvalidClient // another client's channels need that client's file
		}
		x, ch, status := s.find(c, func(x *gpuContext) int { return x.channelOf(h) })
		if status != nvOK {
			return status
		}
		ts = append(ts, target{x, ch})
	}
	for _, t := range ts {
		t.x.gpu.mu.Lock()
		t.x.chans[t.ch].nextDisabled = disable
		t.x.chans[t.ch].nextOnlyScheduling = disable && onlyScheduling
		t.x.gpu.mu.Unlock()
	}
	return nvOK
}

// pidInfo is GET_PID_INFO: {u32 pidInfoListCount; entries@8 of 72 B:
// {u32 pid; u32 index; u32 result; u64 memPrivate@16, memSharedOwned@24,
// memSharedDuped@32, …; u32 computeInstanceId@64, gpuInstanceId@68}}. For
// index 0 (VIDEO_MEMORY_USAGE) memPrivate is the device memory the
// process's contexts on the subdevice's GPU hold, each context's baseline
// included, as the driver counts a process's RM memory objects.
func (s *Server) pidInfo(client, subdevice uint32, p []byte) uint32 {
	le := binary.LittleEndian
	n := le.Uint32(p)
	if n == 0 || n > maxPIDInfo {
		return nvErrInvalidArgument
	}
	g, status := s.gpuOfSubdevice(client, subdevice)
	if status != nvOK {
		return status
	}
	var on []*gpuContext
	s.reg.mu.RLock()
	for _, c := range s.reg.ctxs {
		if c.gpu == g {
			on = append(on, c)
		}
	}
	s.reg.mu.RUnlock()
	held := map[uint32]uint64{}
	g.mu.Lock() // after the registry's lock is let go: a free takes them the other way round
	for _, c := range on {
		held[uint32(c.pid)] += c.memBytes
	}
	g.mu.Unlock()
	for i := range n {
		e := p[8+72*i : 8+72*(i+1)]
		if le.Uint32(e[4:]) != 0 {
			le.PutUint32(e[8:], nvErrInvalidArgument)
			continue
		}
		clear(e[8:])
		le.PutUint64(e[16:], held[le.Uint32(e)])
		le.PutUint32(e[64:], partitionInvalid)
		le.PutUint32(e[68:], partitionInvalid)
	}
	return nvOK
}

// gpuOfSubdevice is the GPU of the client's subdevice.
func (s *Server) gpuOfSubdevice(client, subdevice uint32) (*gpu, uint32) {
	x, _, status := s.find(client, func(x *gpuContext) int {
		if x.subdevice == subdevice && subdevice != 0 {
			return 0
		}
		return -1
	})
	if status != nvOK {
		return nil, status
	}
	return x.gpu, nvOK
}

// maxPIDInfo is GET_PID_INFO's list length; partitionInvalid the
// instance ids of a GPU without MIG; maxFBInfo FB_GET_INFO_V2's list length
// (R580's).
const (
	maxPIDInfo       = 200
	partitionInvalid = 0xffffffff
	maxFBInfo        = 128
)

// FB_GET_INFO_V2 indices the simulated GPU answers, in KiB.
const (
	fbInfoTotalRAMSize = 0x08
	fbInfoHeapSize     = 0x09
	fbInfoHeapFree     = 0x16
)

// fbInfo is FB_GET_INFO_V2: {u32 fbInfoListSize; {u32 index; u32
// data}@4 …}. The simulated GPU's memory is all heap: TOTAL_RAM_SIZE and
// HEAP_SIZE are its size, HEAP_FREE what its contexts do not hold. An
// index it does not know is refused, as the driver refuses one past its
// range.
func (s *Server) fbInfo(client, subdevice uint32, p []byte) uint32 {
	le := binary.LittleEndian
	n := le.Uint32(p)
	if n == 0 || n > maxFBInfo {
		return nvErrInvalidArgument
	}
	g, status := s.gpuOfSubdevice(client, subdevice)
	if status != nvOK {
		return status
	}
	g.mu.Lock()
	size, free := g.cfg.Memory, g.cfg.Memory-min(g.memUsed, g.cfg.Memory)
	g.mu.Unlock()
	for i := range n {
		e := p[4+8*i : 4+8*(i+1)]
		switch le.Uint32(e) {
		case fbInfoTotalRAMSize, fbInfoHeapSize:
			le.PutUint32(e[4:], uint32(size>>10))
		case fbInfoHeapFree:
			le.PutUint32(e[4:], uint32(free>>10))
		default:
			return nvErrInvalidArgument
		}
	}
	return nvOK
}

// restartRunlist commits the scheduling changes of every group on the GPU
// (timeslices, disabled channels), as RESTART_RUNLIST does: a running group
// whose channel is now disabled is evicted at its next preemption point.
func (g *gpu) restartRunlist() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.catchUp()
	for _, c := range g.ctxs {
		if c.nextSlice > 0 {
			c.timeslice = c.nextSlice
		}
		for i := range c.chans {
			c.chans[i].disabled = c.chans[i].nextDisabled
		}
	}
	if g.running && g.cur.chans[g.curCh].disabled && !g.cur.chans[g.curCh].nextOnlyScheduling {
		g.sliceEnd = g.vt // its slice ends: evicted at the next preemption point
	}
	futexWake(&g.db.Ring) // the device loop acts on it at once
}
