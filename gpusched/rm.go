package gpusched

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/gpuarb/gpuarb/nvrm"
)

// ctrlSimSchedCosts is the simulated GPU's own control, on a TSG: {u64
// defaultTimesliceUs; u64 contextSwitchNs; u64 preemptNs}.
const ctrlSimSchedCosts = 0xfa6c0001

// StatusError is a control the driver refused.
type StatusError struct {
	Control uint32
	Status  uint32
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("rm control 0x%08x: %s", e.Control, nvrm.StatusName(e.Status))
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
	if len(channels) > nvrm.FIFODisableMax {
		return nil, fmt.Errorf("%d channels in one FIFO_DISABLE_CHANNELS, at most %d", len(channels), nvrm.FIFODisableMax)
	}
	p := make([]byte, nvrm.FIFODisableSize)
	le := binary.LittleEndian
	if disable {
		p[0] = 1
	}
	if onlyScheduling {
		p[8] = 1
	}
	le.PutUint32(p[4:], uint32(len(channels)))
	for i, ch := range channels {
		le.PutUint32(p[nvrm.FIFODisableClientsOffset+4*i:], client)
		le.PutUint32(p[nvrm.FIFODisableChannelsOffset+4*i:], ch)
	}
	return p, nil
}

// pidInfoParams asks GET_PID_INFO for the video memory of each of pids
// (at most nvrm.PIDInfoMax).
func pidInfoParams(pids []uint32) []byte {
	p := make([]byte, nvrm.PIDInfoSize)
	le := binary.LittleEndian
	le.PutUint32(p, uint32(len(pids)))
	for i, pid := range pids {
		le.PutUint32(p[nvrm.PIDInfoListOffset+nvrm.PIDInfoEntrySize*i:], pid)
		// index 0 is VIDEO_MEMORY_USAGE
	}
	return p
}

// pidVideoMemory reads GET_PID_INFO's answer for n entries: each process's
// private video memory and the shared memory it owns (memPrivate +
// memSharedOwned; what it imported from others, memSharedDuped, is
// theirs), for the entries the driver answered NV_OK.
func pidVideoMemory(p []byte, n int) map[uint32]uint64 {
	le := binary.LittleEndian
	out := map[uint32]uint64{}
	for i := range n {
		e := p[nvrm.PIDInfoListOffset+nvrm.PIDInfoEntrySize*i:]
		if le.Uint32(e[8:]) != nvrm.StatusOK {
			continue
		}
		out[le.Uint32(e)] += le.Uint64(e[16:]) + le.Uint64(e[24:])
	}
	return out
}
