package bpf

// Record is the layout of one ring-buffer record: struct event in
// gpuarb.h, as bpf2go generates it. Decoders take their offsets from it.
type Record = gpuarbEvent

// Record types: enum event_type in gpuarb.h.
const (
	RecordIoctl = uint32(gpuarbEventTypeEV_IOCTL)
	RecordCuda  = uint32(gpuarbEventTypeEV_CUDA)
	RecordExit  = uint32(gpuarbEventTypeEV_EXIT)
)

// Record flags: enum event_flags in gpuarb.h. FlagHeld: the launch gate
// held the process at this call; FlagBegin: a wait began; FlagOOMKill: a
// device memory allocation past its tenant's limit killed its process.
const (
	FlagHeld    = uint32(gpuarbEventFlagsEVF_HELD)
	FlagBegin   = uint32(gpuarbEventFlagsEVF_BEGIN)
	FlagOOMKill = uint32(gpuarbEventFlagsEVF_OOM_KILL)
)
