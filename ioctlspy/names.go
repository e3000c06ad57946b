package ioctlspy

import (
	"fmt"

	"github.com/gpuarb/gpuarb/nvrm"
)

// nvos32Functions are the RM_VID_HEAP_CONTROL functions that allocate
// device memory: ALLOC_SIZE and ALLOC_SIZE_RANGE.
var nvos32Functions = map[uint32]string{nvrm.NVOS32FunctionAllocSize: "ALLOC_SIZE", nvrm.NVOS32FunctionAllocRange: "ALLOC_SIZE_RANGE"}

// nvidia-uvm commands.
const UVMRegisterChannel = 27

// nouveau and DRM core ioctl nr (DRM_COMMAND_BASE 0x40 included).
const (
	NouveauChannelAlloc    = 0x42
	NouveauChannelFree     = 0x43
	NouveauVMInit          = 0x50
	NouveauVMBind          = 0x51
	NouveauExec            = 0x52
	NouveauGemPushbuf      = 0x81
	NouveauGemCPUPrep      = 0x82
	DRMSyncobjWait         = 0xC3
	DRMSyncobjTimelineWait = 0xCA
)

// The u32 fields of the nouveau structs the decoder reads: each begins
// with the channel (or the VM_BIND op count, the CPU_PREP and syncobj
// handle) but CHANNEL_ALLOC, whose channel follows two ctxdma handles.
const (
	nouveauAllocChannelOffset  = 8  // drm_nouveau_channel_alloc.channel
	nouveauExecPushCountOffset = 4  // drm_nouveau_exec.push_count
	nouveauPushbufNrPushOffset = 20 // drm_nouveau_gem_pushbuf.nr_push, after nr_buffers and buffers (u64), nr_relocs
	nouveauFirstFieldOffset    = 0
)

var drmNames = map[uint32]string{
	NouveauChannelAlloc:    "NOUVEAU_CHANNEL_ALLOC",
	NouveauChannelFree:     "NOUVEAU_CHANNEL_FREE",
	NouveauVMInit:          "NOUVEAU_VM_INIT",
	NouveauVMBind:          "NOUVEAU_VM_BIND",
	NouveauExec:            "NOUVEAU_EXEC",
	NouveauGemPushbuf:      "NOUVEAU_GEM_PUSHBUF",
	NouveauGemCPUPrep:      "NOUVEAU_GEM_CPU_PREP",
	DRMSyncobjWait:         "DRM_SYNCOBJ_WAIT",
	DRMSyncobjTimelineWait: "DRM_SYNCOBJ_TIMELINE_WAIT",
}

// DRMName names a DRM/nouveau ioctl nr.
func DRMName(nr uint32) string {
	if n, ok := drmNames[nr]; ok {
		return n
	}
	return fmt.Sprintf("DRM_0x%02x", nr)
}
