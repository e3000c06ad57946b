package cgroup

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/gpuarb/gpuarb/ledger"
)

// Target kinds.
const (
	KindV2  = "cgroup2"
	KindV1  = "freezer"
	KindPID = "pid" // a process tree, by its root (what an earlier gpuarb recorded)
	// KindProcess is one process a signal gate stopped.
	KindProcess = "process"
)

// Target is one thing a gate may have stopped, as the ledger records it.
type Target struct {
	Kind  string `json:"kind"`
	Path  string `json:"path,omitempty"`  // cgroup directory (cgroup2, freezer)
	PID   int    `json:"pid,omitempty"`   // process (pid)
	Start uint64 `json:"start,omitempty"` // the process's start time, against pid reuse
}

func (t Target) String() string {
	switch t.Kind {
	case KindPID:
		return fmt.Sprintf("pid %d's tree", t.PID)
	case KindProcess:
		return fmt.Sprintf("pid %d", t.PID)
	}
	return t.Path
}

// Gate rebuilds the gate of a recorded target, without the safety checks
// of the constructors (thawing is always safe).
func (t Target) Gate() (Gate, error) {
	switch t.Kind {
	case KindV2:
		mount, rel, ok := splitMount(t.Path)
		if !ok {
			return nil, fmt.Errorf("%s is not under a cgroup2 mount", t.Path)
		}
		return newV2GateUnchecked(mount, rel)
	case KindV1:
		rel, ok := strings.CutPrefix(t.Path, V1FreezerMount)
		if !ok {
			return nil, fmt.Errorf("%s is not under %s", t.Path, V1FreezerMount)
		}
		return newV1GateUnchecked(rel)
	case KindPID:
		return SignalGateOf(t.PID, t.Start), nil
	case KindProcess:
		return processThaw{pid: t.PID, start: t.Start}, nil
	}
	return nil, fmt.Errorf("unknown target kind %q", t.Kind)
}

// processThaw is the thaw of one process a signal gate stopped.
type processThaw struct {
	pid   int
	start uint64
}

func (p processThaw) Freeze() error  { return errors.New("a recorded process is only thawed") }
func (p processThaw) Thaw() error    { return ContinueProcess(p.pid, p.start) }
func (p processThaw) Target() Target { return Target{Kind: KindProcess, PID: p.pid, Start: p.start} }

func splitMount(dir string) (mount, rel string, ok bool) {
	m, err := UnifiedMount()
	if err != nil {
		return "", "", false
	}
	rel, ok = strings.CutPrefix(dir, m)
	return m, rel, ok
}

// targets is the thaw ledger's file: {"targets": [...]}.
var targets = ledger.Format[Target]{Field: "targets", Key: func(t Target) string {
	return fmt.Sprintf("%s %s %d %d", t.Kind, t.Path, t.PID, t.Start)
}}

// Ledger is the thaw ledger: the file, on tmpfs beside the socket, that
// lists every target the daemon may stop. It is rewritten (atomically)
// whenever the set changes, before the first freeze of a new target, so
// whoever finds it — the guardian when the daemon dies, a restarted
// daemon, `gpuarb thaw --all` — can resume them all.
type Ledger struct{ set *ledger.Set[Target] }

// OpenLedger returns the ledger at path, with the targets it lists; one
// whose file was unreadable, and set aside, comes empty with an error
// wrapping ledger.ErrUnreadable.
func OpenLedger(path string) (*Ledger, error) {
	set, err := ledger.Open(path, targets)
	if set == nil {
		return nil, err
	}
	return &Ledger{set}, err
}

// ReadLedger lists the targets recorded at path (none when it is missing).
// A file that does not parse is set aside (ledger.SetAside): what it
// listed may stay stopped, and the error says where the file went.
func ReadLedger(path string) ([]Target, error) { return targets.Read(path) }

// Add records targets, in one write; they are on disk when Add returns
// nil, and none is recorded when it returns an error.
func (l *Ledger) Add(ts ...Target) error { return l.set.Add(ts...) }

// Remove forgets targets (thawed for good), in one write; when the write
// fails they stay recorded.
func (l *Ledger) Remove(ts ...Target) error { return l.set.Remove(ts...) }

// Targets lists the recorded targets.
func (l *Ledger) Targets() []Target { return l.set.Records() }

// ThawAll resumes every target of the ledger at path and returns what it
// thawed. Targets that are gone (cgroup removed, process exited) are
// skipped silently; other failures are returned together, and the ledger
// keeps listing just those (it is removed once every thaw succeeded), so
// whoever tries next — the guardian, a restarted daemon, `gpuarb thaw
// --all` — tries them again.
func ThawAll(path string) ([]Target, error) {
	ts, err := ReadLedger(path)
	if err != nil {
		return nil, err
	}
	var thawed, failed []Target
	var errs []error
	for _, t := range ts {
		g, err := t.Gate()
		if err == nil {
			err = g.Thaw()
		}
		switch {
		case err == nil:
			thawed = append(thawed, t)
		case errors.Is(err, os.ErrNotExist), errors.Is(err, os.ErrProcessDone):
		default:
			failed = append(failed, t)
			errs = append(errs, fmt.Errorf("%s: %w", t, err))
		}
	}
	if len(ts) > 0 {
		errs = append(errs, targets.Write(path, failed))
	}
	return thawed, errors.Join(errs...)
}
