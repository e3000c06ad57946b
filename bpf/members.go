package bpf

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
)

// Launch gates and memory limits share one shape: slots the daemon hands
// to tenants, and a member table (gate_key: a process or a cgroup with
// everything below it -> slot) that the probes walk from the current
// process up its cgroup's ancestors. A count of the table's members lets
// the probes skip the walk while it is empty.

// slotTable allocates the slots of one kind and counts the members of
// their table across slots.
type slotTable struct {
	mu      sync.Mutex
	used    []bool
	members int
	// count is the probes' copy of members (gate_members, mem_members).
	count *ebpf.Variable
}

func newSlotTable(slots int, count *ebpf.Variable) slotTable {
	return slotTable{used: make([]bool, slots), count: count}
}

// take hands out a free slot once init(slot) has prepared it; full is
// returned when none is free.
func (t *slotTable) take(full error, init func(slot uint32) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := slices.Index(t.used, false)
	if i < 0 {
		return full
	}
	if err := init(uint32(i)); err != nil {
		return err
	}
	t.used[i] = true
	return nil
}

// give takes a slot back.
func (t *slotTable) give(slot uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.used[slot] = false
}

// add keeps the probes' member count.
func (t *slotTable) add(delta int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.members += delta
	// Best effort: with the count above the truth the probes only look
	// up more; it is never set below it.
	_ = t.count.Set(uint32(max(t.members, 0)))
}

// memberSet is the members of one slot.
type memberSet struct {
	keys    *ebpf.Map // the member table
	table   *slotTable
	slot    uint32
	what    string // "launch gate", "memory limit": what errors name
	members map[gpuarbGateKey]bool
}

func newMemberSet(keys *ebpf.Map, table *slotTable, slot uint32, what string) memberSet {
	return memberSet{keys: keys, table: table, slot: slot, what: what, members: map[gpuarbGateKey]bool{}}
}

// set makes exactly these cgroups (with everything below them) and
// processes the slot's members.
func (s *memberSet) set(cgroups []uint64, pids []int) error {
	want := gateKeys(cgroups, pids)
	var errs []error
	for k := range s.members {
		if !want[k] {
			errs = append(errs, s.remove(k))
		}
	}
	for k := range want {
		if s.members[k] {
			continue
		}
		if err := s.keys.Put(k, s.slot); err != nil {
			errs = append(errs, fmt.Errorf("%s %d: add member %d: %w", s.what, s.slot, k.Id, err))
			continue
		}
		s.members[k] = true
		s.table.add(1)
	}
	return errors.Join(errs...)
}

// gateKeys are the member table's keys of cgroups and processes.
func gateKeys(cgroups []uint64, pids []int) map[gpuarbGateKey]bool {
	keys := map[gpuarbGateKey]bool{}
	for _, id := range cgroups {
		keys[gpuarbGateKey{Id: id, Kind: gateCgroup}] = true
	}
	for _, pid := range pids {
		keys[gpuarbGateKey{Id: uint64(pid), Kind: gateProcess}] = true
	}
	return keys
}

func (s *memberSet) remove(k gpuarbGateKey) error {
	delete(s.members, k)
	s.table.add(-1)
	if err := s.keys.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("%s %d: remove member %d: %w", s.what, s.slot, k.Id, err)
	}
	return nil
}

// clear removes every member; the set is closed after it (closed tells).
func (s *memberSet) clear() error {
	var errs []error
	for k := range s.members {
		errs = append(errs, s.remove(k))
	}
	s.members = nil
	return errors.Join(errs...)
}

// closed tells whether clear has run.
func (s *memberSet) closed() bool { return s.members == nil }

// clearMembers drops the members left in a reused pinned table by an
// earlier daemon: their slots mean nothing to this one.
func clearMembers(m *ebpf.Map) error {
	var (
		k    gpuarbGateKey
		slot uint32
		keys []gpuarbGateKey
	)
	it := m.Iterate()
	for it.Next(&k, &slot) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read members: %w", err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clear members: %w", err)
		}
	}
	return nil
}
