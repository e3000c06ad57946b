package gpusched

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/ledger"
)

// Steered is a channel group gpuarb changed, as the ledger records it: how
// to reach it again, and the timeslice it had before.
type Steered struct {
	Group Group `json:"group"`
	// Start is the process's start time (clock ticks since boot), against
	// pid reuse.
	Start uint64 `json:"start"`
	// Original is the group's timeslice before gpuarb's first change.
	Original time.Duration `json:"original_ns"`
	// FakeGPU is the simulated GPU's socket its controls went to (the
	// operator's --fakegpu-socket; "" on the nvidia driver).
	FakeGPU string `json:"fakegpu_socket,omitempty"`
}

// steeredFormat is the steering ledger's file: the bare list of groups.
var steeredFormat = ledger.Format[Steered]{Key: func(s Steered) string {
	return fmt.Sprintf("%d/%d/%x/%x", s.Group.PID, s.Start, s.Group.Client, s.Group.TSG)
}}

// Ledger is the steering ledger: the file, beside the daemon's socket,
// that lists every channel group gpuarb has changed. It is rewritten
// (atomically) before a group's first change, so that whoever finds it —
// the guardian when the daemon dies, a restarted daemon, `gpuarb thaw
// --all` — can put them all back: resumed, their own timeslices restored.
type Ledger struct{ set *ledger.Set[Steered] }

// OpenLedger returns the ledger at path with the groups it lists; one
// whose file was unreadable, and set aside, comes empty with an error
// wrapping ledger.ErrUnreadable.
func OpenLedger(path string) (*Ledger, error) {
	set, err := ledger.Open(path, steeredFormat)
	if set == nil {
		return nil, err
	}
	return &Ledger{set}, err
}

// Add records groups before their first change, in one rewrite; none is
// recorded when it returns an error.
func (l *Ledger) Add(ss ...Steered) error { return l.set.Add(ss...) }

// Remove forgets groups put back (or whose processes ended), in one
// rewrite; when the write fails they stay recorded.
func (l *Ledger) Remove(ss ...Steered) error { return l.set.Remove(ss...) }

// PutBack resumes every group a ledger file lists and restores its own
// timeslice (groups of processes that have ended are skipped), then
// removes the file. It returns what it did.
func PutBack(path string) ([]string, error) {
	list, err := steeredFormat.Read(path)
	if err != nil || len(list) == 0 {
		return nil, err
	}
	actuators := map[string]*Actuator{}
	defer func() {
		for _, a := range actuators {
			a.Close()
		}
	}()
	var done []string
	var errs []error
	resume := false
	for _, s := range list {
		if cgroup.Exited(int(s.Group.PID), s.Start) {
			continue
		}
		a := actuators[s.FakeGPU]
		if a == nil {
			a = New(s.FakeGPU)
			actuators[s.FakeGPU] = a
		}
		ch := Change{Group: s.Group, Pause: &resume, Timeslice: s.Original}
		if _, err := a.Apply([]Change{ch}); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, fmt.Sprintf("resumed pid %d's channel group 0x%x (timeslice %v)", s.Group.PID, s.Group.TSG, s.Original))
	}
	if len(errs) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return done, errors.Join(errs...)
}
