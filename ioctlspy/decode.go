package ioctlspy

import (
	"fmt"

	"github.com/gpuarb/gpuarb/bpf"
)

// CUDA function numbers, as enum cuda_func in bpf/gpuarb.h.
const (
	cuLaunchKernel = iota + 1
	cuLaunchKernelEx
	cuLaunchCooperative
	cuGraphLaunch
	cuMemcpyHtoD
	cuMemcpyDtoH
	cuMemcpyHtoDAsync
	cuMemcpyDtoHAsync
	cuMemsetD8
	cuMemsetD8Async
	cuStreamSync
	cuCtxSync
	cuEventSync
	cuCtxCreate
	cuCtxDestroy
	cuMemAlloc
	cuMemFree
	cuEventRecord
)

var cudaNames = [...]string{
	cuLaunchKernel:      "cuLaunchKernel",
	cuLaunchKernelEx:    "cuLaunchKernelEx",
	cuLaunchCooperative: "cuLaunchCooperativeKernel",
	cuGraphLaunch:       "cuGraphLaunch",
	cuMemcpyHtoD:        "cuMemcpyHtoD_v2",
	cuMemcpyDtoH:        "cuMemcpyDtoH_v2",
	cuMemcpyHtoDAsync:   "cuMemcpyHtoDAsync_v2",
	cuMemcpyDtoHAsync:   "cuMemcpyDtoHAsync_v2",
	cuMemsetD8:          "cuMemsetD8_v2",
	cuMemsetD8Async:     "cuMemsetD8Async",
	cuStreamSync:        "cuStreamSynchronize",
	cuCtxSync:           "cuCtxSynchronize",
	cuEventSync:         "cuEventSynchronize",
	cuCtxCreate:         "cuCtxCreate_v2",
	cuCtxDestroy:        "cuCtxDestroy_v2",
	cuMemAlloc:          "cuMemAlloc_v2",
	cuMemFree:           "cuMemFree_v2",
	cuEventRecord:       "cuEventRecord",
}

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
	case recCuda:
		var err error
		if ev, err = decodeCuda(h, r); err != nil {
			return nil, err
		}
	case recExit:
		ev = &ProcessExit{Header: h}
	case recLibcudaOpen:
		ev = &LibcudaOpened{Header: h, Path: r.Path, DirFD: int32(r.Args[0])}
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
	case *LibcudaOpened:
		return "libcuda_open"
	}
	return "unknown"
}

func decodeIoctl(h Header, r Record) Event {
	info := IoctlInfo{
		Device:     deviceString(r.DevMajor, r.DevMinor),
		DeviceKind: bpf.Kind(r.DevKind).String(),
		Cmd:        r.Cmd,
		Nr:         r.Esc,
		Ret:        r.Ret,
	}
	switch bpf.Kind(r.DevKind) {
	case bpf.KindNvidiaCtl, bpf.KindNvidiaGPU:
		if ev := decodeNvidia(h, info, r); ev != nil {
			return ev
		}
		return &Ioctl{Header: h, IoctlInfo: info, Name: EscapeName(r.Esc)}
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
	case EscRMAlloc:
		client, ok1 := a.u32(0)
		parent, ok2 := a.u32(4)
		handle, ok3 := a.u32(8)
		class, ok4 := a.u32(12)
		if !(ok1 && ok2 && ok3 && ok4) {
			return nil
		}
		statusOff := 28 // NVOS21
		if len(a) >= 48 {
			statusOff = 40 // NVOS64
		}
		status, _ := a.u32(statusOff)
		obj := ObjectAllocated{Header: h, IoctlInfo: info, Client: client, Parent: parent, Handle: handle,
			Class: class, ClassName: ClassName(class), Status: status}
		switch {
		case class == ClassTSG:
			ev := &TSGAllocated{ObjectAllocated: obj}
			ev.VASpace, _ = p.u32(8)
			ev.EngineType, _ = p.u32(12)
			return ev
		case IsChannelClass(class):
			ev := &ChannelAllocated{ObjectAllocated: obj}
			ev.GPFIFOOffset, _ = p.u64(8)
			ev.GPFIFOEntries, _ = p.u32(16)
			ev.ContextShare, _ = p.u32(24)
			ev.VASpace, _ = p.u32(28)
			return ev
		}
		return &obj
	case EscRMFree:
		client, ok1 := a.u32(0)
		parent, ok2 := a.u32(4)
		handle, ok3 := a.u32(8)
		if !(ok1 && ok2 && ok3) {
			return nil
		}
		status, _ := a.u32(12)
		return &ObjectFreed{Header: h, IoctlInfo: info, Client: client, Parent: parent, Handle: handle, Status: status}
	case EscRMControl:
		client, ok1 := a.u32(0)
		object, ok2 := a.u32(4)
		cmd, ok3 := a.u32(8)
		if !(ok1 && ok2 && ok3) {
			return nil
		}
		size, _ := a.u32(24)
		status, _ := a.u32(28)
		ctl := RMControl{Header: h, IoctlInfo: info, Client: client, Object: object, CtrlCmd: cmd, ParamsSize: size, Status: status}
		switch cmd {
		case CtrlGetWorkSubmitToken:
			token, ok := p.u32(0)
			if !ok {
				return &ctl
			}
			return &WorkSubmitToken{RMControl: ctl, Channel: object, Token: token}
		case CtrlTSGSetTimeslice:
			ts, _ := p.u64(0)
			return &TSGControl{RMControl: ctl, Name: "SET_TIMESLICE", TimesliceUS: ts}
		case CtrlTSGPreempt:
			return &TSGControl{RMControl: ctl, Name: "PREEMPT"}
		case CtrlTSGGetInfo:
			return &TSGControl{RMControl: ctl, Name: "GET_INFO"}
		}
		return &ctl
	case EscRMMapMemory:
		client, ok1 := a.u32(0)
		dev, ok2 := a.u32(4)
		mem, ok3 := a.u32(8)
		off, ok4 := a.u64(16)
		length, ok5 := a.u64(24)
		if !(ok1 && ok2 && ok3 && ok4 && ok5) {
			return nil
		}
		return &MemoryMapped{Header: h, IoctlInfo: info, Client: client, Device: dev, Memory: mem, Offset: off, Length: length}
	case EscAllocOSEvent, EscFreeOSEvent:
		client, ok1 := a.u32(0)
		dev, ok2 := a.u32(4)
		fd, ok3 := a.u32(8)
		if !(ok1 && ok2 && ok3) {
			return nil
		}
		return &OSEvent{Header: h, IoctlInfo: info, Client: client, Device: dev, FD: fd, Freed: r.Esc == EscFreeOSEvent}
	}
	return nil
}

func decodeUVM(h Header, info IoctlInfo, r Record) Event {
	if r.Esc != UVMRegisterChannel {
		return nil
	}
	a := fields(r.Arg)
	client, ok1 := a.u32(16)
	ch, ok2 := a.u32(20)
	base, ok3 := a.u64(24)
	length, ok4 := a.u64(32)
	if !(ok1 && ok2 && ok3 && ok4) {
		return nil
	}
	return &UVMChannelRegistered{Header: h, IoctlInfo: info, GPUUUID: formatUUID(r.Arg[:16]),
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
		ch, ok := a.u32(8)
		if !ok {
			return nil
		}
		return &NouveauChannel{Header: h, IoctlInfo: info, Channel: int32(ch)}
	case NouveauChannelFree:
		ch, ok := a.u32(0)
		if !ok {
			return nil
		}
		return &NouveauChannel{Header: h, IoctlInfo: info, Channel: int32(ch), Freed: true}
	case NouveauExec:
		ch, ok1 := a.u32(0)
		n, ok2 := a.u32(4)
		if !(ok1 && ok2) {
			return nil
		}
		return &Submission{Header: h, IoctlInfo: info, Name: DRMName(r.Esc), Channel: ch, Pushes: n}
	case NouveauGemPushbuf:
		ch, ok1 := a.u32(0)
		n, ok2 := a.u32(20)
		if !(ok1 && ok2) {
			return nil
		}
		return &Submission{Header: h, IoctlInfo: info, Name: DRMName(r.Esc), Channel: ch, Pushes: n}
	case NouveauVMBind:
		n, ok := a.u32(0)
		if !ok {
			return nil
		}
		return &VMBind{Header: h, IoctlInfo: info, Ops: n}
	case NouveauGemCPUPrep, DRMSyncobjWait, DRMSyncobjTimelineWait:
		handle, _ := a.u32(0)
		return &Sync{Header: h, Func: DRMName(r.Esc), Handle: uint64(handle), Ret: r.Ret, Device: info.Device}
	}
	return nil
}

func decodeCuda(h Header, r Record) (Event, error) {
	if r.Func == 0 || int(r.Func) >= len(cudaNames) {
		return nil, fmt.Errorf("cuda record: unknown function %d", r.Func)
	}
	name := cudaNames[r.Func]
	a := r.Args
	switch r.Func {
	case cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperative:
		return &Launch{Header: h, Func: name, Function: a[0],
			Grid:   [3]uint32{uint32(a[1]), uint32(a[2]), uint32(a[3])},
			Block:  [3]uint32{uint32(a[4]), uint32(a[5]), uint32(a[6])},
			Stream: a[7]}, nil
	case cuGraphLaunch:
		return &GraphLaunch{Header: h, Func: name, Exec: a[0], Stream: a[7]}, nil
	case cuMemcpyHtoD, cuMemcpyDtoH, cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemsetD8, cuMemsetD8Async:
		async := r.Func == cuMemcpyHtoDAsync || r.Func == cuMemcpyDtoHAsync || r.Func == cuMemsetD8Async
		return &Copy{Header: h, Func: name, Dst: a[0], Src: a[1], Bytes: a[2], Stream: a[7], Async: async}, nil
	case cuEventRecord:
		return &EventRecord{Header: h, Func: name, Event: a[0], Stream: a[7]}, nil
	case cuStreamSync, cuCtxSync, cuEventSync:
		return &Sync{Header: h, Func: name, Handle: a[0], Ret: r.Ret}, nil
	case cuCtxCreate:
		return &ContextCreated{Header: h, Func: name, Ctx: a[0], Flags: uint32(a[1]), Device: int32(a[2]), Ret: r.Ret}, nil
	case cuCtxDestroy:
		return &ContextDestroyed{Header: h, Func: name, Ctx: a[0]}, nil
	case cuMemAlloc:
		return &MemAlloc{Header: h, Func: name, DPtr: a[0], Bytes: a[2], Ret: r.Ret}, nil
	case cuMemFree:
		return &MemFree{Header: h, Func: name, DPtr: a[0], Bytes: a[2]}, nil
	}
	return nil, fmt.Errorf("cuda record: function %d not decoded", r.Func)
}
