package ioctlspy

import "fmt"

// nvidia escape numbers (ioctl nr with magic 'F').
const (
	EscRMFree           = 0x29
	EscRMControl        = 0x2A
	EscRMAlloc          = 0x2B
	EscRMIdleChannels   = 0x41
	EscRMMapMemory      = 0x4E
	EscRMVidHeapControl = 0x4A
	EscAllocOSEvent     = 206
	EscFreeOSEvent      = 207
	EscIoctlXferCmd     = 211
	EscAttachGPUsToFD   = 212
)

// nvidia object classes gpuarb recognises.
const (
	ClassTSG     = 0xA06C
	ClassOSEvent = 0x79
	ClassRoot    = 0x41
	ClassDevice  = 0x80
	ClassSubdev  = 0x2080
	ClassVASpace = 0x90F1
	// Video memory: NV01_MEMORY_LOCAL_USER and _PRIVILEGED.
	ClassMemoryLocalUser       = 0x40
	ClassMemoryLocalPrivileged = 0x3F
	// Pinned host memory: NV01_MEMORY_SYSTEM.
	ClassMemorySystem = 0x3E
)

// nvos32Functions are the RM_VID_HEAP_CONTROL functions that allocate
// device memory: ALLOC_SIZE and ALLOC_SIZE_RANGE.
var nvos32Functions = map[uint32]string{2: "ALLOC_SIZE", 14: "ALLOC_SIZE_RANGE"}

// RM control commands gpuarb decodes.
const (
	CtrlGetWorkSubmitToken = 0xC36F0108
	CtrlTSGSetTimeslice    = 0xA06C0103
	CtrlTSGPreempt         = 0xA06C0105
	CtrlTSGGetInfo         = 0xA06C0106
)

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

var classNames = map[uint32]string{
	0x0:    "NV01_ROOT",
	0x41:   "NV01_ROOT_CLIENT",
	0x3E:   "NV01_MEMORY_SYSTEM",
	0x40:   "NV01_MEMORY_LOCAL_USER",
	0x71:   "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR",
	0x79:   "NV01_EVENT_OS_EVENT",
	0x80:   "NV01_DEVICE_0",
	0x2080: "NV20_SUBDEVICE_0",
	0x90F1: "FERMI_VASPACE_A",
	0x9067: "FERMI_CONTEXT_SHARE_A",
	0xA06C: "KEPLER_CHANNEL_GROUP_A",
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
func ClassName(c uint32) string {
	if n, ok := classNames[c]; ok {
		return n
	}
	return fmt.Sprintf("0x%04x", c)
}

// IsChannelClass reports whether c is a GPFIFO channel class.
func IsChannelClass(c uint32) bool {
	switch c {
	case 0xC36F, 0xC46F, 0xC56F, 0xC86F, 0xC96F, 0xCA6F:
		return true
	}
	return false
}

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
func EscapeName(e uint32) string {
	if n, ok := escNames[e]; ok {
		return n
	}
	return fmt.Sprintf("ESC_0x%02x", e)
}

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
