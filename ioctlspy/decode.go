package ioctlspy

import (
	"fmt"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/nvrm"
)

// Decode turns one raw record into a typed event.
func Decode(b []byte) (Event, error) {
	r, err := ParseRecord(b)
	if err != nil {
		return nil, err
	}
	return DecodeRecord(r)
}

// DecodeRecord turns a parsed record into a typed event.
func DecodeRecord(r Record) (Event, error) {
	h := Header{Start: r.TsEnter, End: r.TsExit, PID: r.PID, TID: r.TID, Comm: r.Comm, CgroupID: r.CgroupID,
		Held: r.Flags&flagHeld != 0}
	if r.TsExit > r.TsEnter {
		h.DurationNS = r.TsExit - r.TsEnter
	}
	var ev Event
	switch r.Type {
	case recIoctl:
		ev = decodeIoctl(h, r)
	case recCuda, recLaunch:
		var err error
		if ev, err = decodeCuda(h, r); err != nil {
			return nil, err
		}
	case recExit:
		ev = &ProcessExit{Header: h}
	case recMap:
		ev = &ManagedMapped{Header: h, Addr: r.Args[0], Len: r.Args[1], Unmap: r.Args[2] != 0, FD: int32(r.Args[3])}
	default:
		ev = &Unknown{Header: h, RecordType: r.Type}
	}
	ev.Hdr().Type = TypeOf(ev)
	return ev, nil
}

// TypeOf is the event's type name, as in the JSON "type" field.
func TypeOf(ev Event) string {
	switch ev.(type) {
	case *Ioctl:
		return "ioctl"
	case *TSGAllocated:
		return "tsg_alloc"
	case *ChannelAllocated:
		return "channel_alloc"
	case *MemoryAllocated:
		return "gpu_mem_alloc"
	case *ObjectAllocated:
		return "object_alloc"
	case *ObjectFreed:
		return "object_free"
	case *WorkSubmitToken:
		return "work_submit_token"
	case *TSGControl:
		return "tsg_control"
	case *RMControl:
		return "rm_control"
	case *MemoryMapped:
		return "map_memory"
	case *OSEvent:
		return "os_event"
	case *UVMChannelRegistered:
		return "uvm_register_channel"
	case *NouveauChannel:
		return "nouveau_channel"
	case *Submission:
		return "submit"
	case *VMBind:
		return "vm_bind"
	case *Sync:
		return "sync"
	case *WaitBegin:
		return "wait_begin"
	case *StreamWaitEvent:
		return "stream_wait_event"
	case *StreamCapture:
		return "stream_capture"
	case *Launch:
		return "launch"
	case *GraphLaunch:
		return "graph_launch"
	case *EventRecord:
		return "event_record"
	case *Copy:
		return "copy"
	case *MemAlloc:
		return "mem_alloc"
	case *MemFree:
		return "mem_free"
	case *ContextCreated:
		return "ctx_create"
	case *ContextDestroyed:
		return "ctx_destroy"
	case *ProcessExit:
		return "process_exit"
	case *ManagedMapped:
		return "managed_map"
	}
	return "unknown"
}

func decodeIoctl(h Header, r Record) Event {
	info := IoctlInfo{
		Device:     deviceString(r.DevMajor, r.DevMinor),
		DeviceKind: bpf.Kind(r.DevKind).String(),
		FD:         int32(r.Args[0]),
		Cmd:        r.Cmd,
		Nr:         r.Esc,
		Ret:        r.Ret,
		File:       r.File,
	}
	switch bpf.Kind(r.DevKind) {
	case bpf.KindNvidiaCtl, bpf.KindNvidiaGPU:
		if ev := decodeNvidia(h, info, r); ev != nil {
			return ev
		}
		return &Ioctl{Header: h, IoctlInfo: info, Name: nvrm.EscapeName(r.Esc)}
	case bpf.KindNvidiaUVM:
		if ev := decodeUVM(h, info, r); ev != nil {
			return ev
		}
		return &Ioctl{Header: h, IoctlInfo: info, Name: fmt.Sprintf("UVM_%d", r.Esc)}
	case bpf.KindDRM:
		if ev := decodeDRM(h, info, r); ev != nil {
			return ev
		}
		return &Ioctl{Header: h, IoctlInfo: info, Name: DRMName(r.Esc)}
	}
	return &Ioctl{Header: h, IoctlInfo: info, Name: fmt.Sprintf("0x%08x", r.Cmd)}
}

// decodeNvidia decodes RM escapes; nil means "no specific decoding".
func decodeNvidia(h Header, info IoctlInfo, r Record) Event {
	a := fields(r.Arg)
	p := fields(r.Params)
	switch r.Esc {
	case nvrm.EscRMAlloc:
		client, ok1 := a.u32(0)
		parent, ok2 := a.u32(nvrm.AllocParentOffset)
		handle, ok3 := a.u32(nvrm.AllocObjectOffset)
		class, ok4 := a.u32(nvrm.AllocClassOffset)
		if !(ok1 && ok2 && ok3 && ok4) {
			return nil
		}
		sizeOff, statusOff := nvrm.NVOS21ParamsSizeOffset, nvrm.NVOS21StatusOffset
		if len(a) >= nvrm.NVOS64Size {
			sizeOff, statusOff = nvrm.NVOS64ParamsSizeOffset, nvrm.NVOS64StatusOffset
		}
		size, _ := a.u32(sizeOff)
		status, _ := a.u32(statusOff)
		obj := ObjectAllocated{Header: h, IoctlInfo: info, Client: client, Parent: parent, Handle: handle,
			Class: class, ClassName: nvrm.ClassName(class), ParamsSize: size, Status: status}
		switch {
		case class == nvrm.ClassMemoryLocalUser || class == nvrm.ClassMemoryLocalPrivileged || class == nvrm.ClassMemorySystem:
			return memoryAllocated(obj, r)
		case class == nvrm.ClassDevice:
			obj.DeviceID, _ = p.u32(nvrm.DeviceIDOffset)
		case class == nvrm.ClassTSG:
			ev := &TSGAllocated{ObjectAllocated: obj}
			ev.VASpace, _ = p.u32(nvrm.TSGVASpaceOffset)
			ev.EngineType, _ = p.u32(nvrm.TSGEngineTypeOffset)
			return ev
		case nvrm.IsChannelClass(class):
			ev := &ChannelAllocated{ObjectAllocated: obj}
			ev.GPFIFOOffset, _ = p.u64(nvrm.ChannelGPFIFOOffsetOffset)
			ev.GPFIFOEntries, _ = p.u32(nvrm.ChannelGPFIFOEntriesOffset)
			ev.ContextShare, _ = p.u32(nvrm.ChannelContextShareOffset)
			ev.VASpace, _ = p.u32(nvrm.ChannelVASpaceOffset)
			return ev
		}
		return &obj
	case nvrm.EscRMVidHeapControl:
		client, ok1 := a.u32(0)
		parent, ok2 := a.u32(nvrm.AllocParentOffset)
		function, ok3 := a.u32(nvrm.NVOS32FunctionOffset)
		status, ok4 := a.u32(nvrm.NVOS32StatusOffset)
		handle, ok5 := a.u32(nvrm.NVOS32MemoryHandleOffset)
		if _, alloc := nvos32Functions[function]; !(ok1 && ok2 && ok3 && ok4 && ok5 && alloc) {
			return nil
		}
		return memoryAllocated(ObjectAllocated{Header: h, IoctlInfo: info, Client: client, Parent: parent, Handle: handle,
			Class: nvrm.ClassMemoryLocalUser, ClassName: nvrm.ClassName(nvrm.ClassMemoryLocalUser), Status: status}, r)
	case nvrm.EscRMFree:
		client, ok1 := a.u32(0)
		parent, ok2 := a.u32(nvrm.AllocParentOffset)
		handle, ok3 := a.u32(nvrm.FreeObjectOffset)
		if !(ok1 && ok2 && ok3) {
			return nil
		}
		status, _ := a.u32(nvrm.FreeStatusOffset)
		return &ObjectFreed{Header: h, IoctlInfo: info, Client: client, Parent: parent, Handle: handle, Status: status}
	case nvrm.EscRMControl:
		client, ok1 := a.u32(0)
		object, ok2 := a.u32(nvrm.ControlObjectOffset)
		cmd, ok3 := a.u32(nvrm.ControlCmdOffset)
		if !(ok1 && ok2 && ok3) {
			return nil
		}
		size, _ := a.u32(nvrm.ControlParamsSizeOffset)
		status, _ := a.u32(nvrm.ControlStatusOffset)
		ctl := RMControl{Header: h, IoctlInfo: info, Client: client, Object: object, CtrlCmd: cmd, ParamsSize: size, Status: status}
		switch cmd {
		case nvrm.CtrlGetWorkSubmitToken:
			token, ok := p.u32(0)
			if !ok {
				return &ctl
			}
			return &WorkSubmitToken{RMControl: ctl, Channel: object, Token: token}
		case nvrm.CtrlTSGSetTimeslice:
			ts, _ := p.u64(0)
			return &TSGControl{RMControl: ctl, Name: "SET_TIMESLICE", TimesliceUS: ts}
		case nvrm.CtrlTSGPreempt:
			return &TSGControl{RMControl: ctl, Name: "PREEMPT"}
		case nvrm.CtrlTSGGetInfo:
			return &TSGControl{RMControl: ctl, Name: "GET_INFO"}
		}
		return &ctl
	case nvrm.EscRMMapMemory:
		client, ok1 := a.u32(0)
		dev, ok2 := a.u32(nvrm.DeviceOffset)
		mem, ok3 := a.u32(nvrm.MapMemoryOffset)
		off, ok4 := a.u64(nvrm.MapMemoryOffsetOffset)
		length, ok5 := a.u64(nvrm.MapMemoryLengthOffset)
		if !(ok1 && ok2 && ok3 && ok4 && ok5) {
			return nil
		}
		return &MemoryMapped{Header: h, IoctlInfo: info, Client: client, Device: dev, Memory: mem, Offset: off, Length: length}
	case nvrm.EscAllocOSEvent, nvrm.EscFreeOSEvent:
		client, ok1 := a.u32(0)
		dev, ok2 := a.u32(nvrm.DeviceOffset)
		fd, ok3 := a.u32(nvrm.OSEventFDOffset)
		if !(ok1 && ok2 && ok3) {
			return nil
		}
		return &OSEvent{Header: h, IoctlInfo: info, Client: client, Device: dev, FD: fd, Freed: r.Esc == nvrm.EscFreeOSEvent}
	}
	return nil
}

func decodeUVM(h Header, info IoctlInfo, r Record) Event {
	if r.Esc != UVMRegisterChannel {
		return nil
	}
	a := fields(r.Arg)
	client, ok1 := a.u32(nvrm.UVMRegisterClientOffset)
	ch, ok2 := a.u32(nvrm.UVMRegisterChannelOffset)
	base, ok3 := a.u64(nvrm.UVMRegisterBaseOffset)
	length, ok4 := a.u64(nvrm.UVMRegisterLengthOffset)
	if !(ok1 && ok2 && ok3 && ok4) {
		return nil
	}
	return &UVMChannelRegistered{Header: h, IoctlInfo: info, GPUUUID: formatUUID(r.Arg[:nvrm.UVMRegisterUUIDSize]),
		Client: client, Channel: ch, Base: base, Length: length}
}

func formatUUID(b []byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func decodeDRM(h Header, info IoctlInfo, r Record) Event {
	if (r.Cmd>>8)&0xff != 'd' {
		return nil
	}
	a := fields(r.Arg)
	switch r.Esc {
	case NouveauChannelAlloc:
		ch, ok := a.u32(nouveauAllocChannelOffset)
		if !ok {
			return nil
		}
		return &NouveauChannel{Header: h, IoctlInfo: info, Channel: int32(ch)}
	case NouveauChannelFree:
		ch, ok := a.u32(nouveauFirstFieldOffset)
		if !ok {
			return nil
		}
		return &NouveauChannel{Header: h, IoctlInfo: info, Channel: int32(ch), Freed: true}
	case NouveauExec:
		ch, ok1 := a.u32(nouveauFirstFieldOffset)
		n, ok2 := a.u32(nouveauExecPushCountOffset)
		if !(ok1 && ok2) {
			return nil
		}
		return &Submission{Header: h, IoctlInfo: info, Name: DRMName(r.Esc), Channel: ch, Pushes: n}
	case NouveauGemPushbuf:
		ch, ok1 := a.u32(nouveauFirstFieldOffset)
		n, ok2 := a.u32(nouveauPushbufNrPushOffset)
		if !(ok1 && ok2) {
			return nil
		}
		return &Submission{Header: h, IoctlInfo: info, Name: DRMName(r.Esc), Channel: ch, Pushes: n}
	case NouveauVMBind:
		n, ok := a.u32(nouveauFirstFieldOffset)
		if !ok {
			return nil
		}
		return &VMBind{Header: h, IoctlInfo: info, Ops: n}
	case NouveauGemCPUPrep, DRMSyncobjWait, DRMSyncobjTimelineWait:
		handle, _ := a.u32(nouveauFirstFieldOffset)
		return &Sync{Header: h, Func: DRMName(r.Esc), Handle: uint64(handle), Ret: r.Ret, Device: info.Device}
	}
	return nil
}

// Stream handles of cuda.h that name default streams.
const (
	streamLegacy    = 0x1 // CU_STREAM_LEGACY
	streamPerThread = 0x2 // CU_STREAM_PER_THREAD
)

// perThreadBit marks a stream key that names a thread's per-thread
// default stream.
const perThreadBit = 1 << 63

// PerThreadStream is the stream key of thread tid's per-thread default
// stream: what a NULL stream means in a _ptsz call, or
// CU_STREAM_PER_THREAD anywhere.
func PerThreadStream(tid uint32) uint64 { return perThreadBit | uint64(tid) }

// streamKey normalises a stream handle: the legacy default stream is 0, a
// per-thread default stream PerThreadStream(tid), any other the handle.
func streamKey(h uint64, perThread bool, tid uint32) uint64 {
	switch {
	case h == streamPerThread || (h == 0 && perThread):
		return PerThreadStream(tid)
	case h == streamLegacy:
		return 0
	}
	return h
}

// waitTarget is what a sync or query waits on, and the handle (a stream
// key for streams).
func waitTarget(e bpf.EntryPoint, handle uint64, tid uint32) (WaitTarget, uint64) {
	switch e.On {
	case bpf.OnStream:
		return WaitStream, streamKey(handle, e.PerThread, tid)
	case bpf.OnEvent:
		return WaitEvent, handle
	}
	return WaitContext, handle
}

func decodeCuda(h Header, r Record) (Event, error) {
	e, ok := bpf.EntryPointOf(r.Func)
	if !ok {
		return nil, fmt.Errorf("cuda record: unknown function %d", r.Func)
	}
	name := e.Symbol
	a := r.Args
	if launched := e.Class == bpf.ClassLaunch || e.Class == bpf.ClassGraphLaunch; launched != (r.Type == recLaunch) {
		return nil, fmt.Errorf("cuda record: %s in a record of type %d", name, r.Type)
	}
	switch e.Class {
	case bpf.ClassLaunch:
		return &Launch{Header: h, Func: name, Function: r.Function, Grid: r.Grid, Block: r.Block,
			Stream: streamKey(r.Stream, e.PerThread, h.TID)}, nil
	case bpf.ClassGraphLaunch:
		return &GraphLaunch{Header: h, Func: name, Exec: r.Function, Stream: streamKey(r.Stream, e.PerThread, h.TID)}, nil
	case bpf.ClassCopy:
		return &Copy{Header: h, Func: name, Dst: a[0], Src: a[1], Bytes: a[2], Stream: streamKey(a[3], e.PerThread, h.TID),
			Async: e.Async}, nil
	case bpf.ClassEventRecord:
		return &EventRecord{Header: h, Func: name, Event: a[0], Stream: streamKey(a[1], e.PerThread, h.TID)}, nil
	case bpf.ClassStreamWait:
		return &StreamWaitEvent{Header: h, Func: name, Stream: streamKey(a[0], e.PerThread, h.TID), Event: a[1]}, nil
	case bpf.ClassCapture:
		return &StreamCapture{Header: h, Func: name, Stream: streamKey(a[0], e.PerThread, h.TID),
			Begin: e.Begins}, nil
	case bpf.ClassSync, bpf.ClassQuery:
		of, handle := waitTarget(e, a[0], h.TID)
		if r.Flags&flagBegin != 0 {
			return &WaitBegin{Header: h, Func: name, Of: of, Handle: handle}, nil
		}
		s := &Sync{Header: h, Func: name, Of: of, Handle: handle, Ret: r.Ret, Polled: e.Class == bpf.ClassQuery}
		if a[1] >= h.Start && a[1] <= h.End { // a wake-up, or a poll's last NOT_READY
			if s.Polled {
				s.NotDoneAt = a[1]
			} else {
				s.Woken = a[1]
			}
		}
		return s, nil
	case bpf.ClassContext:
		return &ContextCreated{Header: h, Func: name, Ctx: a[0], Device: int32(a[2]), Ret: r.Ret}, nil
	case bpf.ClassContextEnd:
		return &ContextDestroyed{Header: h, Func: name, Ctx: a[0]}, nil
	case bpf.ClassMemory:
		if e.Frees {
			return &MemFree{Header: h, Func: name, DPtr: a[0], Bytes: a[2]}, nil
		}
		return &MemAlloc{Header: h, Func: name, DPtr: a[0], Bytes: a[2], Ret: r.Ret}, nil
	}
	return nil, fmt.Errorf("cuda record: function %d (%s) not decoded", r.Func, name)
}

// memoryAllocated is a device memory allocation with what the probes read
// of it: the size (the larger of the request and the driver's answer), its
// GPU, and for a limited tenant its charge and limit and whether it killed
// the process.
func memoryAllocated(obj ObjectAllocated, r Record) *MemoryAllocated {
	m := &MemoryAllocated{ObjectAllocated: obj, Bytes: r.Args[1], GPU: uint32(r.Args[2]), Host: obj.Class == nvrm.ClassMemorySystem,
		OOMKilled: r.Flags&flagOOMKill != 0}
	if m.OOMKilled {
		m.Charged, m.Limit, m.LimitSlot = r.Args[3], r.Args[4], uint32(r.Args[5])
	}
	return m
}
