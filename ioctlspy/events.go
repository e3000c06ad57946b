package ioctlspy

import (
	"fmt"
)

// Event is one decoded GPU event.
type Event interface {
	// Hdr returns the fields every event has.
	Hdr() *Header
	// String is a one-line human rendering of the event's own fields.
	String() string
}

// Header holds what every event carries. Times are CLOCK_MONOTONIC ns.
type Header struct {
	Type       string `json:"type"`
	Start      uint64 `json:"start_ns"`
	End        uint64 `json:"end_ns"`
	DurationNS uint64 `json:"duration_ns"`
	PID        uint32 `json:"pid"`
	TID        uint32 `json:"tid"`
	Comm       string `json:"comm"`
	CgroupID   uint64 `json:"cgroup_id"`
	Cgroup     string `json:"cgroup,omitempty"`
	// Held is set when gpuarb's launch gate stopped the process at this
	// call: a launch runs when the process is released, an ioctl
	// submission went through first.
	Held bool `json:"held,omitempty"`
}

// Hdr implements Event.
func (h *Header) Hdr() *Header { return h }

// IoctlInfo is what every ioctl event carries besides the header.
type IoctlInfo struct {
	Device     string `json:"device"`
	DeviceKind string `json:"device_kind"`
	FD         int32  `json:"fd"`
	Cmd        uint32 `json:"cmd"`
	Nr         uint32 `json:"nr"`
	Ret        int64  `json:"ret"`
	// File is the open file the ioctl came on.
	File FileID `json:"file"`
}

// Info returns the ioctl's fields: every event of an ioctl has them.
func (i *IoctlInfo) Info() *IoctlInfo { return i }

// Ioctl is a GPU ioctl without a more specific decoding.
type Ioctl struct {
	Header
	IoctlInfo
	Name string `json:"name"`
}

func (e *Ioctl) String() string {
	return fmt.Sprintf("%s ioctl %s cmd=0x%08x ret=%d", e.Device, e.Name, e.Cmd, e.Ret)
}

// ObjectAllocated is an nvidia RM_ALLOC (NVOS21/NVOS64).
type ObjectAllocated struct {
	Header
	IoctlInfo
	Client    uint32 `json:"client"`
	Parent    uint32 `json:"parent"`
	Handle    uint32 `json:"handle"`
	Class     uint32 `json:"class"`
	ClassName string `json:"class_name"`
	Status    uint32 `json:"status"`
	// ParamsSize is the caller's paramsSize: the real libcuda leaves it 0
	// and the driver sizes the parameters from the class.
	ParamsSize uint32 `json:"params_size"`
	// DeviceID is the GPU a device object (NV01_DEVICE_0) opens.
	DeviceID uint32 `json:"device_id,omitempty"`
}

func (e *ObjectAllocated) String() string {
	return fmt.Sprintf("%s RM_ALLOC class=0x%04x(%s) client=0x%x parent=0x%x handle=0x%x params_size=%d status=0x%x ret=%d",
		e.Device, e.Class, e.ClassName, e.Client, e.Parent, e.Handle, e.ParamsSize, e.Status, e.Ret)
}

// TSGAllocated is the allocation of a channel group (KEPLER_CHANNEL_GROUP_A):
// one GPU context's timeslice group.
type TSGAllocated struct {
	ObjectAllocated
	VASpace    uint32 `json:"vaspace"`
	EngineType uint32 `json:"engine_type"`
	// GPU is the device id of the device the group was allocated under,
	// which the table names as it records the group (nil where the table
	// did not see that device made): a process's CUDA ordinals number
	// only the GPUs it was given, the driver's device ids all of them.
	GPU *uint32 `json:"gpu,omitempty"`
}

func (e *TSGAllocated) String() string {
	s := fmt.Sprintf("%s engine=%d vaspace=0x%x", e.ObjectAllocated.String(), e.EngineType, e.VASpace)
	if e.GPU != nil {
		s += fmt.Sprintf(" gpu=%d", *e.GPU)
	}
	return s
}

// ChannelAllocated is the allocation of a GPFIFO channel.
type ChannelAllocated struct {
	ObjectAllocated
	GPFIFOEntries uint32 `json:"gpfifo_entries"`
	GPFIFOOffset  uint64 `json:"gpfifo_offset"`
	ContextShare  uint32 `json:"context_share"`
	VASpace       uint32 `json:"vaspace"`
}

func (e *ChannelAllocated) String() string {
	return fmt.Sprintf("%s entries=%d", e.ObjectAllocated.String(), e.GPFIFOEntries)
}

// MemoryAllocated is a memory allocation at the driver boundary: RM_ALLOC
// of a video memory class, or RM_VID_HEAP_CONTROL (its class reads
// NV01_MEMORY_LOCAL_USER, to which the driver normalizes it), or of
// pinned host memory (Host; never charged to a limit).
type MemoryAllocated struct {
	ObjectAllocated
	Bytes uint64 `json:"bytes"`
	Host  bool   `json:"host,omitempty"`
	// GPU is the device id of the device it was allocated under
	// (bpf.MemoryGPUs-1 for one the probes did not see made).
	GPU uint32 `json:"gpu"`
	// OOMKilled: it would have taken its tenant past its GPU memory
	// limit, and the process was killed at the allocation, which was not
	// charged; Charged is what the tenant held on the GPU then, Limit the
	// limit.
	OOMKilled bool   `json:"oom_killed,omitempty"`
	Charged   uint64 `json:"charged,omitempty"`
	Limit     uint64 `json:"limit,omitempty"`
	// LimitSlot is the probes' memory limit slot that killed it.
	LimitSlot uint32 `json:"limit_slot,omitempty"`
}

// Made tells whether the driver made the allocation (see made).
func (e *MemoryAllocated) Made() bool { return made(e.Ret, e.Status) }

func (e *MemoryAllocated) String() string {
	s := fmt.Sprintf("%s gpu=%d bytes=%d", e.ObjectAllocated.String(), e.GPU, e.Bytes)
	if e.OOMKilled {
		s += fmt.Sprintf(" OOM-KILLED charged=%d limit=%d", e.Charged, e.Limit)
	}
	return s
}

// ObjectFreed is an nvidia RM_FREE (NVOS00).
type ObjectFreed struct {
	Header
	IoctlInfo
	Client uint32 `json:"client"`
	Parent uint32 `json:"parent"`
	Handle uint32 `json:"handle"`
	Status uint32 `json:"status"`
}

func (e *ObjectFreed) String() string {
	return fmt.Sprintf("%s RM_FREE client=0x%x parent=0x%x handle=0x%x ret=%d", e.Device, e.Client, e.Parent, e.Handle, e.Ret)
}

// RMControl is an nvidia RM_CONTROL (NVOS54).
type RMControl struct {
	Header
	IoctlInfo
	Client     uint32 `json:"client"`
	Object     uint32 `json:"object"`
	CtrlCmd    uint32 `json:"ctrl_cmd"`
	ParamsSize uint32 `json:"params_size"`
	Status     uint32 `json:"status"`
}

func (e *RMControl) String() string {
	return fmt.Sprintf("%s RM_CONTROL ctrl=0x%08x client=0x%x object=0x%x params=%dB status=0x%x ret=%d",
		e.Device, e.CtrlCmd, e.Client, e.Object, e.ParamsSize, e.Status, e.Ret)
}

// WorkSubmitToken is GPFIFO_GET_WORK_SUBMIT_TOKEN: the token user space
// writes to the doorbell to submit work on a channel.
type WorkSubmitToken struct {
	RMControl
	Channel uint32 `json:"channel"`
	Token   uint32 `json:"token"`
}

func (e *WorkSubmitToken) String() string {
	return fmt.Sprintf("%s GET_WORK_SUBMIT_TOKEN channel=0x%x token=0x%x ret=%d", e.Device, e.Channel, e.Token, e.Ret)
}

// TSGControl is a control on a channel group: SET_TIMESLICE, PREEMPT, GET_INFO.
type TSGControl struct {
	RMControl
	Name        string `json:"name"`
	TimesliceUS uint64 `json:"timeslice_us,omitempty"`
}

func (e *TSGControl) String() string {
	s := fmt.Sprintf("%s TSG %s object=0x%x ret=%d", e.Device, e.Name, e.Object, e.Ret)
	if e.TimesliceUS != 0 {
		s += fmt.Sprintf(" timeslice=%dus", e.TimesliceUS)
	}
	return s
}

// MemoryMapped is an nvidia RM_MAP_MEMORY (NVOS33).
type MemoryMapped struct {
	Header
	IoctlInfo
	Client uint32 `json:"client"`
	Device uint32 `json:"device_handle"`
	Memory uint32 `json:"memory"`
	Offset uint64 `json:"offset"`
	Length uint64 `json:"bytes"`
}

func (e *MemoryMapped) String() string {
	return fmt.Sprintf("%s RM_MAP_MEMORY memory=0x%x offset=0x%x bytes=%d ret=%d",
		e.IoctlInfo.Device, e.Memory, e.Offset, e.Length, e.Ret)
}

// OSEvent is ALLOC_OS_EVENT or FREE_OS_EVENT.
type OSEvent struct {
	Header
	IoctlInfo
	Client uint32 `json:"client"`
	Device uint32 `json:"device_handle"`
	FD     uint32 `json:"fd"`
	Freed  bool   `json:"freed"`
}

func (e *OSEvent) String() string {
	op := "ALLOC_OS_EVENT"
	if e.Freed {
		op = "FREE_OS_EVENT"
	}
	return fmt.Sprintf("%s %s client=0x%x fd=%d ret=%d", e.IoctlInfo.Device, op, e.Client, e.FD, e.Ret)
}

// UVMChannelRegistered is nvidia-uvm REGISTER_CHANNEL.
type UVMChannelRegistered struct {
	Header
	IoctlInfo
	GPUUUID string `json:"gpu_uuid"`
	Client  uint32 `json:"client"`
	Channel uint32 `json:"channel"`
	Base    uint64 `json:"base"`
	Length  uint64 `json:"bytes"`
}

func (e *UVMChannelRegistered) String() string {
	return fmt.Sprintf("%s UVM_REGISTER_CHANNEL gpu=%s channel=0x%x base=0x%x bytes=%d ret=%d",
		e.Device, e.GPUUUID, e.Channel, e.Base, e.Length, e.Ret)
}

// NouveauChannel is a nouveau CHANNEL_ALLOC or CHANNEL_FREE.
type NouveauChannel struct {
	Header
	IoctlInfo
	Channel int32 `json:"channel"`
	Freed   bool  `json:"freed"`
}

func (e *NouveauChannel) String() string {
	op := "CHANNEL_ALLOC"
	if e.Freed {
		op = "CHANNEL_FREE"
	}
	return fmt.Sprintf("%s NOUVEAU_%s channel=%d ret=%d", e.Device, op, e.Channel, e.Ret)
}

// Submission is work submitted through the kernel: nouveau EXEC or GEM_PUSHBUF.
type Submission struct {
	Header
	IoctlInfo
	Name    string `json:"name"`
	Channel uint32 `json:"channel"`
	Pushes  uint32 `json:"pushes"`
}

func (e *Submission) String() string {
	return fmt.Sprintf("%s %s channel=%d pushes=%d ret=%d", e.Device, e.Name, e.Channel, e.Pushes, e.Ret)
}

// VMBind is nouveau VM_BIND.
type VMBind struct {
	Header
	IoctlInfo
	Ops uint32 `json:"ops"`
}

func (e *VMBind) String() string {
	return fmt.Sprintf("%s NOUVEAU_VM_BIND ops=%d ret=%d", e.Device, e.Ops, e.Ret)
}

// Sync is a completed wait for the GPU: a libcuda stream, context or event
// synchronize, a completion query that found the work done (Polled; Start
// is the first query of the polling loop that found it not done, or the
// query itself), or a nouveau/DRM wait ioctl. Start and End bound the
// wait.
type Sync struct {
	Header
	Func string `json:"func"`
	// Of is what it waited on (none for a DRM wait); Handle names it (a
	// stream key for streams, see PerThreadStream).
	Of     WaitTarget `json:"of,omitempty"`
	Handle uint64     `json:"handle"`
	Ret    int64      `json:"ret"`
	Polled bool       `json:"polled,omitempty"`
	Device string     `json:"device,omitempty"`
	// Woken is when the thread, asleep in a synchronizing call, was last
	// woken (CLOCK_MONOTONIC ns; 0 if it never slept there): what woke it
	// was the GPU's completion reaching it, before the scheduling delay
	// and return path that End adds.
	Woken uint64 `json:"woken,omitempty"`
	// NotDoneAt is, for a polling loop (Polled), when its last query that
	// found the work not done returned (CLOCK_MONOTONIC ns; 0 if none
	// did): the work completed between it and End.
	NotDoneAt uint64 `json:"not_done_at,omitempty"`
}

func (e *Sync) String() string {
	return fmt.Sprintf("%s handle=0x%x wait=%dus ret=%d", e.Func, e.Handle, e.DurationNS/1000, e.Ret)
}

// WaitTarget is what a synchronizing call or a query waits on.
type WaitTarget string

// What a wait is on: a stream's work, an event's record, or a context's
// whole work.
const (
	WaitStream  WaitTarget = "stream"
	WaitEvent   WaitTarget = "event"
	WaitContext WaitTarget = "context"
)

// WaitBegin is the start of a wait for the GPU: a synchronizing call
// entered, or a polling loop's first query found the work not done. The
// process has work outstanding until the Sync that ends it.
type WaitBegin struct {
	Header
	Func   string     `json:"func"`
	Of     WaitTarget `json:"of"`
	Handle uint64     `json:"handle"`
}

func (e *WaitBegin) String() string {
	return fmt.Sprintf("%s handle=0x%x wait begins", e.Func, e.Handle)
}

// StreamWaitEvent is cuStreamWaitEvent: work on Stream launched after it
// runs only once Event's record has completed.
type StreamWaitEvent struct {
	Header
	Func   string `json:"func"`
	Stream uint64 `json:"stream"`
	Event  uint64 `json:"event"`
}

func (e *StreamWaitEvent) String() string {
	return fmt.Sprintf("%s stream=0x%x event=0x%x", e.Func, e.Stream, e.Event)
}

// Launch is a kernel launch through libcuda (the doorbell path). Streams
// are stream keys: 0 the legacy default stream, PerThreadStream(tid) the
// thread's per-thread default stream.
type Launch struct {
	Header
	Func     string    `json:"func"`
	Function uint64    `json:"function"`
	Grid     [3]uint32 `json:"grid"`
	Block    [3]uint32 `json:"block"`
	Stream   uint64    `json:"stream"`
}

// Blocks is the number of thread blocks the launch runs.
func (e *Launch) Blocks() uint64 {
	return uint64(e.Grid[0]) * uint64(e.Grid[1]) * uint64(e.Grid[2])
}

func (e *Launch) String() string {
	return fmt.Sprintf("%s f=0x%x grid=%dx%dx%d block=%dx%dx%d stream=0x%x", e.Func, e.Function,
		e.Grid[0], e.Grid[1], e.Grid[2], e.Block[0], e.Block[1], e.Block[2], e.Stream)
}

// GraphLaunch is cuGraphLaunch.
type GraphLaunch struct {
	Header
	Func   string `json:"func"`
	Exec   uint64 `json:"graph_exec"`
	Stream uint64 `json:"stream"`
}

func (e *GraphLaunch) String() string {
	return fmt.Sprintf("%s exec=0x%x stream=0x%x", e.Func, e.Exec, e.Stream)
}

// StreamCapture is cuStreamBeginCapture or cuStreamEndCapture: between
// the two, work launched on Stream (and on streams that join the capture
// by waiting on an event recorded in it) builds a graph and runs nothing.
// The probe does not see the call's result: a capture that failed to
// begin reads as begun until its end.
type StreamCapture struct {
	Header
	Func   string `json:"func"`
	Stream uint64 `json:"stream"`
	Begin  bool   `json:"begin"`
}

func (e *StreamCapture) String() string {
	what := "end"
	if e.Begin {
		what = "begin"
	}
	return fmt.Sprintf("%s %s stream=0x%x", e.Func, what, e.Stream)
}

// EventRecord is cuEventRecord: the event completes when the stream's work
// launched before it has run, so a later cuEventSynchronize on it proves
// that much of the stream drained.
type EventRecord struct {
	Header
	Func   string `json:"func"`
	Event  uint64 `json:"event"`
	Stream uint64 `json:"stream"`
}

func (e *EventRecord) String() string {
	return fmt.Sprintf("%s event=0x%x stream=0x%x", e.Func, e.Event, e.Stream)
}

// Copy is a memcpy or memset through libcuda.
type Copy struct {
	Header
	Func   string `json:"func"`
	Dst    uint64 `json:"dst"`
	Src    uint64 `json:"src"`
	Bytes  uint64 `json:"bytes"`
	Stream uint64 `json:"stream"`
	Async  bool   `json:"async"`
}

func (e *Copy) String() string {
	return fmt.Sprintf("%s dst=0x%x bytes=%d stream=0x%x", e.Func, e.Dst, e.Bytes, e.Stream)
}

// MemAlloc is cuMemAlloc; MemFree is cuMemFree with the size it had.
type MemAlloc struct {
	Header
	Func  string `json:"func"`
	DPtr  uint64 `json:"dptr"`
	Bytes uint64 `json:"bytes"`
	Ret   int64  `json:"ret"`
}

func (e *MemAlloc) String() string {
	return fmt.Sprintf("%s dptr=0x%x bytes=%d ret=%d", e.Func, e.DPtr, e.Bytes, e.Ret)
}

// MemFree is cuMemFree; Bytes is 0 when the allocation was not seen.
type MemFree struct {
	Header
	Func  string `json:"func"`
	DPtr  uint64 `json:"dptr"`
	Bytes uint64 `json:"bytes"`
}

func (e *MemFree) String() string {
	return fmt.Sprintf("%s dptr=0x%x bytes=%d", e.Func, e.DPtr, e.Bytes)
}

// ContextCreated is a context made on a GPU: cuCtxCreate (_v2, _v3, _v4)
// or cuDevicePrimaryCtxRetain.
type ContextCreated struct {
	Header
	Func   string `json:"func"`
	Ctx    uint64 `json:"ctx"`
	Device int32  `json:"cuda_device"`
	Ret    int64  `json:"ret"`
}

func (e *ContextCreated) String() string {
	return fmt.Sprintf("%s ctx=0x%x dev=%d ret=%d", e.Func, e.Ctx, e.Device, e.Ret)
}

// ContextDestroyed is cuCtxDestroy (Ctx: the context), or the release or
// reset of a primary context (Ctx: the device).
type ContextDestroyed struct {
	Header
	Func string `json:"func"`
	Ctx  uint64 `json:"ctx"`
}

func (e *ContextDestroyed) String() string { return fmt.Sprintf("%s ctx=0x%x", e.Func, e.Ctx) }

// ProcessExit is the exit of a process that used a GPU.
type ProcessExit struct{ Header }

func (e *ProcessExit) String() string { return "process exit" }

// Unknown is a record of a type this version does not know.
type Unknown struct {
	Header
	RecordType uint32 `json:"record_type"`
}

func (e *Unknown) String() string { return fmt.Sprintf("unknown record type %d", e.RecordType) }

// deviceString renders major:minor.
func deviceString(major, minor uint32) string { return fmt.Sprintf("%d:%d", major, minor) }
