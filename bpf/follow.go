package bpf

import (
	"errors"
	"fmt"

	"github.com/gpuarb/gpuarb/cgroup"
)

// TreeFollower gives the processes of pid tenants' trees: what the probes
// follow for each root, which is every process forked below a followed
// one, followed at its fork however a double fork reparents it, until its
// exit. /proc's tree below a root is read only while it can add something
// the probes do not follow: from a root's first Trees until a read finds
// no live process they do not follow (what was forked before its root was
// followed), and again once the probes have missed forks (their table was
// full). Otherwise a call costs one read of the probes' table, however
// fast the tenants fork. Without probes, /proc's trees. Not safe for
// concurrent use.
type TreeFollower struct {
	p *Probes
	// walked is, per root whose tree /proc had nothing to add to, the
	// probes' count of unfollowed forks then.
	walked map[int]uint64
}

// NewTreeFollower returns the follower of pid tenants' trees through p
// (nil: /proc alone).
func NewTreeFollower(p *Probes) *TreeFollower {
	return &TreeFollower{p: p, walked: map[int]uint64{}}
}

// Forget drops what the follower knows of root (a tenant detached).
func (f *TreeFollower) Forget(root int) { delete(f.walked, root) }

// Trees returns each root's processes. An error says what could not be
// read or written; the trees returned are the best known.
func (f *TreeFollower) Trees(roots []int) (map[int][]int, error) {
	out := make(map[int][]int, len(roots))
	if len(roots) == 0 {
		return out, nil
	}
	if f.p == nil {
		for _, root := range roots {
			out[root] = cgroup.Descendants(root)
		}
		return out, nil
	}
	var errs []error
	unfollowed, err := f.p.UnfollowedForks()
	errs = append(errs, err)
	walks := map[int][]int{}
	for _, root := range roots {
		if at, walked := f.walked[root]; !walked || unfollowed > at {
			walks[root] = cgroup.Descendants(root)
		}
	}
	// Read after the walks: a process a followed one forked before a walk
	// read it is in the table by now.
	trees, err := f.p.Trees()
	errs = append(errs, err)
	followed := map[int]bool{} // for any root: a process stays with the first
	for _, pids := range trees {
		for _, p := range pids {
			followed[p] = true
		}
	}
	for _, root := range roots {
		out[root] = trees[root]
		walk, ok := walks[root]
		if !ok {
			continue
		}
		var missing []int
		for _, p := range walk {
			if !followed[p] && !cgroup.Gone(p) { // one that ended since the walk left the table
				missing = append(missing, p)
			}
		}
		if len(missing) == 0 {
			f.walked[root] = unfollowed
			continue
		}
		if err := f.p.Follow(root, missing); err != nil {
			errs = append(errs, fmt.Errorf("pid %d: %w", root, err))
		}
		// One that ended before it was followed left its entry behind
		// (the probes drop a process at its exit): its pid may name
		// another process next.
		var gone []int
		for _, p := range missing {
			if cgroup.Gone(p) {
				gone = append(gone, p)
			} else {
				out[root] = append(out[root], p)
			}
		}
		if err := f.p.Drop(gone); err != nil {
			errs = append(errs, fmt.Errorf("pid %d: %w", root, err))
		}
	}
	return out, errors.Join(errs...)
}
