package enforce

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/gpusched"
	"github.com/gpuarb/gpuarb/meter"
)

// probesAdmitter is a probes' launch gate as the arbiter's gater uses it: held
// processes are continued by pid and start time, and the meter learns when
// their held launch ran.
type probesAdmitter struct {
	gate  *bpf.LaunchGate
	meter *meter.Meter
}

// newProbesAdmitter wraps a probes' launch gate for a gater; m learns when
// each held launch ran.
func newProbesAdmitter(g *bpf.LaunchGate, m *meter.Meter) probesAdmitter {
	return probesAdmitter{gate: g, meter: m}
}

// Counts implements Admitter.
func (l probesAdmitter) Counts() (admitted, holds, escapes uint64, err error) { return l.gate.Counts() }

func (l probesAdmitter) Allow(n uint64) error { return l.gate.Allow(n) }

func (l probesAdmitter) Held() ([]Held, error) {
	held, err := l.gate.Held()
	if err != nil {
		return nil, err
	}
	now, mono := time.Now(), meter.MonotonicNow()
	out := make([]Held, 0, len(held))
	for _, h := range held {
		if !h.Releasable(mono) {
			continue // its stop is not out yet: released at a later tick
		}
		out = append(out, Held{PID: h.PID, Since: now.Add(-time.Duration(mono - min(h.Since, mono))),
			Launches: 1 + int(h.Waiting), Token: h})
	}
	return out, nil
}

func (l probesAdmitter) Release(h Held) (bool, error) {
	hp, ok := h.Token.(bpf.HeldProcess)
	if !ok {
		return false, fmt.Errorf("release pid %d: not held by a launch gate", h.PID)
	}
	// A hold that is gone was ended by someone else (and charged by the
	// gate) or replaced by a new one: the process is not continued for it.
	// The release is stamped before the continue: a launch the gate holds
	// from then on belongs to a new hold (its threads may run, and be held
	// again, before this call returns).
	var at uint64
	released, err := l.gate.Release(hp, func(hp bpf.HeldProcess) error {
		at = meter.MonotonicNow()
		return cgroup.ContinueProcess(hp.PID, hp.StartTicks)
	})
	if released {
		l.meter.Observe(meter.Release(uint32(hp.PID), hp.Since, at))
	}
	return released, err
}

// SteerLedgerBeside is the steering ledger's path beside a thaw ledger:
// whoever thaws what a daemon left finds both.
func SteerLedgerBeside(ledger string) string {
	return filepath.Join(filepath.Dir(ledger), "steered.json")
}

// ThawLeftovers resumes what a daemon that is gone may have left stopped:
// the cgroups and processes of its ledger, and the processes its launch
// gates hold in the pinned table under pinPath. It returns a line per
// thing it resumed. The guardian, a starting daemon and `gpuarb thaw
// --all` without a daemon call it.
func ThawLeftovers(ledger, pinPath string) ([]string, error) {
	var out []string
	thawed, errLedger := cgroup.ThawAll(ledger)
	for _, t := range thawed {
		out = append(out, "thawed "+t.String())
	}
	resumed, errSteer := gpusched.PutBack(SteerLedgerBeside(ledger))
	out = append(out, resumed...)
	held, errHeld := bpf.ReleasePinnedHeld(pinPath, func(h bpf.HeldProcess) error {
		return cgroup.ContinueProcess(h.PID, h.StartTicks)
	})
	for _, h := range held {
		out = append(out, fmt.Sprintf("released pid %d (held at a launch)", h.PID))
	}
	return out, errors.Join(errLedger, errSteer, errHeld)
}
