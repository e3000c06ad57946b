package bpf

// Ring-buffer records: a common header, then the body its type names
// (struct record_header and the records in gpuarb.h, as bpf2go generates
// them). Decoders take their offsets from these layouts.
type (
	// RecordHeader begins every record.
	RecordHeader = gpuarbRecordHeader
	// IoctlRecord is an ioctl on a GPU device node (RecordIoctl).
	IoctlRecord = gpuarbIoctlRecord
	// CallRecord is a libcuda call other than a launch (RecordCuda).
	CallRecord = gpuarbCallRecord
	// LaunchRecord is a kernel or graph launch (RecordLaunch).
	LaunchRecord = gpuarbLaunchRecord
	// MapRecord is an mmap of a nvidia-uvm file or an munmap of a process
	// that made one (RecordMap).
	MapRecord = gpuarbMapRecord
)

// Record types: enum event_type in gpuarb.h. A RecordExit is the header
// alone.
const (
	RecordIoctl  = uint32(gpuarbEventTypeEV_IOCTL)
	RecordCuda   = uint32(gpuarbEventTypeEV_CUDA)
	RecordExit   = uint32(gpuarbEventTypeEV_EXIT)
	RecordLaunch = uint32(gpuarbEventTypeEV_LAUNCH)
	RecordMap    = uint32(gpuarbEventTypeEV_MAP)
)

// Record flags: enum event_flags in gpuarb.h. FlagHeld: the launch gate
// held the process at this call; FlagBegin: a wait began; FlagOOMKill: a
// device memory allocation past its tenant's limit killed its process.
const (
	FlagHeld    = uint32(gpuarbEventFlagsEVF_HELD)
	FlagBegin   = uint32(gpuarbEventFlagsEVF_BEGIN)
	FlagOOMKill = uint32(gpuarbEventFlagsEVF_OOM_KILL)
)
