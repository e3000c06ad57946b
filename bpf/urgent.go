package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// SetUrgent makes pids, and every process in cgroups or below them, the
// processes whose every record wakes the event reader at once, instead of
// at its next poll (PollInterval) or once a backlog builds: the latency
// tenants' processes on a GPU whose scheduler the daemon steers, whose
// launches it acts on within microseconds. The cgroups are the latency
// tenants' own: a process of theirs the daemon has not seen yet is urgent
// from its first launch.
func (p *Probes) SetUrgent(pids []uint32, cgroups []uint64) error {
	p.urgentMu.Lock()
	defer p.urgentMu.Unlock()
	errs := []error{
		setMembers(p.objs.GpuarbUrgent, p.urgent, pids, "urgent process"),
		setMembers(p.objs.GpuarbUrgentCgroups, p.urgentCgroups, cgroups, "urgent cgroup"),
	}
	if err := p.objs.UrgentMembers.Set(uint32(len(p.urgent))); err != nil {
		errs = append(errs, fmt.Errorf("urgent process count: %w", err))
	}
	if err := p.objs.UrgentCgroupMembers.Set(uint32(len(p.urgentCgroups))); err != nil {
		errs = append(errs, fmt.Errorf("urgent cgroup count: %w", err))
	}
	return errors.Join(errs...)
}

// setMembers makes exactly keys the entries of m (value 1), with have the
// keys it holds now, kept in step with what succeeded.
func setMembers[K uint32 | uint64](m *ebpf.Map, have map[K]bool, keys []K, what string) error {
	want := make(map[K]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	var errs []error
	for k := range have {
		if want[k] {
			continue
		}
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("%s %d: remove: %w", what, k, err))
			continue
		}
		delete(have, k)
	}
	for k := range want {
		if have[k] {
			continue
		}
		if err := m.Put(k, uint8(1)); err != nil {
			errs = append(errs, fmt.Errorf("%s %d: add: %w", what, k, err))
			continue
		}
		have[k] = true
	}
	return errors.Join(errs...)
}
