package meter

import (
	"slices"
	"time"

	"github.com/gpuarb/gpuarb/ioctlspy"
)

// A process may hold several CUDA contexts (a context per thread, as
// multi-model servers make; a context per GPU), and the GPU schedules each
// context's channel group on its own: a process of four busy contexts
// takes four turns of the round robin to another's one. The meter models
// each context apart (a gpuContext each) and routes a thread's events to
// the context its cuCtxCreate made current on it. A thread that made none
// uses the process's first context: the primary context of the runtime
// API, or the one context of most programs. A thread that retains the
// primary context of another GPU than the process's first primary (the
// runtime API's cudaSetDevice: a thread per GPU) is routed to that one.
// A thread that switches contexts (cuCtxSetCurrent, push and pop) is not
// followed: its events stay with the context it made or retained last.

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
	// primary is the first primary context the process retained (0:
	// none), the one threads that retained no other use.
	primary uint64
	// setup is, per thread, the channel group setup it did that no
	// context has taken yet (setup).
	setup  map[uint32]setup
	ctxs   []*gpuContext
	exited bool
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
		p = &process{threads: map[uint32]uint64{}, setup: map[uint32]setup{}}
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

// contextsOn returns a process's contexts on one GPU: what the GPU's
// scheduler does to the process's channel groups there reaches those
// alone.
func (m *Meter) contextsOn(pid uint32, gpu int) []*gpuContext {
	var on []*gpuContext
	for _, c := range m.contextsOf(pid) {
		if c.gpu == gpu {
			on = append(on, c)
		}
	}
	return on
}

// setup is what a thread did to set up a channel group: allocated it
// (at, 0: not seen) and set its timeslice (0: not set). A cuCtxCreate
// does both before it returns and reports the context they belong to, so
// the setup waits for the thread's next event: the report of the context
// made by the call it came from, or anything else, which gives it to the
// context the thread uses.
type setup struct {
	at, first uint64 // its group's allocation; the earliest of its parts
	slice     time.Duration
	gpu       *uint32 // its group's GPU (device id), where the spy named it
}

// contextMade routes the thread that made a context (cuCtxCreate, which
// makes it current there) to it and puts the context on the GPU its call
// named, unless its channel group placed it: the call names a CUDA
// ordinal, which numbers only the GPUs the process was given
// (CUDA_VISIBLE_DEVICES, a container's devices), the group the driver's
// device id that steering, memory and every other tenant use.
func (m *Meter) contextMade(h *ioctlspy.Header, e *ioctlspy.ContextCreated) {
	m.route(h, e)
	if c := m.context(h); !c.groupGPU {
		m.moveGPU(c, int(e.Device))
	}
}

// route sends the thread that made a context by cuCtxCreate to it, and
// one that retained a primary context other than the process's first to
// that one.
func (m *Meter) route(h *ioctlspy.Header, e *ioctlspy.ContextCreated) {
	if e.Ctx == 0 {
		return
	}
	p := m.processOf(h.PID)
	if e.Func == "cuDevicePrimaryCtxRetain" {
		switch {
		case p.primary == 0 || p.primary == e.Ctx:
			// The process's first primary context: its threads that made
			// none use it already (or go back to it).
			p.primary = e.Ctx
			if _, ok := p.threads[h.TID]; ok && p.made == 0 {
				delete(p.threads, h.TID)
			}
			return
		}
		// Another GPU's primary context: the thread's own from now on.
		if _, ok := p.threads[h.TID]; ok || len(p.threads) < maxThreadsTracked {
			p.threads[h.TID] = e.Ctx
		}
		return
	}
	if p.made == 0 {
		p.made = e.Ctx
	}
	if _, ok := p.threads[h.TID]; ok || len(p.threads) < maxThreadsTracked {
		p.threads[h.TID] = e.Ctx
	}
}

// noteSetup keeps a thread's channel group allocation (at > 0, on gpu
// where known) or timeslice (slice > 0) for the context it belongs to
// (setup).
func (m *Meter) noteSetup(h *ioctlspy.Header, part setup) {
	p := m.processOf(h.PID)
	st, ok := p.setup[h.TID]
	if !ok && len(p.setup) >= maxThreadsTracked {
		m.applySetup(m.context(h), part)
		return
	}
	if !ok {
		st.first = h.Start
	}
	if part.at > 0 {
		st.at = part.at
	}
	if part.gpu != nil {
		st.gpu = part.gpu
	}
	if part.slice > 0 {
		st.slice = part.slice
	}
	p.setup[h.TID] = st
}

// settleSetup gives a thread's pending setup to the context it belongs
// to, before the thread's next event ev of a context is applied (the
// driver calls of a setup in progress do not settle it): the context ev
// reports made, if the call ev reports began before the setup, else the
// context the thread uses now.
func (m *Meter) settleSetup(h *ioctlspy.Header, ev ioctlspy.Event) {
	p := m.procs[h.PID]
	if p == nil || p.exited || len(p.setup) == 0 || !ofAContext(ev) {
		return
	}
	st, ok := p.setup[h.TID]
	if !ok {
		return
	}
	if e, made := ev.(*ioctlspy.ContextCreated); made && e.Ret == 0 && h.Start <= st.first {
		m.route(h, e)
	}
	delete(p.setup, h.TID)
	m.applySetup(m.context(h), st)
}

// ofAContext tells whether an event is work or a call of a CUDA context
// (the calls the meter attributes to one), not a driver call.
func ofAContext(ev ioctlspy.Event) bool {
	switch ev.(type) {
	case *ioctlspy.Launch, *ioctlspy.GraphLaunch, *ioctlspy.EventRecord, *ioctlspy.StreamCapture,
		*ioctlspy.StreamWaitEvent, *ioctlspy.Submission, *ioctlspy.WaitBegin, *ioctlspy.Sync,
		*ioctlspy.ContextCreated, *ioctlspy.MemAlloc, *ioctlspy.MemFree:
		return true
	}
	return false
}

// applySetup puts c on its group's GPU, places it on that GPU's runlist
// by the group's allocation and sets its timeslice, as the setup says.
func (m *Meter) applySetup(c *gpuContext, st setup) {
	if st.gpu != nil {
		m.moveGPU(c, int(*st.gpu))
		c.groupGPU = true
	}
	if st.at > 0 {
		m.placeOnRunlist(c, st.at)
	}
	if st.slice > 0 {
		c.timeslice = st.slice
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
