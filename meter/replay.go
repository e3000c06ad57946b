package meter

import (
	"math"
	"slices"
)

// replay is one GPU's round-robin time-slicing, re-enacted on the modeled
// queues: each context holds the GPU for its own timeslice while others
// have work.
type replay struct {
	t        uint64
	holder   *gpuContext
	sliceEnd uint64
	runlist  []*gpuContext
	// The GPU's scheduling: its default timeslice, and whether it preempts
	// a running kernel at the end of one; midKernel is set while the
	// holder of a GPU that does not is inside a kernel.
	slice      uint64
	preemptive bool
	midKernel  bool
}

// sliceOf is a context's timeslice on this GPU.
func (r *replay) sliceOf(c *gpuContext) uint64 {
	if c.timeslice > 0 {
		return uint64(c.timeslice)
	}
	return r.slice
}

// join puts c on the runlist in the order the contexts' channel groups
// were allocated (runlistAt), not the order their events reached the
// meter from different CPUs: the GPU runs its groups in that order, and a
// replay that rotates in another is out of phase with it at every turn.
// Four closed loops beside four hogs, their processes started together,
// read 47% for 41% in an order their events happened to arrive in.
func (r *replay) join(c *gpuContext) {
	i := len(r.runlist)
	for i > 0 && r.runlist[i-1].runlistAt() > c.runlistAt() {
		i--
	}
	r.runlist = slices.Insert(r.runlist, i, c)
}

// next returns the first runnable context after `after` in runlist order.
func (r *replay) next(after *gpuContext) *gpuContext {
	start := 0
	for i, c := range r.runlist {
		if c == after {
			start = i + 1
			break
		}
	}
	for i := range r.runlist {
		if c := r.runlist[(start+i)%len(r.runlist)]; c.runnable() && c != after {
			return c
		}
	}
	if after != nil && after.runnable() {
		return after
	}
	return nil
}

// advance re-enacts the GPU from r.t to `to`.
func (r *replay) advance(to uint64) {
	for r.t < to {
		// A descheduled holder keeps the GPU to the end of its slice, or
		// until its work runs out.
		if h := r.holder; h != nil && h.pauseAt != 0 && (r.t >= h.pauseAt || h.left() <= 0) {
			h.setPaused(true, min(r.t, h.pauseAt))
		}
		if r.holder == nil || !r.holder.runnable() {
			r.holder = r.next(r.holder)
			r.midKernel = false
			if r.holder == nil {
				r.t = to
				return
			}
			r.sliceEnd = r.t + r.sliceOf(r.holder)
		}
		others := r.next(r.holder) != r.holder
		switch {
		case others && r.t >= r.sliceEnd && (r.preemptive || !r.midKernel):
			r.holder = r.next(r.holder)
			r.sliceEnd = r.t + r.sliceOf(r.holder)
			r.midKernel = false
		case !others && r.t >= r.sliceEnd:
			r.sliceEnd = r.t + r.sliceOf(r.holder)
		}
		end := min(to, r.t+uint64(math.Ceil(r.holder.left())))
		boundary := r.t + uint64(math.Ceil(r.holder.toBoundary()))
		switch {
		case others && r.t < r.sliceEnd:
			end = min(end, r.sliceEnd)
		case others && !r.preemptive && r.holder.learned:
			// The slice is over: finish the kernel. A kernel of guessed
			// cost is cut at the slice, or the guess would hold the GPU.
			end = min(end, boundary)
		}
		if !r.preemptive && r.holder.learned {
			end = min(end, boundary)
		}
		if r.holder.pauseAt != 0 {
			end = min(end, r.holder.pauseAt)
		}
		if end <= r.t {
			end = r.t + 1
		}
		if others {
			for _, c := range r.runlist {
				if c != r.holder && c.runnable() {
					c.waited = appendSpan(c.waited, r.t, end)
				}
			}
		}
		r.holder.run(r.t, end-r.t)
		r.midKernel = !r.preemptive && r.holder.learned && end < boundary && r.holder.left() > 0
		r.t = end
	}
}

// outOfPhase reports whether a sync that waited for proven work finds the
// replay's rotation off the GPU's: the replay drained that work more than
// a timeslice (early ns) before the GPU did, or had not begun it. A drain
// early by less is a part of a slice, or the host's latency in waking the
// synchronizing thread (100 µs and more in a VM); the proofs' lateness
// sums those away, and anchoring on them restarted the rotation late, so
// loops of sub-millisecond kernels beside hogs read low.
func (r *replay) outOfPhase(early float64, notBegun bool) bool {
	return notBegun || early > float64(r.slice)
}

// anchor puts the replay's rotation in phase with the GPU's at a proof
// that the GPU ran c's work until now (a sync that waited for it): where
// c has no work left, the GPU has just moved on to the next context with
// work after c, for a whole slice. The replay rotates on its own between
// proofs and drifts from the GPU's phase by up to the others' turns: a
// closed loop that waits for its turn on the GPU but runs at once in the
// replay drains early there, by that wait, and its kernels are learned
// at their cost plus the wait.
func (r *replay) anchor(c *gpuContext) {
	if c.left() > 0 {
		return
	}
	n := r.next(c)
	if n == nil || n == c {
		return
	}
	if h := r.holder; h != nil && h.pauseAt != 0 {
		h.setPaused(true, r.t) // descheduled, its turn is over
	}
	r.holder = n
	r.sliceEnd = r.t + r.sliceOf(n)
	r.midKernel = false
}

func (r *replay) remove(c *gpuContext) {
	for i, x := range r.runlist {
		if x == c {
			r.runlist = append(r.runlist[:i], r.runlist[i+1:]...)
			break
		}
	}
	if r.holder == c {
		r.holder = nil
	}
}
