package meter

import (
	"slices"

	"github.com/gpuarb/gpuarb/ioctlspy"
)

// A process may hold several CUDA contexts (a context per thread, as
// multi-model servers make; a context per GPU), and the GPU schedules each
// context's channel group on its own: a process of four busy contexts
// takes four turns of the round robin to another's one. The meter models
// each context apart (a gpuContext each) and routes a thread's events to
// the context its cuCtxCreate made current on it. A thread that made none
// uses the process's first context: the primary context of the runtime
// API, or the one context of most programs. A thread that switches
// contexts (cuCtxSetCurrent, push and pop) is not followed: its events
// stay with the context it made last.

// ctxKey names one modeled context: its process and its CUDA context
// handle (0 for the process's first).
type ctxKey struct {
	pid uint32
	ctx uint64
}

// process is what the meter keeps of one process beyond its contexts:
// which context each of its threads made current, and its contexts in
// the order they appeared.
type process struct {
	// threads maps a thread to the context its cuCtxCreate made current
	// on it (at most maxThreadsTracked; the rest use the first).
	threads map[uint32]uint64
	// made is the first context made by cuCtxCreate (0: none): threads
	// that made none use it.
	made uint64
	// groupAt is, per thread, when it allocated a channel group that no
	// context has taken yet: a cuCtxCreate allocates its context's group
	// before it returns and reports the context.
	groupAt map[uint32]uint64
	ctxs    []*gpuContext
	exited  bool
}

// maxThreadsTracked bounds the threads a process's routing keeps: their
// ids come from the process, which may make threads without end.
const maxThreadsTracked = 1024

// contextOf returns the handle of the context a thread's events go to.
func (p *process) contextOf(tid uint32) uint64 {
	if ctx, ok := p.threads[tid]; ok {
		return ctx
	}
	return p.made
}

// processOf returns the routing of a process, a fresh one when its pid
// has not been seen or belonged to a process that exited.
func (m *Meter) processOf(pid uint32) *process {
	p := m.procs[pid]
	if p == nil || p.exited {
		p = &process{threads: map[uint32]uint64{}, groupAt: map[uint32]uint64{}}
		m.procs[pid] = p
	}
	return p
}

// contextsOf returns the live contexts of a process.
func (m *Meter) contextsOf(pid uint32) []*gpuContext {
	p := m.procs[pid]
	if p == nil || p.exited {
		return nil
	}
	return p.ctxs
}

// contextMade routes the thread that made a context (cuCtxCreate, which
// makes it current there) to it and puts the context on its GPU.
func (m *Meter) contextMade(h *ioctlspy.Header, e *ioctlspy.ContextCreated) {
	p := m.processOf(h.PID)
	if e.Func != "cuDevicePrimaryCtxRetain" && e.Ctx != 0 {
		if p.made == 0 {
			p.made = e.Ctx
		}
		if _, ok := p.threads[h.TID]; ok || len(p.threads) < maxThreadsTracked {
			p.threads[h.TID] = e.Ctx
		}
	}
	m.moveGPU(m.context(h), int(e.Device))
}

// groupAllocated places the context a thread uses on the runlist by the
// channel group it allocated. A group allocated before its context is
// known (inside the cuCtxCreate that reports it on return) is kept for
// the next context the thread makes.
func (m *Meter) groupAllocated(h *ioctlspy.Header) {
	p := m.processOf(h.PID)
	if c := m.ctxs[ctxKey{h.PID, p.contextOf(h.TID)}]; c != nil && !c.exited && c.tsgAt == 0 {
		m.placeOnRunlist(c, h.Start)
		return
	}
	if _, ok := p.groupAt[h.TID]; ok || len(p.groupAt) < maxThreadsTracked {
		p.groupAt[h.TID] = h.Start
	}
}

// forgetContext drops a pruned context from its process, and the process
// once it has exited and has none left.
func (m *Meter) forgetContext(c *gpuContext) {
	p := m.procs[c.pid]
	if p == nil {
		return
	}
	p.ctxs = slices.DeleteFunc(p.ctxs, func(o *gpuContext) bool { return o == c })
	if p.exited && len(p.ctxs) == 0 {
		delete(m.procs, c.pid)
	}
}

// processExited marks a process ended: its pid names a new process from
// its next event. One with no context left is forgotten at once.
func (m *Meter) processExited(pid uint32) {
	p := m.procs[pid]
	if p == nil {
		return
	}
	p.exited = true
	if len(p.ctxs) == 0 {
		delete(m.procs, pid)
	}
}
