package ioctlspy

import (
	"golang.org/x/sys/unix"

	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/nvrm"
)

// encodeRecord lays a Record out as the probes do: its header, then the
// body its type names (the inverse of ParseRecord).
func encodeRecord(r Record) []byte {
	b := make([]byte, recordSize(r.Type))
	le := binary.LittleEndian
	le.PutUint64(b[offTsEnter:], r.TsEnter)
	le.PutUint64(b[offTsExit:], r.TsExit)
	le.PutUint64(b[offCgroupID:], r.CgroupID)
	le.PutUint32(b[offType:], r.Type)
	le.PutUint32(b[offTgid:], r.PID)
	le.PutUint32(b[offTid:], r.TID)
	le.PutUint32(b[offFlags:], r.Flags)
	copy(b[offComm:offComm+commLen-1], r.Comm)
	switch r.Type {
	case recIoctl:
		le.PutUint64(b[offIoctlRet:], uint64(r.Ret))
		le.PutUint32(b[offDevMajor:], r.DevMajor)
		le.PutUint32(b[offDevMinor:], r.DevMinor)
		le.PutUint32(b[offDevKind:], r.DevKind)
		le.PutUint32(b[offCmd:], r.Cmd)
		le.PutUint32(b[offEsc:], r.Esc)
		le.PutUint16(b[offArgLen:], uint16(copy(b[offArg:offArg+payloadLen], r.Arg)))
		le.PutUint16(b[offParamsLen:], uint16(copy(b[offParams:offParams+payloadLen], r.Params)))
		le.PutUint64(b[offFileIno:], r.File.Ino)
		le.PutUint32(b[offFileDev:], uint32(unix.Major(r.File.Dev))<<20|uint32(unix.Minor(r.File.Dev)))
		for i, a := range r.Args[:ioctlArgs] {
			le.PutUint64(b[offIoctlArgs+8*i:], a)
		}
	case recCuda:
		le.PutUint64(b[offCallRet:], uint64(r.Ret))
		le.PutUint32(b[offCallFunc:], r.Func)
		for i, a := range r.Args[:callArgs] {
			le.PutUint64(b[offCallArgs+8*i:], a)
		}
	case recMap:
		le.PutUint64(b[offMapAddr:], r.Args[0])
		le.PutUint64(b[offMapLen:], r.Args[1])
		le.PutUint32(b[offMapUnmap:], uint32(r.Args[2]))
		le.PutUint32(b[offMapFD:], uint32(r.Args[3]))
	case recLaunch:
		le.PutUint32(b[offLaunchFunc:], r.Func)
		le.PutUint64(b[offFunction:], r.Function)
		le.PutUint64(b[offStream:], r.Stream)
		for i := range 3 {
			le.PutUint32(b[offGrid+4*i:], r.Grid[i])
			le.PutUint32(b[offBlock+4*i:], r.Block[i])
		}
	}
	return b
}

func words(vals ...any) []byte {
	var b []byte
	for _, v := range vals {
		switch x := v.(type) {
		case uint32:
			b = binary.LittleEndian.AppendUint32(b, x)
		case uint64:
			b = binary.LittleEndian.AppendUint64(b, x)
		case int:
			b = binary.LittleEndian.AppendUint32(b, uint32(x))
		}
	}
	return b
}

func nvIoctl(esc uint32, arg, params []byte) Record {
	return Record{Type: recIoctl, PID: 42, TID: 43, Comm: "app", CgroupID: 7, TsEnter: 100, TsExit: 350,
		DevMajor: 195, DevMinor: 255, DevKind: uint32(bpf.KindNvidiaCtl),
		Cmd: 3<<30 | uint32(len(arg))<<16 | 'F'<<8 | esc, Esc: esc, Arg: arg, Params: params}
}

func drmIoctl(nr uint32, arg []byte) Record {
	return Record{Type: recIoctl, PID: 42, TID: 42, Comm: "app", CgroupID: 7, TsEnter: 100, TsExit: 5100,
		DevMajor: 226, DevMinor: 128, DevKind: uint32(bpf.KindDRM),
		Cmd: 3<<30 | uint32(len(arg))<<16 | 'd'<<8 | nr, Esc: nr, Arg: arg}
}

func TestDecode(t *testing.T) {
	nvos21 := func(class uint32) []byte {
		return words(0xc1d00001, 0x5c000002, 0x5c000010, class, uint64(0x7000), 32, 0)
	}
	nvos64 := words(0xc1d00001, 0x5c000010, 0x5c000011, 0xC56F, uint64(0x7000), uint64(0), 96, 0, 0, 0)
	for _, tc := range []struct {
		name  string
		rec   Record
		check func(t *testing.T, ev Event)
	}{
		{"TSG alloc", nvIoctl(nvrm.EscRMAlloc, nvos21(nvrm.ClassTSG), words(0, 0, 0x5c000005, 1)), func(t *testing.T, ev Event) {
			e := ev.(*TSGAllocated)
			if e.Class != 0xA06C || e.Client != 0xc1d00001 || e.Parent != 0x5c000002 || e.Handle != 0x5c000010 ||
				e.EngineType != 1 || e.VASpace != 0x5c000005 || e.ClassName != "KEPLER_CHANNEL_GROUP_A" {
				t.Errorf("%+v", e)
			}
		}},
		{"channel alloc NVOS64", nvIoctl(nvrm.EscRMAlloc, nvos64, words(0, 0, uint64(0xabc000), 1024, 0, 0, 0x5c000005)), func(t *testing.T, ev Event) {
			e := ev.(*ChannelAllocated)
			if e.Class != 0xC56F || e.Parent != 0x5c000010 || e.GPFIFOEntries != 1024 || e.GPFIFOOffset != 0xabc000 || e.VASpace != 0x5c000005 {
				t.Errorf("%+v", e)
			}
		}},
		{"other alloc", nvIoctl(nvrm.EscRMAlloc, nvos21(0x80), nil), func(t *testing.T, ev Event) {
			if e := ev.(*ObjectAllocated); e.ClassName != "NV01_DEVICE_0" {
				t.Errorf("%+v", e)
			}
		}},
		{"device memory NVOS64", func() Record {
			r := nvIoctl(nvrm.EscRMAlloc, words(0xc1d00001, 0x5c000002, 0x5c000020, nvrm.ClassMemoryLocalUser, uint64(0x7000), uint64(0), 0, 0, 0, 0), nil)
			r.Args[1], r.Args[2] = 128<<20, 1
			return r
		}(), func(t *testing.T, ev Event) {
			e := ev.(*MemoryAllocated)
			if e.Bytes != 128<<20 || e.GPU != 1 || e.Parent != 0x5c000002 || e.Handle != 0x5c000020 || !e.Made() || e.OOMKilled ||
				e.ClassName != "NV01_MEMORY_LOCAL_USER" {
				t.Errorf("%+v", e)
			}
		}},
		{"device memory past a limit", func() Record {
			r := nvIoctl(nvrm.EscRMAlloc, words(0xc1d00001, 0x5c000002, 0x5c000021, nvrm.ClassMemoryLocalUser, uint64(0x7000), uint64(0), 0, 0, 0, 0), nil)
			r.Args = [numArgs]uint64{3, 64 << 20, 0, 1000 << 20, 1 << 30, 7}
			r.Flags = flagOOMKill
			return r
		}(), func(t *testing.T, ev Event) {
			e := ev.(*MemoryAllocated)
			if !e.OOMKilled || e.Charged != 1000<<20 || e.Limit != 1<<30 || e.LimitSlot != 7 || e.Bytes != 64<<20 {
				t.Errorf("%+v", e)
			}
		}},
		{"device memory by VID_HEAP_CONTROL", func() Record {
			arg := make([]byte, 64)
			copy(arg, words(0xc1d00001, 0x5c000002, 2, 0, 0, 0x51))
			copy(arg[44:], words(0x5c000022))
			r := nvIoctl(nvrm.EscRMVidHeapControl, arg, nil)
			r.Args[1] = 2 << 20
			return r
		}(), func(t *testing.T, ev Event) {
			e := ev.(*MemoryAllocated)
			if e.Bytes != 2<<20 || e.Handle != 0x5c000022 || e.Status != 0x51 || e.Made() {
				t.Errorf("%+v: want 2 MiB refused with NV_ERR_NO_MEMORY", e)
			}
		}},
		{"VID_HEAP_CONTROL that allocates nothing", nvIoctl(nvrm.EscRMVidHeapControl, words(1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0), nil), func(t *testing.T, ev Event) {
			if e, ok := ev.(*Ioctl); !ok {
				t.Errorf("%T %+v, want a plain ioctl (function 3 is not an allocation)", ev, ev)
			} else if e.Name != "RM_VID_HEAP_CONTROL" {
				t.Errorf("named %q", e.Name)
			}
		}},
		{"free", nvIoctl(nvrm.EscRMFree, words(0xc1d00001, 0x5c000002, 0x5c000010, 0), nil), func(t *testing.T, ev Event) {
			if e := ev.(*ObjectFreed); e.Handle != 0x5c000010 || e.Parent != 0x5c000002 {
				t.Errorf("%+v", e)
			}
		}},
		{"work submit token", nvIoctl(nvrm.EscRMControl, words(0xc1d00001, 0x5c000011, nvrm.CtrlGetWorkSubmitToken, 0, uint64(0x7100), 4, 0), words(0x1234)), func(t *testing.T, ev Event) {
			if e := ev.(*WorkSubmitToken); e.Token != 0x1234 || e.Channel != 0x5c000011 || e.CtrlCmd != nvrm.CtrlGetWorkSubmitToken {
				t.Errorf("%+v", e)
			}
		}},
		{"token without params", nvIoctl(nvrm.EscRMControl, words(0xc1d00001, 0x5c000011, nvrm.CtrlGetWorkSubmitToken, 0, uint64(0), 4, 0), nil), func(t *testing.T, ev Event) {
			if e := ev.(*RMControl); e.CtrlCmd != nvrm.CtrlGetWorkSubmitToken {
				t.Errorf("%+v", e)
			}
		}},
		{"set timeslice", nvIoctl(nvrm.EscRMControl, words(1, 2, nvrm.CtrlTSGSetTimeslice, 0, uint64(0x7100), 8, 0), words(uint64(2000))), func(t *testing.T, ev Event) {
			if e := ev.(*TSGControl); e.Name != "SET_TIMESLICE" || e.TimesliceUS != 2000 {
				t.Errorf("%+v", e)
			}
		}},
		{"map memory", nvIoctl(nvrm.EscRMMapMemory, words(1, 2, 3, 0, uint64(4096), uint64(1<<20), uint64(0), 0, 0, 5), nil), func(t *testing.T, ev Event) {
			if e := ev.(*MemoryMapped); e.Memory != 3 || e.Offset != 4096 || e.Length != 1<<20 {
				t.Errorf("%+v", e)
			}
		}},
		{"os event", nvIoctl(nvrm.EscAllocOSEvent, words(1, 2, 9, 0), nil), func(t *testing.T, ev Event) {
			if e := ev.(*OSEvent); e.FD != 9 || e.Freed {
				t.Errorf("%+v", e)
			}
		}},
		{"truncated alloc", nvIoctl(nvrm.EscRMAlloc, words(1, 2), nil), func(t *testing.T, ev Event) {
			if e := ev.(*Ioctl); e.Name != "RM_ALLOC" {
				t.Errorf("%+v", e)
			}
		}},
		{"uvm register channel", Record{Type: recIoctl, DevKind: uint32(bpf.KindNvidiaUVM), Esc: UVMRegisterChannel, Cmd: UVMRegisterChannel,
			Arg: append(make([]byte, 16), words(0xc1d00001, 0x5c000011, uint64(0x10000), uint64(4096), 0, 0)...)}, func(t *testing.T, ev Event) {
			if e := ev.(*UVMChannelRegistered); e.Channel != 0x5c000011 || e.Length != 4096 || e.GPUUUID == "" {
				t.Errorf("%+v", e)
			}
		}},
		{"nouveau exec", drmIoctl(NouveauExec, words(3, 2, 0, 0, uint64(0), uint64(0), uint64(0x9000))), func(t *testing.T, ev Event) {
			if e := ev.(*Submission); e.Channel != 3 || e.Pushes != 2 || e.Name != "NOUVEAU_EXEC" {
				t.Errorf("%+v", e)
			}
		}},
		{"nouveau pushbuf", drmIoctl(NouveauGemPushbuf, words(4, 1, uint64(0), 0, 5, uint64(0), uint64(0), 0, 0, uint64(0), uint64(0))), func(t *testing.T, ev Event) {
			if e := ev.(*Submission); e.Channel != 4 || e.Pushes != 5 {
				t.Errorf("%+v", e)
			}
		}},
		{"nouveau cpu prep", drmIoctl(NouveauGemCPUPrep, words(11, 0)), func(t *testing.T, ev Event) {
			if e := ev.(*Sync); e.Func != "NOUVEAU_GEM_CPU_PREP" || e.DurationNS != 5000 || e.Handle != 11 {
				t.Errorf("%+v", e)
			}
		}},
		{"nouveau channel alloc", drmIoctl(NouveauChannelAlloc, append(words(0, 0, 6), make([]byte, 76)...)), func(t *testing.T, ev Event) {
			if e := ev.(*NouveauChannel); e.Channel != 6 || e.Freed {
				t.Errorf("%+v", e)
			}
		}},
		{"nouveau vm bind", drmIoctl(NouveauVMBind, words(7, 0, 0, 0, uint64(0), uint64(0), uint64(0))), func(t *testing.T, ev Event) {
			if e := ev.(*VMBind); e.Ops != 7 {
				t.Errorf("%+v", e)
			}
		}},
		{"launch", Record{Type: recLaunch, Func: fn("cuLaunchKernel"), Function: 0xf00, Grid: [3]uint32{10, 2, 1}, Block: [3]uint32{128, 1, 1}, Stream: 0x5000}, func(t *testing.T, ev Event) {
			e := ev.(*Launch)
			if e.Grid != [3]uint32{10, 2, 1} || e.Block != [3]uint32{128, 1, 1} || e.Stream != 0x5000 || e.Blocks() != 20 || e.Func != "cuLaunchKernel" || e.Held {
				t.Errorf("%+v", e)
			}
		}},
		{"held launch", Record{Type: recLaunch, Func: fn("cuLaunchKernel"), Flags: flagHeld, Function: 0xf00, Stream: 0x5000}, func(t *testing.T, ev Event) {
			if e := ev.(*Launch); !e.Held {
				t.Errorf("held flag lost: %+v", e)
			}
		}},
		{"per-thread launch on the NULL stream", Record{Type: recLaunch, TID: 77, Func: fn("cuLaunchKernelEx_ptsz"), Function: 0xf00}, func(t *testing.T, ev Event) {
			if e := ev.(*Launch); e.Stream != PerThreadStream(77) || e.Func != "cuLaunchKernelEx_ptsz" {
				t.Errorf("%+v", e)
			}
		}},
		{"legacy launch on CU_STREAM_PER_THREAD", Record{Type: recLaunch, TID: 78, Func: fn("cuLaunchKernel"), Function: 0xf00, Stream: 2}, func(t *testing.T, ev Event) {
			if e := ev.(*Launch); e.Stream != PerThreadStream(78) {
				t.Errorf("%+v", e)
			}
		}},
		{"per-thread launch on CU_STREAM_LEGACY", Record{Type: recLaunch, TID: 78, Func: fn("cuLaunchKernel_ptsz"), Function: 0xf00, Stream: 1}, func(t *testing.T, ev Event) {
			if e := ev.(*Launch); e.Stream != 0 {
				t.Errorf("%+v", e)
			}
		}},
		{"graph launch", Record{Type: recLaunch, Func: fn("cuGraphLaunch"), Function: 0xe0, Stream: 0x5000}, func(t *testing.T, ev Event) {
			if e := ev.(*GraphLaunch); e.Exec != 0xe0 || e.Stream != 0x5000 {
				t.Errorf("%+v", e)
			}
		}},
		{"event record", Record{Type: recCuda, Func: fn("cuEventRecordWithFlags_ptsz"), TID: 9, Args: [numArgs]uint64{0xe7, 0}}, func(t *testing.T, ev Event) {
			if e := ev.(*EventRecord); e.Event != 0xe7 || e.Stream != PerThreadStream(9) || e.Func != "cuEventRecordWithFlags_ptsz" {
				t.Errorf("%+v", e)
			}
		}},
		{"stream wait event", Record{Type: recCuda, Func: fn("cuStreamWaitEvent"), Args: [numArgs]uint64{0x5000, 0xe7}}, func(t *testing.T, ev Event) {
			if e := ev.(*StreamWaitEvent); e.Event != 0xe7 || e.Stream != 0x5000 {
				t.Errorf("%+v", e)
			}
		}},
		{"capture begins", Record{Type: recCuda, Func: fn("cuStreamBeginCapture_v2_ptsz"), TID: 9, Args: [numArgs]uint64{0, 1}}, func(t *testing.T, ev Event) {
			if e := ev.(*StreamCapture); !e.Begin || e.Stream != PerThreadStream(9) {
				t.Errorf("%+v", e)
			}
		}},
		{"capture into a graph begins", Record{Type: recCuda, Func: fn("cuStreamBeginCaptureToGraph"), Args: [numArgs]uint64{0x5000, 0x7ff0}}, func(t *testing.T, ev Event) {
			if e := ev.(*StreamCapture); !e.Begin || e.Stream != 0x5000 {
				t.Errorf("%+v", e)
			}
		}},
		{"capture ends", Record{Type: recCuda, Func: fn("cuStreamEndCapture"), Args: [numArgs]uint64{0x5000, 0x7ff0}}, func(t *testing.T, ev Event) {
			if e := ev.(*StreamCapture); e.Begin || e.Stream != 0x5000 {
				t.Errorf("%+v", e)
			}
		}},
		{"async copy", Record{Type: recCuda, Func: fn("cuMemcpyHtoDAsync_v2"), Args: [numArgs]uint64{0xd000, 0x7000, 4096, 0x5000}}, func(t *testing.T, ev Event) {
			if e := ev.(*Copy); e.Bytes != 4096 || !e.Async || e.Stream != 0x5000 {
				t.Errorf("%+v", e)
			}
		}},
		{"stream sync", Record{Type: recCuda, Func: fn("cuStreamSynchronize"), TsEnter: 1000, TsExit: 9000, Args: [numArgs]uint64{0x5000, 8500}}, func(t *testing.T, ev Event) {
			if e := ev.(*Sync); e.DurationNS != 8000 || e.Handle != 0x5000 || e.Of != WaitStream || e.Polled || e.Woken != 8500 {
				t.Errorf("%+v", e)
			}
		}},
		{"sync woken outside the call", Record{Type: recCuda, Func: fn("cuStreamSynchronize"), TsEnter: 1000, TsExit: 9000, Args: [numArgs]uint64{0x5000, 9001}}, func(t *testing.T, ev Event) {
			if e := ev.(*Sync); e.Woken != 0 {
				t.Errorf("a wake time after the return was kept: %+v", e)
			}
		}},
		{"sync begins", Record{Type: recCuda, Func: fn("cuStreamSynchronize_ptsz"), TID: 5, Flags: flagBegin}, func(t *testing.T, ev Event) {
			if e := ev.(*WaitBegin); e.Of != WaitStream || e.Handle != PerThreadStream(5) {
				t.Errorf("%+v", e)
			}
		}},
		{"CUDA 13 context sync", Record{Type: recCuda, Func: fn("cuCtxSynchronize_v2"), TsEnter: 1000, TsExit: 3000}, func(t *testing.T, ev Event) {
			if e := ev.(*Sync); e.Of != WaitContext || e.DurationNS != 2000 {
				t.Errorf("%+v", e)
			}
		}},
		{"poll ends", Record{Type: recCuda, Func: fn("cuEventQuery"), TsEnter: 1000, TsExit: 5000, Args: [numArgs]uint64{0xe7, 4800}}, func(t *testing.T, ev Event) {
			if e := ev.(*Sync); e.Of != WaitEvent || e.Handle != 0xe7 || !e.Polled || e.DurationNS != 4000 || e.NotDoneAt != 4800 || e.Woken != 0 {
				t.Errorf("%+v", e)
			}
		}},
		{"poll done at its first query", Record{Type: recCuda, Func: fn("cuStreamQuery"), TsEnter: 5000, TsExit: 5000, Args: [numArgs]uint64{0x5000}}, func(t *testing.T, ev Event) {
			if e := ev.(*Sync); e.Of != WaitStream || !e.Polled || e.NotDoneAt != 0 {
				t.Errorf("%+v", e)
			}
		}},
		{"mem alloc", Record{Type: recCuda, Func: fn("cuMemAllocAsync_ptsz"), Args: [numArgs]uint64{0xd000, 0, 1 << 20}}, func(t *testing.T, ev Event) {
			if e := ev.(*MemAlloc); e.DPtr != 0xd000 || e.Bytes != 1<<20 {
				t.Errorf("%+v", e)
			}
		}},
		{"mem free", Record{Type: recCuda, Func: fn("cuMemFreeAsync"), Args: [numArgs]uint64{0xd000, 0, 1 << 20}}, func(t *testing.T, ev Event) {
			if e := ev.(*MemFree); e.DPtr != 0xd000 || e.Bytes != 1<<20 {
				t.Errorf("%+v", e)
			}
		}},
		{"primary ctx", Record{Type: recCuda, Func: fn("cuDevicePrimaryCtxRetain"), Args: [numArgs]uint64{0xc7, 0, 1}}, func(t *testing.T, ev Event) {
			if e := ev.(*ContextCreated); e.Ctx != 0xc7 || e.Device != 1 {
				t.Errorf("%+v", e)
			}
		}},
		{"process exit", Record{Type: recExit}, func(t *testing.T, ev Event) { _ = ev.(*ProcessExit) }},
		{"managed mmap", Record{Type: recMap, Args: [numArgs]uint64{0x7f0000000000, 2 << 20, 0, 9}}, func(t *testing.T, ev Event) {
			if e := ev.(*ManagedMapped); e.Addr != 0x7f0000000000 || e.Len != 2<<20 || e.Unmap || e.FD != 9 {
				t.Errorf("%+v", e)
			}
		}},
		{"munmap", Record{Type: recMap, Args: [numArgs]uint64{0x7f0000001000, 4096, 1}}, func(t *testing.T, ev Event) {
			if e := ev.(*ManagedMapped); e.Addr != 0x7f0000001000 || e.Len != 4096 || !e.Unmap {
				t.Errorf("%+v", e)
			}
		}},
		{"unknown type", Record{Type: 99}, func(t *testing.T, ev Event) { _ = ev.(*Unknown) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := Decode(encodeRecord(tc.rec))
			if err != nil {
				t.Fatal(err)
			}
			if ev.Hdr().Type == "" || ev.Hdr().Type != TypeOf(ev) {
				t.Errorf("type %q", ev.Hdr().Type)
			}
			_ = ev.String()
			tc.check(t, ev)
		})
	}
}

// fn is the probed entry point number of a libcuda symbol.
func fn(symbol string) uint32 {
	for _, e := range bpf.EntryPoints {
		if e.Symbol == symbol && e.Func != 0 {
			return uint32(e.Func)
		}
	}
	panic("not a probed entry point: " + symbol)
}

func TestDecodeErrors(t *testing.T) {
	if _, err := Decode(make([]byte, headerSize-1)); !errors.Is(err, ErrShortRecord) {
		t.Errorf("short header: %v", err)
	}
	for _, typ := range []uint32{recIoctl, recCuda, recLaunch} {
		b := encodeRecord(Record{Type: typ, Func: fn("cuLaunchKernel")})
		if _, err := Decode(b[:len(b)-1]); !errors.Is(err, ErrShortRecord) {
			t.Errorf("short record of type %d: %v", typ, err)
		}
	}
	// A launch's entry point in a call record, or a call's in a launch
	// record, is refused: the body is not the one the entry point has.
	if _, err := Decode(encodeRecord(Record{Type: recCuda, Func: fn("cuLaunchKernel")})); err == nil {
		t.Error("launch decoded from a call record")
	}
	if _, err := Decode(encodeRecord(Record{Type: recLaunch, Func: fn("cuMemFree_v2")})); err == nil {
		t.Error("call decoded from a launch record")
	}
	if _, err := Decode(encodeRecord(Record{Type: recCuda, Func: 999})); err == nil {
		t.Error("unknown cuda function decoded")
	}
	// Payload lengths beyond the buffers are clamped.
	b := encodeRecord(nvIoctl(nvrm.EscRMAlloc, nil, nil))
	binary.LittleEndian.PutUint16(b[offArgLen:], 0xffff)
	r, err := ParseRecord(b)
	if err != nil || len(r.Arg) != payloadLen {
		t.Errorf("clamped arg: %d bytes, %v", len(r.Arg), err)
	}
}

// steerableProcess applies to a new table what pid 42 does to make a
// channel group the daemon can steer: an RM client on descriptor 9, a
// device (GPU 3) and its subdevice, a group 10 with its channel 11 and the
// channel's work submit token 77. It returns the table and its apply.
func steerableProcess(t *testing.T) (*Table, func(Record)) {
	t.Helper()
	tbl := NewTable()
	apply := func(r Record) {
		ev, err := DecodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		tbl.Apply(ev)
	}
	client := nvIoctl(nvrm.EscRMAlloc, words(1, 0, 1, nvrm.ClassRoot, uint64(0), 0, 0), nil)
	client.Args[0] = 9
	apply(client)
	apply(nvIoctl(nvrm.EscRMAlloc, words(1, 1, 2, nvrm.ClassDevice, uint64(0), 0, 0), words(3)))
	apply(nvIoctl(nvrm.EscRMAlloc, words(1, 2, 3, nvrm.ClassSubdevice, uint64(0), 0, 0), nil))
	apply(nvIoctl(nvrm.EscRMAlloc, words(1, 2, 10, nvrm.ClassTSG, uint64(0), 0, 0), words(0, 0, 0, 1)))
	apply(nvIoctl(nvrm.EscRMAlloc, words(1, 10, 11, 0xC86F, uint64(0), 0, 0), nil))
	apply(nvIoctl(nvrm.EscRMControl, words(1, 11, nvrm.CtrlGetWorkSubmitToken, 0, uint64(1), 4, 0), words(77)))
	return tbl, apply
}

// A context's GPU is its channel group's device id, not the CUDA ordinal
// its call named (a process given GPU 3 alone calls it ordinal 0): the
// table names it on the group's event and keeps it for the context its
// thread makes next; a thread whose group was not seen keeps the ordinal.
func TestContextGPUIsItsGroups(t *testing.T) {
	tbl := NewTable()
	var groups []*TSGAllocated
	apply := func(r Record) {
		ev, err := DecodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		tbl.Apply(ev)
		if g, ok := ev.(*TSGAllocated); ok {
			groups = append(groups, g)
		}
	}
	apply(nvIoctl(nvrm.EscRMAlloc, words(1, 0, 1, nvrm.ClassRoot, uint64(0), 0, 0), nil))
	apply(nvIoctl(nvrm.EscRMAlloc, words(1, 1, 2, nvrm.ClassDevice, uint64(0), 0, 0), words(3)))
	apply(nvIoctl(nvrm.EscRMAlloc, words(1, 2, 3, nvrm.ClassSubdevice, uint64(0), 0, 0), nil))
	apply(nvIoctl(nvrm.EscRMAlloc, words(1, 2, 10, nvrm.ClassTSG, uint64(0), 0, 0), words(0, 0, 0, 1)))
	apply(Record{Type: recCuda, PID: 42, TID: 43, Func: fn("cuCtxCreate_v2"), Args: [numArgs]uint64{0xc7, 0, 0}})
	apply(nvIoctl(nvrm.EscRMAlloc, words(1, 3, 11, nvrm.ClassTSG, uint64(0), 0, 0), words(0, 0, 0, 1))) // under the subdevice
	apply(Record{Type: recCuda, PID: 42, TID: 43, Func: fn("cuCtxCreate_v2"), Args: [numArgs]uint64{0xc8, 0, 0}})
	apply(nvIoctl(nvrm.EscRMAlloc, words(1, 9, 12, nvrm.ClassTSG, uint64(0), 0, 0), words(0, 0, 0, 1))) // a device never seen
	apply(Record{Type: recCuda, PID: 42, TID: 43, Func: fn("cuCtxCreate_v2"), Args: [numArgs]uint64{0xc9, 0, 1}})
	if len(groups) != 3 || groups[0].GPU == nil || *groups[0].GPU != 3 || groups[1].GPU == nil || *groups[1].GPU != 3 || groups[2].GPU != nil {
		t.Fatalf("groups name GPUs %v, want 3, 3 and none", groups)
	}
	p, _ := tbl.Process(42)
	if want := map[uint64]int32{0xc7: 3, 0xc8: 3, 0xc9: 1}; !reflect.DeepEqual(p.Contexts, want) {
		t.Errorf("contexts on GPUs %v, want %v (groups' device ids; the ordinal where no device was seen)", p.Contexts, want)
	}
}

func TestTable(t *testing.T) {
	tbl, apply := steerableProcess(t)
	// On the simulated GPU's node every RM ioctl fails with ENOTTY; the
	// allocation still counts (its status is 0).
	enotty := nvIoctl(nvrm.EscRMAlloc, words(1, 10, 12, 0xC86F, uint64(0), 0, 0), nil)
	enotty.Ret = -25
	apply(enotty)
	failed := nvIoctl(nvrm.EscRMAlloc, words(1, 10, 13, 0xC86F, uint64(0), 0, 0x1f), nil)
	apply(failed)
	apply(Record{Type: recCuda, PID: 42, Func: fn("cuCtxCreate_v2"), Args: [numArgs]uint64{0xc7, 0, 0}})
	apply(Record{Type: recLaunch, PID: 42, Func: fn("cuLaunchKernel"), Function: 1, Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 1}})
	ps := tbl.Processes()
	if len(ps) != 1 {
		t.Fatalf("%d processes", len(ps))
	}
	p := ps[0]
	if len(p.TSGs) != 1 || p.Channels[ObjectKey{1, 11}].Token != 77 || p.Contexts[0xc7] != 0 || p.Launches != 1 {
		t.Errorf("%+v", p)
	}
	groups := p.Groups()
	if want := []Group{{PID: 42, FD: 9, GPU: 3, Client: 1, TSG: 10, Engine: 1, Subdevice: 3, Channels: []uint32{11, 12}}}; !reflect.DeepEqual(groups, want) {
		t.Errorf("groups %+v", groups)
	}
	mem := func(handle, parent uint32, bytes, gpu uint64, status uint32, killed bool) {
		r := nvIoctl(nvrm.EscRMAlloc, words(1, parent, handle, nvrm.ClassMemoryLocalUser, uint64(0x7000), uint64(0), 0, 0, status, 0), nil)
		r.Args[1], r.Args[2] = bytes, gpu
		if killed {
			r.Flags = flagOOMKill
		}
		apply(r)
	}
	mem(20, 2, 100, 3, 0, false)
	mem(21, 2, 200, 3, 0, false)
	mem(22, 2, 400, 3, 0x51, false) // refused by the driver
	mem(23, 2, 800, 3, 0, true)     // its process killed at it: not held
	mem(24, 5, 1000, 0, 0, false)
	host := nvIoctl(nvrm.EscRMAlloc, words(1, 2, 25, nvrm.ClassMemorySystem, uint64(0x7000), uint64(0), 0, 0, 0, 0), nil)
	host.Args[1], host.Args[2] = 4096, 3
	apply(host)
	if m, h := tbl.MemoryOf(42); m[3] != 300 || m[0] != 1000 || len(m) != 2 || h[3] != 4096 || len(h) != 1 {
		t.Errorf("memory %v, host %v; want 300 B on GPU 3 and 1000 on GPU 0, 4096 B of host memory apart", m, h)
	}
	apply(nvIoctl(nvrm.EscRMFree, words(1, 2, 21, 0x1f), nil)) // a free the driver refused
	apply(nvIoctl(nvrm.EscRMFree, words(1, 2, 20, 0), nil))
	if m, _ := tbl.MemoryOf(42); m[3] != 200 {
		t.Errorf("memory %v after freeing 100 B, want 200 on GPU 3", m)
	}
	apply(nvIoctl(nvrm.EscRMFree, words(1, 1, 2, 0), nil)) // the device, and what was allocated under it
	if m, h := tbl.MemoryOf(42); m[3] != 0 || m[0] != 1000 || h[3] != 0 {
		t.Errorf("memory %v after freeing the device, want only GPU 0's 1000 B", m)
	}
	apply(nvIoctl(nvrm.EscRMFree, words(1, 1, 1, 0), nil)) // freeing the client frees all under it
	if p := tbl.Processes()[0]; len(p.TSGs) != 0 || len(p.Channels) != 0 || len(p.Clients) != 0 || len(p.Groups()) != 0 || len(p.Memory) != 0 {
		t.Errorf("after client free: %+v", p)
	}
	apply(Record{Type: recExit, PID: 42})
	if n := len(tbl.Processes()); n != 0 {
		t.Errorf("%d processes after exit", n)
	}
}

func FuzzDecode(f *testing.F) {
	seeds := []Record{
		nvIoctl(nvrm.EscRMAlloc, words(1, 2, 3, nvrm.ClassTSG, uint64(0), 0, 0), words(0, 0, 0, 1)),
		nvIoctl(nvrm.EscRMAlloc, words(1, 2, 3, 0xC56F, uint64(0), uint64(0), 0, 0, 0, 0), words(0, 0, uint64(0), 1024)),
		nvIoctl(nvrm.EscRMControl, words(1, 2, nvrm.CtrlGetWorkSubmitToken, 0, uint64(1), 4, 0), words(5)),
		nvIoctl(nvrm.EscRMMapMemory, words(1, 2, 3, 0, uint64(1), uint64(2)), nil),
		drmIoctl(NouveauExec, words(3, 2, 0, 0)),
		drmIoctl(NouveauGemPushbuf, words(4, 1, uint64(0), 0, 5)),
		{Type: recIoctl, DevKind: uint32(bpf.KindNvidiaUVM), Esc: UVMRegisterChannel, Arg: make([]byte, 48)},
		{Type: recLaunch, Func: fn("cuLaunchKernel"), Function: 1, Grid: [3]uint32{2, 3, 4}, Block: [3]uint32{5, 6, 7}, Stream: 8},
		{Type: recCuda, Func: fn("cuMemcpyHtoDAsync_v2"), Args: [numArgs]uint64{1, 2, 3, 4}},
		{Type: recCuda, Func: fn("cuMemFree_v2"), Args: [numArgs]uint64{1, 0, 3}},
	}
	for _, s := range seeds {
		f.Add(encodeRecord(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := Decode(b)
		if err != nil {
			return
		}
		_ = ev.String()
		NewTable().Apply(ev)
	})
}
