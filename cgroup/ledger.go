package cgroup

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
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

// Ledger is the file, on tmpfs beside the socket, that lists every target
// the daemon may stop. It is rewritten (atomically) whenever the set
// changes, before the first freeze of a new target, so whoever finds it —
// the guardian when the daemon dies, a restarted daemon, `gpuarb thaw
// --all` — can resume them all.
type Ledger struct {
	path string

	mu      sync.Mutex
	targets map[Target]bool
}

// OpenLedger returns the ledger at path, with the targets it lists; one
// whose file was unreadable, and set aside, comes empty with an error
// wrapping ErrBadLedger.
func OpenLedger(path string) (*Ledger, error) {
	l := &Ledger{path: path, targets: map[Target]bool{}}
	ts, err := ReadLedger(path)
	if errors.Is(err, ErrBadLedger) {
		return l, err
	}
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		l.targets[t] = true
	}
	return l, nil
}

// ErrBadLedger marks a ledger file that could not be read and was set
// aside (renamed PATH.bad) so that it keeps nothing from starting.
var ErrBadLedger = errors.New("unreadable ledger set aside")

// SetAside renames a ledger file that cannot be read to PATH.bad (the last
// one set aside is replaced) and returns an error saying so, wrapping
// ErrBadLedger and why.
func SetAside(path string, why error) error {
	bad := path + ".bad"
	if err := os.Rename(path, bad); err != nil {
		return fmt.Errorf("%s: %w; setting it aside: %w", path, why, err)
	}
	return fmt.Errorf("%w: %s moved to %s: %w", ErrBadLedger, path, bad, why)
}

// ReadLedger lists the targets recorded at path (none when it is missing).
// A file that does not parse is set aside (SetAside): what it listed may
// stay stopped, and the error says where the file went.
func ReadLedger(path string) ([]Target, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ledger: %w", err)
	}
	defer f.Close()
	var doc struct {
		Targets []Target `json:"targets"`
	}
	if err := json.NewDecoder(f).Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, SetAside(path, err)
	}
	return doc.Targets, nil
}

// Add records targets, in one write; they are on disk when Add returns
// nil, and none is recorded when it returns an error.
func (l *Ledger) Add(ts ...Target) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var added []Target
	for _, t := range ts {
		if !l.targets[t] {
			l.targets[t] = true
			added = append(added, t)
		}
	}
	if len(added) == 0 {
		return nil
	}
	if err := l.writeLocked(); err != nil {
		for _, t := range added {
			delete(l.targets, t)
		}
		return err
	}
	return nil
}

// Remove forgets targets (thawed for good), in one write; when the write
// fails they stay recorded.
func (l *Ledger) Remove(ts ...Target) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var removed []Target
	for _, t := range ts {
		if l.targets[t] {
			delete(l.targets, t)
			removed = append(removed, t)
		}
	}
	if len(removed) == 0 {
		return nil
	}
	if err := l.writeLocked(); err != nil {
		for _, t := range removed {
			l.targets[t] = true
		}
		return err
	}
	return nil
}

// Targets lists the recorded targets.
func (l *Ledger) Targets() []Target {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sortedLocked()
}

func (l *Ledger) sortedLocked() []Target {
	out := make([]Target, 0, len(l.targets))
	for t := range l.targets {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

func (l *Ledger) writeLocked() error {
	data, err := json.Marshal(map[string][]Target{"targets": l.sortedLocked()})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(l.path), 0o755); err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	tmp := l.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	if err := os.Rename(tmp, l.path); err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	return nil
}

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
		errs = append(errs, keepOnly(path, failed))
	}
	return thawed, errors.Join(errs...)
}

// keepOnly rewrites the ledger at path to list only targets, or removes it
// when there are none.
func keepOnly(path string, targets []Target) error {
	if len(targets) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove ledger: %w", err)
		}
		return nil
	}
	l := &Ledger{path: path, targets: map[Target]bool{}}
	for _, t := range targets {
		l.targets[t] = true
	}
	return l.writeLocked()
}
