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

// Drop stops following the processes pids (gone before they were
// followed: their pids may name other processes next).
func (p *Probes) Drop(pids []int) error {
	var errs []error
	for _, pid := range pids {
		if err := p.objs.GpuarbTrees.Delete(uint32(pid)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("unfollow pid %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// treeBatch is how many followed processes one read of the table takes:
// a hash map's batch read fails (ENOSPC) only where one bucket holds more.
const treeBatch = 4096

// Trees returns every followed process by the root it is followed for, in
// as few reads of the table as it takes batches of treeBatch (a pid
// tenant's tree is read at every control step, during a fork storm too;
// one read per process cost the daemon half a core here). Kernels without
// batch reads are read one process at a time.
func (p *Probes) Trees() (map[int][]int, error) {
	out := map[int][]int{}
	keys, roots := make([]uint32, treeBatch), make([]uint32, treeBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := p.objs.GpuarbTrees.BatchLookup(&cursor, keys, roots, nil)
		for i := range n {
			out[int(roots[i])] = append(out[int(roots[i])], int(keys[i]))
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return out, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			return p.treesOneByOne()
		case err != nil:
			return out, fmt.Errorf("read followed processes: %w", err)
		}
	}
}

// treesOneByOne is Trees where the kernel has no batch reads.
func (p *Probes) treesOneByOne() (map[int][]int, error) {
	out := map[int][]int{}
	var pid, root uint32
	it := p.objs.GpuarbTrees.Iterate()
	for it.Next(&pid, &root) {
		out[int(root)] = append(out[int(root)], int(pid))
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("read followed processes: %w", err)
	}
	return out, nil
}

// Unfollow stops following root's processes (its tenant is gone).
func (p *Probes) Unfollow(root int) error {
	trees, err := p.Trees()
	return errors.Join(err, p.Drop(trees[root]))
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
