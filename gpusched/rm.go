package gpusched

import (
	"encoding/binary"
	"fmt"
	"time"
)

// RM controls the actuator sends (open-gpu-kernel-modules ctrl headers,
// docs/driver.md §3), each with the exact parameter size the driver
// checks.
const (
	ctrlTSGSetTimeslice     = 0xa06c0103 // on the TSG: {u64 timesliceUs}
	ctrlTSGGetTimeslice     = 0xa06c0104 // on the TSG: {u64 timesliceUs}
	ctrlTSGPreempt          = 0xa06c0105 // on the TSG: {bool bWait; bool bManualTimeout; u32 timeoutUs@4}
	ctrlTSGGetInfo          = 0xa06c0106 // on the TSG: {u32 tsgID}
	ctrlRestartRunlist      = 0xa06f0111 // on a channel: {bool bForceRestart, bBypassWait}
	ctrlFIFODisableChannels = 0x2080110b // on the subdevice: 536 B
	// ctrlSimSchedCosts is the simulated GPU's own, on the TSG: {u64
	// defaultTimesliceUs; u64 contextSwitchNs; u64 preemptNs}.
	ctrlSimSchedCosts         = 0xfa6c0001
	fifoDisableSize           = 536
	fifoDisableMax            = 64
	fifoDisableClientsOffset  = 24
	fifoDisableChannelsOffset = 280
)

// Statuses the driver answers that the actuator tells apart.
const (
	nvOK                   = 0x00
	nvErrInsufficientPerms = 0x1b
	nvErrInvalidArgument   = 0x1f
	nvErrInvalidClient     = 0x23
	nvErrInvalidCommand    = 0x24
	nvErrInvalidObject     = 0x33
	nvErrInvalidParamSize  = 0x37
	nvErrNotSupported      = 0x56
)

var statusNames = map[uint32]string{
	nvErrInsufficientPerms: "NV_ERR_INSUFFICIENT_PERMISSIONS", nvErrInvalidArgument: "NV_ERR_INVALID_ARGUMENT",
	nvErrInvalidClient: "NV_ERR_INVALID_CLIENT", nvErrInvalidCommand: "NV_ERR_INVALID_COMMAND",
	nvErrInvalidObject: "NV_ERR_INVALID_OBJECT_HANDLE", nvErrInvalidParamSize: "NV_ERR_INVALID_PARAM_STRUCT",
	nvErrNotSupported: "NV_ERR_NOT_SUPPORTED",
}

// StatusError is a control the driver refused.
type StatusError struct {
	Control uint32
	Status  uint32
}

func (e *StatusError) Error() string {
	name, ok := statusNames[e.Status]
	if !ok {
		name = fmt.Sprintf("NV_STATUS 0x%x", e.Status)
	}
	return fmt.Sprintf("rm control 0x%08x: %s", e.Control, name)
}

// The parameter blocks, little-endian as the driver lays them out.

func timesliceParams(d time.Duration) []byte {
	return binary.LittleEndian.AppendUint64(nil, uint64(d/time.Microsecond))
}

// restartParams asks for a forced restart of the runlist.
func restartParams() []byte { return []byte{1, 0} }

// preemptParams waits for the preemption to finish.
func preemptParams() []byte { return []byte{1, 0, 0, 0, 0, 0, 0, 0} }

// disableParams disables (or enables) channels of one client, their
// queued work kept: stopping them on the GPU, or where onlyScheduling
// leaving what runs now to finish its timeslice (bOnlyDisableScheduling).
func disableParams(disable, onlyScheduling bool, client uint32, channels []uint32) ([]byte, error) {
	if len(channels) > fifoDisableMax {
		return nil, fmt.Errorf("%d channels in one FIFO_DISABLE_CHANNELS, at most %d", len(channels), fifoDisableMax)
	}
	p := make([]byte, fifoDisableSize)
	le := binary.LittleEndian
	if disable {
		p[0] = 1
	}
	if onlyScheduling {
		p[8] = 1
	}
	le.PutUint32(p[4:], uint32(len(channels)))
	for i, ch := range channels {
		le.PutUint32(p[fifoDisableClientsOffset+4*i:], client)
		le.PutUint32(p[fifoDisableChannelsOffset+4*i:], ch)
	}
	return p, nil
}
