package meter

import (
	"fmt"
	"math"
	"time"

	"github.com/gpuarb/gpuarb/ioctlspy"
)

// Effects are what an actuator did to the GPU's schedule, delivered to the
// meter through Observe as the probes' events are: the replay models them
// from their time on. Their header names the process (PID) or the cgroup
// (CgroupID) and the time (Start, End; CLOCK_MONOTONIC ns).

// TimesliceSet: gpuarb gave a process's channel groups on GPU Timeslice
// (0: the GPU's default again).
type TimesliceSet struct {
	ioctlspy.Header
	GPU       int           `json:"gpu"`
	Timeslice time.Duration `json:"timeslice_ns"`
}

// GroupPaused: gpuarb took a process's channel groups on GPU off it
// (Paused) or put them back, at Start: queued work waits in the replay,
// and syncs across the pause teach nothing.
type GroupPaused struct {
	ioctlspy.Header
	GPU    int  `json:"gpu"`
	Paused bool `json:"paused"`
}

// GroupDescheduled: gpuarb stopped scheduling a process's channel groups
// on GPU at Start (gpusched.Change.KeepRunning): one the replay runs then
// keeps the GPU to the end of its slice, then is paused as by
// GroupPaused; a GroupPaused that is not Paused puts it back.
type GroupDescheduled struct {
	ioctlspy.Header
	GPU int `json:"gpu"`
}

// HoldReleased: gpuarb continued at End a process its launch gate held
// since Start: the held launch runs from End, and syncs across the stop
// teach nothing.
type HoldReleased struct {
	ioctlspy.Header
}

// CgroupFrozen: gpuarb froze a cgroup's processes (CgroupID) during
// [Start, End): their syncs then teach nothing. A freeze in progress has
// End math.MaxUint64, and comes again with its end once it ends.
type CgroupFrozen struct {
	ioctlspy.Header
}

// ProcessUnprobed is a finding, not an actuator's effect: at Start a
// process (PID, CgroupID) has GPU channels on GPU but maps no probed
// libcuda (ioctlspy.Spy.Unprobed), so its launches and syncs are unseen.
// Nothing says when it has work, so the replay models it as a hog
// whenever it may run — its channel group not paused (GroupPaused), its
// cgroup not frozen (CgroupFrozen) — taking its turns beside the others,
// and as drained while frozen: an upper bound on what it takes between
// freezes, short of what a deep queue it left behind still runs. The same
// finding again changes nothing; a process that exited stays ended.
type ProcessUnprobed struct {
	ioctlspy.Header
	GPU int `json:"gpu"`
}

// Unprobed is the finding that process pid of cgroupID uses gpu unseen
// since t.
func Unprobed(pid uint32, cgroupID uint64, gpu int, t uint64) *ProcessUnprobed {
	return &ProcessUnprobed{Header: ioctlspy.Header{Type: "process_unprobed", PID: pid, CgroupID: cgroupID, Start: t, End: t}, GPU: gpu}
}

// Timeslice is the effect of setting a process's channel groups' timeslice.
func Timeslice(pid uint32, gpu int, d time.Duration) *TimesliceSet {
	return &TimesliceSet{Header: ioctlspy.Header{Type: "timeslice_set", PID: pid}, GPU: gpu, Timeslice: d}
}

// Pause is the effect of pausing (or resuming) a process's channel groups at t.
func Pause(pid uint32, gpu int, paused bool, t uint64) *GroupPaused {
	return &GroupPaused{Header: ioctlspy.Header{Type: "group_paused", PID: pid, Start: t, End: t}, GPU: gpu, Paused: paused}
}

// Deschedule is the effect of descheduling a process's channel groups at t.
func Deschedule(pid uint32, gpu int, t uint64) *GroupDescheduled {
	return &GroupDescheduled{Header: ioctlspy.Header{Type: "group_descheduled", PID: pid, Start: t, End: t}, GPU: gpu}
}

// Release is the effect of continuing at t a process held since since.
func Release(pid uint32, since, t uint64) *HoldReleased {
	return &HoldReleased{Header: ioctlspy.Header{Type: "hold_released", PID: pid, Start: since, End: t}}
}

// Freeze is the effect of freezing a cgroup during [from, to) (to
// math.MaxUint64 while the freeze lasts).
func Freeze(cgroupID, from, to uint64) *CgroupFrozen {
	return &CgroupFrozen{Header: ioctlspy.Header{Type: "cgroup_frozen", CgroupID: cgroupID, Start: from, End: to}}
}

func (e *TimesliceSet) String() string { return fmt.Sprintf("timeslice %v", e.Timeslice) }

func (e *GroupPaused) String() string {
	if e.Paused {
		return "channel groups paused"
	}
	return "channel groups resumed"
}

func (e *GroupDescheduled) String() string { return "channel groups descheduled" }

func (e *ProcessUnprobed) String() string {
	return fmt.Sprintf("uses GPU %d unseen by the probes", e.GPU)
}

func (e *HoldReleased) String() string {
	return fmt.Sprintf("released after %v held", time.Duration(e.End-e.Start))
}

func (e *CgroupFrozen) String() string {
	if e.End == math.MaxUint64 {
		return "cgroup frozen"
	}
	return fmt.Sprintf("cgroup frozen for %v", time.Duration(e.End-e.Start))
}

// observeEffect applies an actuator's effect (or the ProcessUnprobed
// finding); it reports whether ev is one.
func (m *Meter) observeEffect(ev ioctlspy.Event) bool {
	switch e := ev.(type) {
	case *ProcessUnprobed:
		m.unprobedAt(e.PID, e.CgroupID, e.GPU, e.Start)
	case *TimesliceSet:
		for _, c := range m.contextsOn(e.PID, e.GPU) {
			c.timeslice = e.Timeslice
		}
	case *GroupPaused:
		for _, c := range m.contextsOn(e.PID, e.GPU) {
			if c.paused == e.Paused && c.pauseAt == 0 {
				continue
			}
			m.at(c, e.Start) // may begin a pending deschedule's pause
			c.setPaused(e.Paused, e.Start)
		}
	case *GroupDescheduled:
		for _, c := range m.contextsOn(e.PID, e.GPU) {
			if c.paused || c.pauseAt != 0 {
				continue
			}
			at := m.at(c, e.Start)
			if r := m.replayOf(c.gpu); r.holder == c && r.sliceEnd > at && c.left() > 0 {
				c.pauseAt = r.sliceEnd
				continue
			}
			c.setPaused(true, at)
		}
	case *HoldReleased:
		m.releaseUntil(e.Start) // an earlier release of the process comes first
		for _, c := range m.contextsOf(e.PID) {
			c.releasedAt = e.End
			c.stopped = appendSpan(c.stopped, e.Start, e.End)
			if len(c.deferred) > 0 {
				m.launchReleased(c, e.End)
			}
		}
	case *CgroupFrozen:
		if m.unprobed > 0 {
			m.freezeUnprobed(e.CgroupID, e.Start, e.End)
		}
		ps := m.frozen[e.CgroupID]
		if n := len(ps); n > 0 && ps[n-1].start == e.Start {
			ps[n-1].end = e.End
			return true
		}
		m.frozen[e.CgroupID] = append(ps, span{e.Start, e.End})
	default:
		return false
	}
	return true
}

// unprobedAt applies ProcessUnprobed.
func (m *Meter) unprobedAt(pid uint32, cgroupID uint64, gpu int, t uint64) {
	if c := m.ctxs[ctxKey{pid, 0}]; c != nil && (c.exited || c.unprobed && c.cgroup == cgroupID && c.gpu == gpu) {
		return
	}
	c := m.context(&ioctlspy.Header{PID: pid, CgroupID: cgroupID, Start: t})
	if p := m.procs[pid]; p != nil {
		for tid, st := range p.setup { // no call of a context ever settles them
			m.applySetup(c, st)
			delete(p.setup, tid)
		}
	}
	m.moveGPU(c, gpu)
	m.at(c, t)
	if !c.unprobed {
		m.unprobed++
	}
	c.unprobed = true
	c.frozenNow = false
	if ps := m.frozen[cgroupID]; len(ps) > 0 && ps[len(ps)-1].end == math.MaxUint64 {
		c.frozenNow = true
	}
}
