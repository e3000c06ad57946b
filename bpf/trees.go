package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Follow has the probes follow a pid tenant's processes: root and pids
// (what /proc shows below it now) and, from here on, every process forked
// below one of them, wherever a double fork reparents it. A process
// already followed for another root stays with that one; one that exits
// leaves.
func (p *Probes) Follow(root int, pids []int) error {
	var errs []error
	for _, pid := range pids {
		err := p.objs.GpuarbTrees.Update(uint32(pid), uint32(root), ebpf.UpdateNoExist)
		if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			errs = append(errs, fmt.Errorf("follow pid %d for %d: %w", pid, root, err))
		}
	}
	return errors.Join(errs...)
}

// Followed returns the processes followed for root.
func (p *Probes) Followed(root int) ([]int, error) {
	var pid, r uint32
	var out []int
	it := p.objs.GpuarbTrees.Iterate()
	for it.Next(&pid, &r) {
		if r == uint32(root) {
			out = append(out, int(pid))
		}
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("followed processes of %d: %w", root, err)
	}
	return out, nil
}

// Unfollow stops following root's processes (its tenant is gone).
func (p *Probes) Unfollow(root int) error {
	pids, err := p.Followed(root)
	for _, pid := range pids {
		if e := p.objs.GpuarbTrees.Delete(uint32(pid)); e != nil && !errors.Is(e, ebpf.ErrKeyNotExist) {
			err = errors.Join(err, fmt.Errorf("unfollow pid %d: %w", pid, e))
		}
	}
	return err
}

// UnfollowedForks counts the processes forked below a followed one that
// the probes could not follow since they were loaded: their table was
// full.
func (p *Probes) UnfollowedForks() (uint64, error) {
	var n uint64
	if err := p.objs.GpuarbUnfollowed.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("read unfollowed forks: %w", err)
	}
	return n, nil
}
