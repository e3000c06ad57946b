// Package nvrm is the vocabulary of the nvidia driver's resource manager
// (RM) interface that gpuarb speaks and reads: the control node's escapes,
// the object classes, the controls, the status codes and the parameter
// offsets the probes and decoders read. The probes (bpf/gpuarb.h, enum
// nv_rm) and the decoders (ioctlspy) and the steering (gpusched) all take
// them from here or are tested against them; the simulated GPU keeps its
// own copy, tested against this one. The facts behind them are in
// docs/driver.md and docs/memory.md.
package nvrm

import "fmt"

// Magic is the ioctl type of the nvidia device nodes.
const Magic = 'F'

// Escapes: the ioctl numbers (nr) of the nvidia nodes' calls.
const (
	EscRMFree           = 0x29
	EscRMControl        = 0x2A
	EscRMAlloc          = 0x2B
	EscRMIdleChannels   = 0x41
	EscRMVidHeapControl = 0x4A
	EscRMMapMemory      = 0x4E
	EscAllocOSEvent     = 206
	EscFreeOSEvent      = 207
	EscIoctlXferCmd     = 211 // wraps another escape whose argument is larger than an ioctl carries
	EscAttachGPUsToFD   = 212
)

var escNames = map[uint32]string{
	EscRMFree:           "RM_FREE",
	EscRMControl:        "RM_CONTROL",
	EscRMAlloc:          "RM_ALLOC",
	EscRMIdleChannels:   "RM_IDLE_CHANNELS",
	EscRMMapMemory:      "RM_MAP_MEMORY",
	EscRMVidHeapControl: "RM_VID_HEAP_CONTROL",
	EscAllocOSEvent:     "ALLOC_OS_EVENT",
	EscFreeOSEvent:      "FREE_OS_EVENT",
	EscIoctlXferCmd:     "IOCTL_XFER_CMD",
	EscAttachGPUsToFD:   "ATTACH_GPUS_TO_FD",
}

// EscapeName names an nvidia escape.
func EscapeName(e uint32) string { return nameOf(escNames, e, "ESC_0x%02x") }

// nameOf is v's name in names, else v in format.
func nameOf(names map[uint32]string, v uint32, format string) string {
	if n, ok := names[v]; ok {
		return n
	}
	return fmt.Sprintf(format, v)
}

// Object classes gpuarb recognises.
const (
	ClassRoot      = 0x41
	ClassOSEvent   = 0x79
	ClassDevice    = 0x80 // NV01_DEVICE_0: its parameters begin with its deviceId
	ClassSubdevice = 0x2080
	ClassVASpace   = 0x90F1
	ClassTSG       = 0xA06C
	// Video memory: NV01_MEMORY_LOCAL_USER and _PRIVILEGED.
	ClassMemoryLocalUser       = 0x40
	ClassMemoryLocalPrivileged = 0x3F
	// Pinned host memory: NV01_MEMORY_SYSTEM.
	ClassMemorySystem = 0x3E
)

// Every GPFIFO channel class, of every generation, ends in 0x6F (Fermi's
// 0x906F to Blackwell's 0xCA6F): the rule the probes and the decoders
// share to tell a channel.
const (
	ChannelClassMask = 0xFF
	ChannelClassLow  = 0x6F
)

// IsChannelClass reports whether c is a GPFIFO channel class.
func IsChannelClass(c uint32) bool { return c&ChannelClassMask == ChannelClassLow }

var classNames = map[uint32]string{
	0x0:    "NV01_ROOT",
	0x41:   "NV01_ROOT_CLIENT",
	0x3E:   "NV01_MEMORY_SYSTEM",
	0x3F:   "NV01_MEMORY_LOCAL_PRIVILEGED",
	0x40:   "NV01_MEMORY_LOCAL_USER",
	0x71:   "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR",
	0x79:   "NV01_EVENT_OS_EVENT",
	0x80:   "NV01_DEVICE_0",
	0x2080: "NV20_SUBDEVICE_0",
	0x90F1: "FERMI_VASPACE_A",
	0x9067: "FERMI_CONTEXT_SHARE_A",
	0xA06C: "KEPLER_CHANNEL_GROUP_A",
	0x906F: "GF100_CHANNEL_GPFIFO",
	0xA06F: "KEPLER_CHANNEL_GPFIFO_A",
	0xA16F: "KEPLER_CHANNEL_GPFIFO_B",
	0xA26F: "KEPLER_CHANNEL_GPFIFO_C",
	0xB06F: "MAXWELL_CHANNEL_GPFIFO_A",
	0xC06F: "PASCAL_CHANNEL_GPFIFO_A",
	0xC36F: "VOLTA_CHANNEL_GPFIFO_A",
	0xC46F: "TURING_CHANNEL_GPFIFO_A",
	0xC56F: "AMPERE_CHANNEL_GPFIFO_A",
	0xC86F: "HOPPER_CHANNEL_GPFIFO_A",
	0xC96F: "BLACKWELL_CHANNEL_GPFIFO_A",
	0xCA6F: "BLACKWELL_CHANNEL_GPFIFO_B",
	0xC361: "VOLTA_USERMODE_A",
	0xC461: "TURING_USERMODE_A",
	0xC561: "AMPERE_USERMODE_A",
	0xC661: "HOPPER_USERMODE_A",
	0xC761: "BLACKWELL_USERMODE_A",
}

// ClassName names an nvidia object class, or gives it in hex.
func ClassName(c uint32) string { return nameOf(classNames, c, "0x%04x") }

// RM controls gpuarb decodes or sends (the ctrl headers of
// open-gpu-kernel-modules; docs/driver.md §3), with the parameter sizes the
// driver checks where gpuarb sends them.
const (
	CtrlTSGSetTimeslice     = 0xA06C0103 // on a TSG: {u64 timesliceUs}
	CtrlTSGGetTimeslice     = 0xA06C0104 // on a TSG: {u64 timesliceUs}
	CtrlTSGPreempt          = 0xA06C0105 // on a TSG: {bool bWait; bool bManualTimeout; u32 timeoutUs@4}
	CtrlTSGGetInfo          = 0xA06C0106 // on a TSG: {u32 tsgID}
	CtrlRestartRunlist      = 0xA06F0111 // on a channel: {bool bForceRestart, bBypassWait}
	CtrlGetWorkSubmitToken  = 0xC36F0108 // on a channel: {u32 workSubmitToken}
	CtrlFIFODisableChannels = 0x2080110B // on a subdevice: FIFODisableSize bytes
	CtrlGPUGetPIDInfo       = 0x2080018E // on a subdevice: PIDInfoSize bytes
	CtrlFBGetInfoV2         = 0x20801303 // on a subdevice: FBInfoSize(n) bytes

	FIFODisableSize           = 536
	FIFODisableMax            = 64 // channels in one call
	FIFODisableClientsOffset  = 24
	FIFODisableChannelsOffset = 280

	// GET_PID_INFO: {u32 pidInfoListCount; NV2080_CTRL_GPU_PID_INFO
	// pidInfoList[200]@8}, each entry {u32 pid; u32 index; u32 result;
	// union data@16 (for index VIDEO_MEMORY_USAGE, 0: u64 memPrivate,
	// memSharedOwned, memSharedDuped and three protected-memory figures);
	// u32 computeInstanceId@64, gpuInstanceId@68}.
	PIDInfoSize       = 8 + PIDInfoMax*PIDInfoEntrySize
	PIDInfoMax        = 200 // entries in one call
	PIDInfoEntrySize  = 72
	PIDInfoListOffset = 8

	// FB_GET_INFO_V2: {u32 fbInfoListSize; NV2080_CTRL_FB_INFO
	// fbInfoList[n]@4}, each entry {u32 index; u32 data}. The driver takes
	// exactly its own n (FBInfoMaxLists, newest first); sizes are in KiB.
	FBInfoEntrySize    = 8
	FBInfoTotalRAMSize = 0x08 // the memory on the board, reserved included
	FBInfoHeapSize     = 0x09 // what allocations can take: the GPU's memory as cuMemGetInfo's total counts it
	FBInfoHeapFree     = 0x16
)

// FBInfoMaxLists are the fbInfoList lengths FB_GET_INFO_V2 has had, the
// newest first: 128 in R580's headers, 57 and 55 (R555) in earlier ones.
var FBInfoMaxLists = []int{128, 57, 55}

// FBInfoSize is FB_GET_INFO_V2's parameter size for a list of n.
func FBInfoSize(n int) int { return 4 + n*FBInfoEntrySize }

// NV_STATUS codes gpuarb tells apart. The driver answers them in the
// parameters' status field with the ioctl itself returning 0.
const (
	StatusOK                = 0x00
	StatusInsufficientPerms = 0x1B
	StatusInvalidArgument   = 0x1F
	StatusInvalidClient     = 0x23
	StatusInvalidCommand    = 0x24
	StatusInvalidObject     = 0x33
	StatusInvalidParamSize  = 0x37
	StatusNoMemory          = 0x51
	StatusNotSupported      = 0x56
)

var statusNames = map[uint32]string{
	StatusOK:                "NV_OK",
	StatusInsufficientPerms: "NV_ERR_INSUFFICIENT_PERMISSIONS", StatusInvalidArgument: "NV_ERR_INVALID_ARGUMENT",
	StatusInvalidClient: "NV_ERR_INVALID_CLIENT", StatusInvalidCommand: "NV_ERR_INVALID_COMMAND",
	StatusInvalidObject: "NV_ERR_INVALID_OBJECT_HANDLE", StatusInvalidParamSize: "NV_ERR_INVALID_PARAM_STRUCT",
	StatusNoMemory: "NV_ERR_NO_MEMORY", StatusNotSupported: "NV_ERR_NOT_SUPPORTED",
}

// StatusName names an NV_STATUS, or gives it in hex.
func StatusName(s uint32) string { return nameOf(statusNames, s, "NV_STATUS 0x%x") }

// The escapes' argument structs, as the probes and the decoders read them
// (little-endian u32 fields unless said).
const (
	// NVOS21 (RM_ALLOC, 32 bytes) and NVOS64 (RM_ALLOC with access
	// rights, 48 bytes) begin alike: the client, the parent, the new
	// object's handle, its class, a pointer to its parameters; then their
	// paramsSize and status sit apart.
	AllocParentOffset      = 4
	AllocObjectOffset      = 8
	AllocClassOffset       = 12
	AllocParamsOffset      = 16 // u64
	NVOS21ParamsSizeOffset = 24
	NVOS21StatusOffset     = 28
	NVOS64Size             = 48
	NVOS64ParamsSizeOffset = 32
	NVOS64StatusOffset     = 40
	// NVOS00 (RM_FREE): the client, the parent, the object, the status.
	FreeObjectOffset = 8
	FreeStatusOffset = 12
	// NVOS54 (RM_CONTROL): the client, the object, the command, flags, a
	// pointer to the parameters, their size, the status.
	ControlCmdOffset        = 8
	ControlParamsOffset     = 16 // u64
	ControlParamsSizeOffset = 24
	ControlStatusOffset     = 28
	// NVOS32 (RM_VID_HEAP_CONTROL): the function and the status.
	NVOS32FunctionOffset = 8
	NVOS32StatusOffset   = 20
	// NVOS54's object (RM_CONTROL), and NVOS33 (RM_MAP_MEMORY) and the OS
	// event escapes' device: the second u32, after the client.
	ControlObjectOffset = 4
	DeviceOffset        = 4
	// NVOS33 (RM_MAP_MEMORY): the memory's handle, the offset and the
	// length mapped (u64).
	MapMemoryOffset       = 8
	MapMemoryOffsetOffset = 16
	MapMemoryLengthOffset = 24
	// The OS event escapes (ALLOC_OS_EVENT, FREE_OS_EVENT): the file
	// descriptor the event signals.
	OSEventFDOffset = 8
	// UVM_REGISTER_CHANNEL: the GPU's UUID (16 bytes), then the RM client,
	// the channel and the base and length of its instance memory (u64).
	UVMRegisterUUIDSize      = 16
	UVMRegisterClientOffset  = 16
	UVMRegisterChannelOffset = 20
	UVMRegisterBaseOffset    = 24
	UVMRegisterLengthOffset  = 32
)

// Parameter layouts the probes and the decoders read.
const (
	// TSGParamsSize is the channel group's allocation parameters, which
	// libcuda passes with paramsSize 0 (the driver sizes them by class).
	TSGParamsSize = 20
	// MemorySizeOffset is the size's offset in NV_MEMORY_ALLOCATION_PARAMS
	// (RM_ALLOC of a memory class; in and out).
	MemorySizeOffset = 64
	// NVOS32 (RM_VID_HEAP_CONTROL): its least size, its functions that
	// allocate device memory, and the offsets of the memory's handle and
	// of the size (ALLOC_SIZE) or the range's size (ALLOC_SIZE_RANGE).
	NVOS32MinSize            = 96
	NVOS32FunctionAllocSize  = 2
	NVOS32FunctionAllocRange = 14
	NVOS32MemoryHandleOffset = 44
	NVOS32SizeOffset         = 88
	NVOS32RangeSizeOffset    = 80
	// NV0080_ALLOC_PARAMETERS (a device): its device id, the first u32.
	DeviceIDOffset = 0
	// NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS (a TSG): its VA space and
	// engine type.
	TSGVASpaceOffset    = 8
	TSGEngineTypeOffset = 12
	// NV_CHANNEL_ALLOC_PARAMS (a GPFIFO channel): the GPFIFO's offset (u64)
	// and entries, its context share and VA space.
	ChannelGPFIFOOffsetOffset  = 8
	ChannelGPFIFOEntriesOffset = 16
	ChannelContextShareOffset  = 24
	ChannelVASpaceOffset       = 28
)
