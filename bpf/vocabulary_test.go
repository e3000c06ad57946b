package bpf

import (
	"testing"

	"github.com/gpuarb/gpuarb/nvrm"
)

// The probes read the driver with the values package nvrm has.
func TestProbesSpeakTheDriversVocabulary(t *testing.T) {
	for _, c := range []struct {
		name     string
		probes   gpuarbNvRm
		decoders uint32
	}{
		{"NV_MAGIC", gpuarbNvRmNV_MAGIC, nvrm.Magic},
		{"NV_ESC_RM_FREE", gpuarbNvRmNV_ESC_RM_FREE, nvrm.EscRMFree},
		{"NV_ESC_RM_CONTROL", gpuarbNvRmNV_ESC_RM_CONTROL, nvrm.EscRMControl},
		{"NV_ESC_RM_ALLOC", gpuarbNvRmNV_ESC_RM_ALLOC, nvrm.EscRMAlloc},
		{"NV_ESC_RM_VID_HEAP_CONTROL", gpuarbNvRmNV_ESC_RM_VID_HEAP_CONTROL, nvrm.EscRMVidHeapControl},
		{"NV_ESC_IOCTL_XFER_CMD", gpuarbNvRmNV_ESC_IOCTL_XFER_CMD, nvrm.EscIoctlXferCmd},
		{"NV_TSG_CLASS", gpuarbNvRmNV_TSG_CLASS, nvrm.ClassTSG},
		{"NV_DEVICE_CLASS", gpuarbNvRmNV_DEVICE_CLASS, nvrm.ClassDevice},
		{"NV_SUBDEVICE_CLASS", gpuarbNvRmNV_SUBDEVICE_CLASS, nvrm.ClassSubdevice},
		{"NV_CHANNEL_CLASS_MASK", gpuarbNvRmNV_CHANNEL_CLASS_MASK, nvrm.ChannelClassMask},
		{"NV_CHANNEL_CLASS_LOW", gpuarbNvRmNV_CHANNEL_CLASS_LOW, nvrm.ChannelClassLow},
		{"NV_MEM_LOCAL_USER", gpuarbNvRmNV_MEM_LOCAL_USER, nvrm.ClassMemoryLocalUser},
		{"NV_MEM_LOCAL_PRIVILEGED", gpuarbNvRmNV_MEM_LOCAL_PRIVILEGED, nvrm.ClassMemoryLocalPrivileged},
		{"NV_MEM_SYSTEM", gpuarbNvRmNV_MEM_SYSTEM, nvrm.ClassMemorySystem},
		{"NV_MEM_SIZE_OFFSET", gpuarbNvRmNV_MEM_SIZE_OFFSET, nvrm.MemorySizeOffset},
		{"NVOS32_MIN_SIZE", gpuarbNvRmNVOS32MIN_SIZE, nvrm.NVOS32MinSize},
		{"NVOS32_FUNCTION_ALLOC_SIZE", gpuarbNvRmNVOS32FUNCTION_ALLOC_SIZE, nvrm.NVOS32FunctionAllocSize},
		{"NVOS32_FUNCTION_ALLOC_SIZE_RANGE", gpuarbNvRmNVOS32FUNCTION_ALLOC_SIZE_RANGE, nvrm.NVOS32FunctionAllocRange},
		{"NVOS32_HMEMORY_OFFSET", gpuarbNvRmNVOS32HMEMORY_OFFSET, nvrm.NVOS32MemoryHandleOffset},
		{"NVOS32_SIZE_OFFSET", gpuarbNvRmNVOS32SIZE_OFFSET, nvrm.NVOS32SizeOffset},
		{"NVOS32_RANGE_SIZE_OFFSET", gpuarbNvRmNVOS32RANGE_SIZE_OFFSET, nvrm.NVOS32RangeSizeOffset},
		{"NV_TSG_PARAMS_SIZE", gpuarbNvRmNV_TSG_PARAMS_SIZE, nvrm.TSGParamsSize},
		{"NVOS32_FUNCTION_OFFSET", gpuarbNvRmNVOS32FUNCTION_OFFSET, nvrm.NVOS32FunctionOffset},
		{"NVOS32_STATUS_OFFSET", gpuarbNvRmNVOS32STATUS_OFFSET, nvrm.NVOS32StatusOffset},
		{"NV_ALLOC_PARENT_OFFSET", gpuarbNvRmNV_ALLOC_PARENT_OFFSET, nvrm.AllocParentOffset},
		{"NV_ALLOC_OBJECT_OFFSET", gpuarbNvRmNV_ALLOC_OBJECT_OFFSET, nvrm.AllocObjectOffset},
		{"NV_ALLOC_CLASS_OFFSET", gpuarbNvRmNV_ALLOC_CLASS_OFFSET, nvrm.AllocClassOffset},
		{"NV_ALLOC_PARAMS_OFFSET", gpuarbNvRmNV_ALLOC_PARAMS_OFFSET, nvrm.AllocParamsOffset},
		{"NVOS21_PARAMS_SIZE_OFFSET", gpuarbNvRmNVOS21PARAMS_SIZE_OFFSET, nvrm.NVOS21ParamsSizeOffset},
		{"NVOS21_STATUS_OFFSET", gpuarbNvRmNVOS21STATUS_OFFSET, nvrm.NVOS21StatusOffset},
		{"NVOS64_SIZE", gpuarbNvRmNVOS64SIZE, nvrm.NVOS64Size},
		{"NVOS64_PARAMS_SIZE_OFFSET", gpuarbNvRmNVOS64PARAMS_SIZE_OFFSET, nvrm.NVOS64ParamsSizeOffset},
		{"NVOS64_STATUS_OFFSET", gpuarbNvRmNVOS64STATUS_OFFSET, nvrm.NVOS64StatusOffset},
		{"NV_FREE_OBJECT_OFFSET", gpuarbNvRmNV_FREE_OBJECT_OFFSET, nvrm.FreeObjectOffset},
		{"NV_FREE_STATUS_OFFSET", gpuarbNvRmNV_FREE_STATUS_OFFSET, nvrm.FreeStatusOffset},
		{"NV_CONTROL_PARAMS_OFFSET", gpuarbNvRmNV_CONTROL_PARAMS_OFFSET, nvrm.ControlParamsOffset},
		{"NV_CONTROL_PARAMS_SIZE_OFFSET", gpuarbNvRmNV_CONTROL_PARAMS_SIZE_OFFSET, nvrm.ControlParamsSizeOffset},
	} {
		if uint32(c.probes) != c.decoders {
			t.Errorf("%s: the probes read %#x, package nvrm says %#x", c.name, uint32(c.probes), c.decoders)
		}
	}
}
