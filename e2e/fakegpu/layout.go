// Package fakegpu is the simulated kernel-bypass GPU that gpuarb's demo and
// end-to-end tests run on when the host has no GPU. fakegpud (this package's
// Server) owns the GPUs: per GPU a runlist of channel groups, one per
// context with a channel per stream as NVIDIA's TSGs, time-sliced round
// robin (preemptive, or run-to-completion per kernel), a separate copy
// engine, and exact ground-truth accounting. Clients (the C libcuda.so.1 in
// libcuda/) set up over a Unix socket and then submit with no system call:
// they write ring entries in shared memory, advance GPPut and ring a
// doorbell word that the device polls, as hardware does.
package fakegpu

import (
	"fmt"
	"unsafe"
)

// Shared-memory and protocol layout, mirroring libcuda/fakegpu_abi.h.
const (
	magicCtx      = 0x46474358
	magicDoorbell = 0x46474442
	abiVersion    = 3

	MaxChannels = 32   // channels (streams) per context
	RingEntries = 1024 // entries per channel ring
	MaxEvents   = 1024 // event slots per context

	entryKernel     = 1
	entryCopy       = 2
	entryMarker     = 3
	entryWaitEvent  = 4
	entryHost       = 5
	entryWriteValue = 6
	entryWaitValue  = 7
	noEvent         = 0xffffffff

	// Conditions of a value wait (CU_STREAM_WAIT_VALUE_*).
	waitGEQ = 0
	waitEQ  = 1
	waitAND = 2
	waitNOR = 3
)

// entry is struct fg_entry.
type entry struct {
	Kind   uint32
	Event  uint32
	CostNS uint64
	Bytes  uint64
	Seq    uint64
	A0, A1 uint64
}

// channelShm is struct fg_channel.
type channelShm struct {
	Active   uint32
	Done     uint32
	GPPut    uint64
	GPGet    uint64
	Waiters  uint32
	_        uint32
	HostDone uint64
	RingAt   uint64 // CLOCK_MONOTONIC ns of the first doorbell not polled yet; 0: none
	_        [4]uint32
	Ring     [RingEntries]entry
}

// ctxShm is struct fg_ctx_shm.
type ctxShm struct {
	Magic   uint32
	Version uint32
	Dead    uint32
	// Chans has bit i set once the client used channel i (before its
	// first entry; never cleared): the device polls only those, so that a
	// doorbell costs a context's channels in use, not all MaxChannels.
	Chans   uint32
	EventTS [MaxEvents]uint64
	_       [48]byte
	Ch      [MaxChannels]channelShm
}

// doorbellShm is struct fg_doorbell.
type doorbellShm struct {
	Magic    uint32
	Version  uint32
	Ring     uint32
	Sleeping uint32
	Dead     uint32
}

const (
	ctxShmSize      = int(unsafe.Sizeof(ctxShm{}))
	doorbellShmSize = 4096
)

// Protocol operations (enum fg_op).
const (
	opHello      = 1
	opCtxCreate  = 2
	opCtxDestroy = 3
	opMemAlloc   = 4
	opMemFree    = 5
	opStats      = 6
	opChannel    = 7
	opRMControl  = 8
)

// maxRMParams is FG_MAX_RM_PARAMS: the most params one RM control carries.
const maxRMParams = 16 << 10

const (
	reqSize  = 64
	respSize = 32
)

// CUresult values the device returns.
const (
	cudaSuccess           = 0
	cudaInvalidValue      = 1
	cudaOutOfMemory       = 2
	cudaInvalidDevice     = 101
	cudaInvalidContext    = 201
	cudaInvalidHandle     = 400
	cudaDeviceUnavailable = 46
)

// LayoutForTest renders the Go view of the shared layout in the order the
// C check prints it: entry, channel, ring offset, context, channel array
// offset, event array offset, request, response.
func LayoutForTest() string {
	var c ctxShm
	var ch channelShm
	return fmt.Sprintf("%d %d %d %d %d %d %d %d", unsafe.Sizeof(entry{}), unsafe.Sizeof(ch),
		unsafe.Offsetof(ch.Ring), unsafe.Sizeof(c), unsafe.Offsetof(c.Ch), unsafe.Offsetof(c.EventTS), reqSize, respSize)
}
