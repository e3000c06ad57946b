package gpusched

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
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

func (s Steered) key() string {
	return fmt.Sprintf("%d/%d/%x/%x", s.Group.PID, s.Start, s.Group.Client, s.Group.TSG)
}

// Ledger is the file, beside the daemon's socket, that lists every
// channel group gpuarb has changed. It is rewritten (atomically) before a
// group's first change, so that whoever finds it — the guardian when the
// daemon dies, a restarted daemon, `gpuarb thaw --all` — can put them all
// back: resumed, their own timeslices restored.
type Ledger struct {
	path string

	mu     sync.Mutex
	groups map[string]Steered
}

// OpenLedger returns the ledger at path with the groups it lists; one
// whose file was unreadable, and set aside, comes empty with an error
// wrapping cgroup.ErrBadLedger.
func OpenLedger(path string) (*Ledger, error) {
	l := &Ledger{path: path, groups: map[string]Steered{}}
	list, err := readLedger(path)
	if errors.Is(err, cgroup.ErrBadLedger) {
		return l, err
	}
	if err != nil {
		return nil, err
	}
	for _, s := range list {
		l.groups[s.key()] = s
	}
	return l, nil
}

func readLedger(path string) ([]Steered, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read steering ledger: %w", err)
	}
	var list []Steered
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, cgroup.SetAside(path, err)
	}
	return list, nil
}

// Add records groups before their first change, in one rewrite; none is
// recorded when it returns an error.
func (l *Ledger) Add(ss ...Steered) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var added []string
	for _, s := range ss {
		if _, ok := l.groups[s.key()]; !ok {
			l.groups[s.key()] = s
			added = append(added, s.key())
		}
	}
	if len(added) == 0 {
		return nil
	}
	if err := l.write(); err != nil {
		for _, k := range added {
			delete(l.groups, k)
		}
		return err
	}
	return nil
}

// Remove forgets groups put back (or whose processes ended), in one
// rewrite.
func (l *Ledger) Remove(ss ...Steered) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	removed := false
	for _, s := range ss {
		if _, ok := l.groups[s.key()]; ok {
			delete(l.groups, s.key())
			removed = true
		}
	}
	if !removed {
		return nil
	}
	return l.write()
}

// write rewrites the file, its groups in the order of their keys (sorted
// once: formatting a key per comparison took most of a 1000-tenant
// daemon's CPU while it tracked new groups).
func (l *Ledger) write() error {
	keys := make([]string, 0, len(l.groups))
	for k := range l.groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	list := make([]Steered, len(keys))
	for i, k := range keys {
		list[i] = l.groups[k]
	}
	data, err := json.Marshal(list)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(l.path), "."+filepath.Base(l.path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write steering ledger: %w", err)
	}
	if err := os.Rename(tmp, l.path); err != nil {
		return fmt.Errorf("write steering ledger: %w", err)
	}
	return nil
}

// PutBack resumes every group a ledger file lists and restores its own
// timeslice (groups of processes that have ended are skipped), then
// removes the file. It returns what it did.
func PutBack(path string) ([]string, error) {
	list, err := readLedger(path)
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
