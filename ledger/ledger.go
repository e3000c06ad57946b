// Package ledger keeps a set of records in a file that is rewritten,
// atomically, before the set grows: a record names something the daemon
// did that must be undone if it dies (a frozen cgroup, a stopped process,
// a channel group it steered), so that whoever finds the file — the
// guardian, a restarted daemon, `gpuarb thaw --all` — can undo them all.
// The thaw ledger (cgroup) and the steering ledger (gpusched) are both a
// Set.
package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/gpuarb/gpuarb/internal/atomicfile"
)

// ErrUnreadable marks a ledger file that could not be read and was set
// aside (renamed PATH.bad) so that it keeps nothing from starting.
var ErrUnreadable = errors.New("unreadable ledger set aside")

// SetAside renames a ledger file that cannot be read to PATH.bad (the last
// one set aside is replaced) and returns an error saying so, wrapping
// ErrUnreadable and why.
func SetAside(path string, why error) error {
	bad := path + ".bad"
	if err := os.Rename(path, bad); err != nil {
		return fmt.Errorf("%s: %w; setting it aside: %w", path, why, err)
	}
	return fmt.Errorf("%w: %s moved to %s: %w", ErrUnreadable, path, bad, why)
}

// Format is how a ledger's file holds its records: Field names the JSON
// object member that lists them ("": the file is the bare list); Key
// identifies a record (two records of one key are one), and orders the
// file.
type Format[T any] struct {
	Field string
	Key   func(T) string
}

// Read lists the records of the file at path (none when it is missing). A
// file that does not parse is set aside (SetAside): what it listed may
// stay undone, and the error says where the file went.
func (f Format[T]) Read(path string) ([]T, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ledger %s: %w", path, err)
	}
	var list []T
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil // created, never written
	}
	if f.Field == "" {
		err = json.Unmarshal(data, &list)
	} else {
		var doc map[string]json.RawMessage
		if err = json.Unmarshal(data, &doc); err == nil && doc[f.Field] != nil {
			err = json.Unmarshal(doc[f.Field], &list)
		}
	}
	if err != nil {
		return nil, SetAside(path, err)
	}
	return list, nil
}

// Write replaces the file at path with records (ordered by key),
// atomically; no records removes it.
func (f Format[T]) Write(path string, records []T) error {
	if len(records) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove ledger: %w", err)
		}
		return nil
	}
	byKey := make(map[string]T, len(records))
	for _, r := range records {
		byKey[f.Key(r)] = r
	}
	return f.write(path, sortedByKey(byKey))
}

// sortedByKey lists records in the order of their keys, each key
// formatted once (not per comparison: a thousand tenants' groups).
func sortedByKey[T any](byKey map[string]T) []T {
	keys := slices.Sorted(maps.Keys(byKey))
	list := make([]T, len(keys))
	for i, k := range keys {
		list[i] = byKey[k]
	}
	return list
}

// write replaces the file at path with sorted, atomically.
func (f Format[T]) write(path string, sorted []T) error {
	var doc any = sorted
	if f.Field != "" {
		doc = map[string][]T{f.Field: sorted}
	}
	data, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	return nil
}

// Set is a ledger open for changes, safe for concurrent use.
type Set[T any] struct {
	path   string
	format Format[T]

	mu      sync.Mutex
	records map[string]T
}

// Open returns the ledger at path with the records its file lists; one
// whose file was unreadable, and set aside, comes empty with an error
// wrapping ErrUnreadable.
func Open[T any](path string, format Format[T]) (*Set[T], error) {
	s := &Set[T]{path: path, format: format, records: map[string]T{}}
	list, err := format.Read(path)
	if errors.Is(err, ErrUnreadable) {
		return s, err
	}
	if err != nil {
		return nil, err
	}
	for _, r := range list {
		s.records[format.Key(r)] = r
	}
	return s, nil
}

// Path is the ledger's file.
func (s *Set[T]) Path() string { return s.path }

// Add records rs, in one write; they are on disk when Add returns nil, and
// none is recorded when it returns an error.
func (s *Set[T]) Add(rs ...T) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var added []string
	for _, r := range rs {
		k := s.format.Key(r)
		if _, ok := s.records[k]; !ok {
			s.records[k] = r
			added = append(added, k)
		}
	}
	if len(added) == 0 {
		return nil
	}
	if err := s.format.write(s.path, sortedByKey(s.records)); err != nil {
		for _, k := range added {
			delete(s.records, k)
		}
		return err
	}
	return nil
}

// Remove forgets rs (undone for good), in one write; when the write fails
// they stay recorded.
func (s *Set[T]) Remove(rs ...T) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	removed := map[string]T{}
	for _, r := range rs {
		k := s.format.Key(r)
		if old, ok := s.records[k]; ok {
			delete(s.records, k)
			removed[k] = old
		}
	}
	if len(removed) == 0 {
		return nil
	}
	if err := s.format.write(s.path, sortedByKey(s.records)); err != nil {
		for k, r := range removed {
			s.records[k] = r
		}
		return err
	}
	return nil
}

// Records lists the recorded records, ordered by key.
func (s *Set[T]) Records() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sortedByKey(s.records)
}
