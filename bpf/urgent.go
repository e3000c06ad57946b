package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// SetUrgent makes pids the processes whose every record wakes the event
// reader at once, instead of at its next poll (PollInterval) or once a
// backlog builds: the latency tenants' processes on a GPU whose scheduler
// the daemon steers, whose launches it acts on within microseconds.
func (p *Probes) SetUrgent(pids []uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	want := make(map[uint32]bool, len(pids))
	for _, pid := range pids {
		want[pid] = true
	}
	var errs []error
	for pid := range p.urgent {
		if want[pid] {
			continue
		}
		if err := p.objs.GpuarbUrgent.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("urgent process %d: remove: %w", pid, err))
			continue
		}
		delete(p.urgent, pid)
	}
	for pid := range want {
		if p.urgent[pid] {
			continue
		}
		if err := p.objs.GpuarbUrgent.Put(pid, uint8(1)); err != nil {
			errs = append(errs, fmt.Errorf("urgent process %d: add: %w", pid, err))
			continue
		}
		p.urgent[pid] = true
	}
	if err := p.objs.UrgentMembers.Set(uint32(len(p.urgent))); err != nil {
		errs = append(errs, fmt.Errorf("urgent process count: %w", err))
	}
	return errors.Join(errs...)
}
