package meter

import (
	"io"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/nvrm"
)

// Config configures a Meter.
type Config struct {
	// Window is the sliding window of Share and the rates (default 1s).
	Window time.Duration
	// HalfLife is the decay of the long-run share (default 30s).
	HalfLife time.Duration
	// Timeslice is the GPUs' default channel-group timeslice the replay
	// uses (default 1024µs, as Volta and later); SetScheduling sets it per
	// GPU, a context's own SET_TIMESLICE and a TimesliceSet per context.
	Timeslice time.Duration
	// Lag keeps the replay this far behind the clock so that events still
	// in the ring buffer land before their time is settled (the daemon
	// uses 20ms; default 0).
	Lag time.Duration
	// Now returns CLOCK_MONOTONIC ns, the probes' clock (tests inject one).
	Now func() uint64 `json:"-"`
	// Record, when set, receives every input the meter takes, one JSON
	// object a line, for Play to feed to another meter (a recording: see
	// record.go). Lines are buffered and written out at every Tick and by
	// FlushRecording.
	Record io.Writer `json:"-"`
	// Proofs, when set, is handed every proof that teaches a context its
	// costs (Proof), under the meter's lock: it must not call the meter.
	Proofs func(Proof) `json:"-"`
}

// MonotonicNow reads CLOCK_MONOTONIC, the clock of the probes' timestamps.
func MonotonicNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// Meter estimates GPU time per tenant from the event stream. Observe is
// called by one reader; the rest may run concurrently with it.
type Meter struct {
	cfg Config
	rec *recorder // nil unless Config.Record is set

	mu       sync.Mutex
	ctxs     map[ctxKey]*gpuContext
	procs    map[uint32]*process // by pid: its contexts and their threads (process.go)
	gpus     map[int]*replay
	longRun  map[TenantKey]float64
	lastTick uint64
	frozen   map[uint64][]span // per cgroup: when the arbiter froze it
	// submitted is the work and the launches seen per cgroup, cumulative
	// (Submitted).
	submitted map[uint64]Submitted
	sched     func(gpu int) (time.Duration, bool)
	// preexisting are processes that ran before the meter could see them
	// (SetPreexisting), until their context appears.
	preexisting map[uint32]bool
	// unprobed counts the contexts ProcessUnprobed made (Paused looks for
	// them only when there are any).
	unprobed int
	// folded counts launches and event records that a context's bounds
	// sent to its overflow stream or cost (Folded).
	folded uint64
	// releasing are the contexts whose held launches wait for a release
	// ahead of the replay (gpuContext.releaseAt).
	releasing []*gpuContext
}

// Folded returns how many launches and event records went to a context's
// overflow stream or cost because it passed maxStreams streams or
// maxCostKeys kernels and graphs, since the meter started: what a process
// that passes ever new handles costs the daemon is bounded, not its
// metering (the work is still charged).
func (m *Meter) Folded() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.folded
}

// SetPreexisting names the processes that ran before the probes could
// see them (a daemon started beside running GPU jobs): work they queued
// then is unseen, so the first sync of each of their streams, which may
// wait for it, proves nothing of their costs.
func (m *Meter) SetPreexisting(pids []uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rec.put(recordLine{Op: opPreexisting, PIDs: pids})
	m.preexisting = make(map[uint32]bool, len(pids))
	for _, p := range pids {
		m.preexisting[p] = true
	}
}

// RestoreBacklog gives context ctx of process pid the work a daemon before
// this one modeled queued there and that has not run since (ns): a
// context that queued seconds of work before the restart runs it with
// nothing launched since, and read as idle it would be neither metered
// nor held. The work runs in the replay at the context's turns, on a
// stream of its own, until it has run or a sync proves it done; that
// sync teaches nothing (the work was unseen). A context the meter does
// not know (no ContextCreated replayed for it) takes none; it returns
// whether the context took the work.
func (m *Meter) RestoreBacklog(pid uint32, ctx uint64, ns float64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	m.rec.put(recordLine{Op: opBacklog, Now: now, PID: pid, Ctx: ctx, NS: int64(ns)})
	c := m.ctxs[ctxKey{pid, ctx}]
	if c == nil || c.exited || c.unprobed || ns <= 0 {
		return false
	}
	m.at(c, m.horizon(now))
	s := m.streamOf(c, restoredStream)
	if s.left <= 0 {
		s.got = 0
	}
	s.left += ns
	s.enq += ns
	s.comp[restoredKey] += ns
	s.launched, s.unseen = true, true
	if len(s.bounds) == maxBounds {
		s.bounds = s.bounds[1:]
	}
	s.bounds = append(s.bounds, s.enq)
	return true
}

// New returns a Meter.
func New(cfg Config) *Meter {
	if cfg.Window <= 0 {
		cfg.Window = time.Second
	}
	if cfg.HalfLife <= 0 {
		cfg.HalfLife = 30 * time.Second
	}
	if cfg.Timeslice <= 0 {
		cfg.Timeslice = 1024 * time.Microsecond
	}
	if cfg.Now == nil {
		cfg.Now = MonotonicNow
	}
	return &Meter{cfg: cfg, rec: newRecorder(cfg), ctxs: map[ctxKey]*gpuContext{}, procs: map[uint32]*process{}, gpus: map[int]*replay{},
		longRun: map[TenantKey]float64{}, frozen: map[uint64][]span{}, submitted: map[uint64]Submitted{}}
}

func (m *Meter) replayOf(gpu int) *replay {
	r := m.gpus[gpu]
	if r == nil {
		r = &replay{}
		r.slice, r.preemptive = m.scheduling(gpu)
		m.gpus[gpu] = r
	}
	return r
}

// scheduling is what the meter knows of a GPU's scheduler.
func (m *Meter) scheduling(gpu int) (slice uint64, preemptive bool) {
	if m.sched != nil {
		ts, pre := m.sched(gpu)
		m.rec.put(recordLine{Op: opScheduling, GPU: gpu, NS: int64(ts), On: pre})
		if ts > 0 {
			return uint64(ts), pre
		}
	}
	return uint64(m.cfg.Timeslice), true
}

// SetScheduling tells the meter each GPU's timeslice and whether it
// preempts running kernels (the policy's GPU entries); the replay models
// them from now on.
func (m *Meter) SetScheduling(sched func(gpu int) (timeslice time.Duration, preemptive bool)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sched = sched
	for gpu, r := range m.gpus {
		r.slice, r.preemptive = m.scheduling(gpu)
	}
}

func (m *Meter) context(h *ioctlspy.Header) *gpuContext {
	p := m.processOf(h.PID)
	k := ctxKey{h.PID, p.contextOf(h.TID)}
	c := m.ctxs[k]
	if c != nil && c.exited && c.unprobed {
		m.unprobed-- // its pid is another process's now
	}
	if c == nil || c.exited {
		c = &gpuContext{pid: h.PID, ctx: k.ctx, capturedEvents: map[uint64]uint64{}, costs: map[costKey]*cost{}, shape: map[costKey]*keyShape{},
			since: h.Start, unseenBefore: m.preexisting[h.PID]}
		if len(p.ctxs) == 0 {
			delete(m.preexisting, h.PID)
		}
		m.ctxs[k] = c
		p.ctxs = append(p.ctxs, c)
		m.replayOf(0).join(c)
	}
	if c.cgroup != h.CgroupID { // processes move between cgroups
		c.cgroup = h.CgroupID
		c.total = Totals{}
	}
	return c
}

// placeOnRunlist puts a context where its first channel group's
// allocation (at t) puts it on the GPU's runlist: the GPU runs its groups
// in the order they were allocated, which need not be the order their
// processes' first events came in (processes started together may enter
// cuCtxCreate in one order and allocate their groups in another): placed
// by their first events, a context's syncs find its work not begun at
// every other turn and its kernels are learned far below their cost.
func (m *Meter) placeOnRunlist(c *gpuContext, t uint64) {
	if c.tsgAt != 0 {
		return
	}
	c.tsgAt = t
	r := m.replayOf(c.gpu)
	r.remove(c)
	r.join(c)
}

// moveGPU puts a context on another GPU's runlist.
func (m *Meter) moveGPU(c *gpuContext, gpu int) {
	if c.gpu == gpu {
		return
	}
	old := m.replayOf(c.gpu)
	old.remove(c)
	c.gpu = gpu
	c.total = Totals{}
	// What it held and waited for was on the other GPU, by that GPU's
	// replay clock: counted here too it would read as more than all of
	// this GPU (FuzzEventStream).
	c.held, c.waited = nil, nil
	m.replayOf(gpu).join(c)
}

// settle advances every GPU's replay to t.
func (m *Meter) settle(t uint64) {
	m.releaseUntil(t)
	for _, r := range m.gpus {
		if r.t == 0 {
			r.t = t
		}
		r.advance(t)
	}
}

// at clamps an event time to the replay's present: events that arrive
// late are applied now.
func (m *Meter) at(c *gpuContext, t uint64) uint64 {
	r := m.replayOf(c.gpu)
	if r.t == 0 {
		r.t = t
	}
	if t > r.t {
		m.settle(t)
	}
	return max(t, r.t)
}

// unlearnedCharge is the most a launch of a kernel whose cost is not
// learned yet counts towards Submitted (gpuContext.unlearnedCharge).
const unlearnedCharge = float64(20 * time.Millisecond)

func (m *Meter) enqueue(c *gpuContext, l heldLaunch, t uint64) *stream {
	m.at(c, t)
	work := c.work(l.key, l.units)
	s := m.streamOf(c, l.stream)
	if s.left <= 0 {
		s.got = 0
	}
	s.left += work
	s.enq += work
	s.comp[l.key] += work
	s.launched = true
	if len(s.bounds) == maxBounds {
		s.bounds = s.bounds[1:]
	}
	s.bounds = append(s.bounds, s.enq)
	if !c.costOf(l.key).learned {
		// Costs not learned yet are guesses meant to read as backlogged;
		// charged whole they would freeze a paced tenant for seconds.
		work = min(work, c.unlearnedCharge())
	}
	c.noteLaunch(l.key, l.units)
	m.noteSubmitted(c.cgroup, work)
	c.launches = append(c.launches, t)
	c.total.Launches++
	return s
}

// streamOf is c's stream h, counting work its bound folds into the
// overflow stream.
func (m *Meter) streamOf(c *gpuContext, h uint64) *stream {
	s, folded := c.stream(h)
	if folded {
		m.folded++
	}
	return s
}

// launch enqueues a launch, or keeps it until its process is released when
// the launch gate held it there.
func (m *Meter) launch(c *gpuContext, h *ioctlspy.Header, l heldLaunch) {
	var folded bool
	if l.key, folded = c.keyFor(l.key); folded {
		m.folded++
	}
	if h.Held {
		l.heldAt = h.Start
	}
	switch {
	case !h.Held:
		m.enqueue(c, l, h.Start)
	case c.releasedAt > h.Start && len(c.deferred) > 0 && c.releaseAt == 0:
		// The release was reported before the event, and a later hold's
		// launches wait: this one ran at the release.
		m.enqueue(c, l, c.releasedAt)
	case c.releasedAt > h.Start: // the release was reported before the event
		c.deferred = append(c.deferred, l)
		m.launchReleased(c, c.releasedAt)
	default:
		c.deferred = append(c.deferred, l)
	}
}

// resumed notes that a process the launch gate held runs again, seen by
// an event of it that was not held and ended after the hold (another
// thread's event that ended before it, delivered after it, proves
// nothing; one that began after it may have begun as the stop spread to
// its thread, so the process ran by its end, not its start): released by
// the arbiter, its HoldReleased still to come, or by someone else (a
// sibling's SIGCONT) at an unknown time since the hold.
// The held launches run from the event in the replay, maybe later than
// they did; the whole process was stopped, so syncs across the span in
// any of its contexts, and those that wait for the launches (enqueued at
// its end), teach nothing.
func (m *Meter) resumed(h *ioctlspy.Header) {
	ps := m.contextsOf(h.PID)
	var heldAt uint64
	held := false
	for _, c := range ps {
		if len(c.deferred) > 0 && (!held || c.deferred[0].heldAt < heldAt) {
			heldAt, held = c.deferred[0].heldAt, true
		}
	}
	if !held || h.End <= heldAt {
		return
	}
	at := h.End // its thread ran then: its call may have begun as the stop spread to it
	for _, c := range ps {
		c.stopped = appendSpan(c.stopped, heldAt, at+1)
		if len(c.deferred) > 0 {
			m.launchDeferred(c, at)
		}
	}
}

// launchDeferred enqueues at t the launches held for the process before
// t; those held since belong to a later hold and wait for its release
// (gpuarb's release is stamped before its continue, and a thread it
// continued may launch, and be held again, before the release is
// reported).
func (m *Meter) launchDeferred(c *gpuContext, t uint64) {
	c.releaseAt = 0
	kept := c.deferred[:0]
	for _, l := range c.deferred {
		if l.heldAt >= t {
			kept = append(kept, l)
			continue
		}
		m.enqueue(c, l, t).released = true
	}
	c.deferred = kept
}

// launchReleased enqueues the held launches at t, the release the arbiter
// reported. A release is reported at the clock's present, ahead of events
// of other processes still in the ring buffer (read every few
// milliseconds): settling the replay up to it would run the GPU without
// them, and apply them late. A release ahead of the replay waits until
// the replay reaches it (releaseUntil).
func (m *Meter) launchReleased(c *gpuContext, t uint64) {
	if r := m.replayOf(c.gpu); r.t != 0 && t > r.t {
		if c.releaseAt == 0 {
			m.releasing = append(m.releasing, c)
		}
		c.releaseAt = t
		return
	}
	m.launchDeferred(c, t)
}

// releaseUntil enqueues, in time order, the held launches of releases due
// by t, each with the replay settled to its time first.
func (m *Meter) releaseUntil(t uint64) {
	for {
		next := -1
		for i, c := range m.releasing {
			if c.releaseAt != 0 && c.releaseAt <= t && (next < 0 || c.releaseAt < m.releasing[next].releaseAt) {
				next = i
			}
		}
		if next < 0 {
			break
		}
		c := m.releasing[next]
		m.releasing = slices.Delete(m.releasing, next, next+1)
		at := c.releaseAt
		c.releaseAt = 0
		for _, r := range m.gpus {
			if r.t != 0 && r.t < at {
				r.advance(at)
			}
		}
		m.launchDeferred(c, at)
	}
	m.releasing = slices.DeleteFunc(m.releasing, func(c *gpuContext) bool { return c.releaseAt == 0 })
}

// freezeUnprobed stops or resumes, in the replay, the unprobed contexts of
// a cgroup frozen from `from` (to is math.MaxUint64 while it lasts).
func (m *Meter) freezeUnprobed(cgroupID, from, to uint64) {
	for _, c := range m.ctxs {
		if !c.unprobed || c.exited || c.cgroup != cgroupID {
			continue
		}
		if to == math.MaxUint64 {
			m.at(c, from)
			c.frozenNow = true
		} else {
			m.at(c, to)
			c.frozenNow = false
		}
	}
}

// pausedDuring reports whether the context's process was stopped by the
// arbiter (its cgroup frozen, the process held at the launch gate) during
// [from, to): a sync across the stop returns when the process resumes,
// not when the GPU completed. A paused channel group is not a stop: its
// threads run and wake at the completion, and the replay keeps the group
// off the GPU as the GPU does (to a slice), so a sync across it proves as
// any other — a tenant paused part of every period (its syncs all span a
// pause) otherwise never learned its costs, kept the first guess (20 ms
// for 1–2 ms kernels) and took the others' time in the replay.
func (m *Meter) pausedDuring(c *gpuContext, from, to uint64) bool {
	for _, list := range [][]span{c.stopped, m.frozen[c.cgroup]} {
		for _, p := range list {
			if p.start < to && p.end > from {
				return true
			}
		}
	}
	return false
}

// nouveauStream keys a context's kernel-submitted work apart from streams.
const nouveauStream = ^uint64(0)

// submissionKey costs the submissions of the kernel path, which name no
// kernel.
var submissionKey = costKey{handle: ^uint64(0)}

// Observe feeds one input to the meter: an event the probes saw, or an
// actuator's effect on the GPU's schedule (TimesliceSet, GroupPaused,
// GroupDescheduled, HoldReleased, CgroupFrozen).
func (m *Meter) Observe(ev ioctlspy.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rec.observe(ev)
	if m.observeEffect(ev) {
		return
	}
	h := ev.Hdr()
	m.releaseUntil(h.Start) // releases due before the event come first
	if !h.Held {
		m.resumed(h)
	}
	m.settleSetup(h, ev)
	switch e := ev.(type) {
	case *ioctlspy.Launch:
		if c := m.context(h); !c.capturing(e.Stream) {
			m.launch(c, h, heldLaunch{stream: e.Stream, key: costKey{handle: e.Function}, units: float64(max(e.Blocks(), 1))})
		} else {
			m.noteSubmitted(c.cgroup, 0)
		}
	case *ioctlspy.GraphLaunch:
		if c := m.context(h); !c.capturing(e.Stream) {
			m.launch(c, h, heldLaunch{stream: e.Stream, key: costKey{graph: true, handle: e.Exec}, units: 1})
		} else {
			m.noteSubmitted(c.cgroup, 0)
		}
	case *ioctlspy.EventRecord:
		c := m.context(h)
		m.at(c, h.Start)
		if !c.recordCaptured(e.Stream, e.Event) {
			m.record(m.streamOf(c, e.Stream), e.Event)
		}
	case *ioctlspy.StreamCapture:
		m.capture(m.context(h), e)
	case *ioctlspy.StreamWaitEvent:
		m.context(h).joinCapture(e.Stream, e.Event)
	case *ioctlspy.Submission:
		// A submission ioctl went through before its process was held:
		// it is never deferred.
		m.enqueue(m.context(h), heldLaunch{stream: nouveauStream, key: submissionKey, units: 1}, h.Start)
	case *ioctlspy.WaitBegin:
		m.waitBegan(h, e)
	case *ioctlspy.Sync:
		if e.Ret == 0 {
			m.sync(h, e)
		}
	case *ioctlspy.TSGControl:
		// The process's own scheduling call (libcuda sets its groups'
		// timeslices): the replay follows it.
		if e.CtrlCmd == nvrm.CtrlTSGSetTimeslice && e.TimesliceUS > 0 && e.Status == nvrm.StatusOK {
			m.noteSetup(h, setup{slice: time.Duration(e.TimesliceUS) * time.Microsecond})
		}
	case *ioctlspy.TSGAllocated:
		// The context takes its place on the runlist with its channel
		// group, as on the GPU.
		if e.Made() {
			m.noteSetup(h, setup{at: h.Start, gpu: e.GPU})
		}
	case *ioctlspy.ContextCreated:
		if e.Ret == 0 {
			m.contextMade(h, e)
		}
	case *ioctlspy.ProcessExit:
		for _, c := range m.contextsOf(h.PID) {
			if !c.exited {
				m.exit(c, h.End)
			}
		}
		m.processExited(h.PID)
	}
}

// exit ends a process at t: the driver drops a dead process's work.
func (m *Meter) exit(c *gpuContext, t uint64) {
	m.at(c, t)
	c.streams, c.turn = nil, nil
	c.deferred = nil
	c.waits = nil
	c.exited = true
}

// Reconcile ends, now, the processes the meter still models that alive
// says are gone: their exit was never observed (the ring buffer was full
// and the event lost). Without it their queued work would run on in the
// replay and their state would never be pruned. It returns how many it
// ended.
func (m *Meter) Reconcile(alive func(pid uint32) bool) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	clock := m.cfg.Now()
	now := m.horizon(clock)
	var ended []uint32
	for pid, p := range m.procs {
		if p.exited || alive(pid) {
			continue
		}
		for _, c := range p.ctxs {
			if !c.exited {
				m.exit(c, now)
			}
		}
		m.processExited(pid)
		ended = append(ended, pid)
	}
	slices.Sort(ended)
	m.rec.put(recordLine{Op: opReconcile, Now: clock, PIDs: ended})
	return len(ended)
}

// Submitted is what the processes of a cgroup launched, cumulative while
// the cgroup has a context: the GPU ns, each launch as costed when it was
// enqueued (a cost not learned yet at most unlearnedCharge), and the
// launches seen — enqueued, or captured into a graph (which runs nothing).
type Submitted struct {
	NS       float64
	Launches uint64
}

func (m *Meter) noteSubmitted(cgroup uint64, ns float64) {
	s := m.submitted[cgroup]
	s.NS += ns
	s.Launches++
	m.submitted[cgroup] = s
}

// SubmittedBy sums what the processes of the given cgroups launched
// (Submitted).
func (m *Meter) SubmittedBy(cgroups []uint64) Submitted {
	m.mu.Lock()
	defer m.mu.Unlock()
	var sum Submitted
	for _, id := range cgroups {
		sum.NS += m.submitted[id].NS
		sum.Launches += m.submitted[id].Launches
	}
	return sum
}

// horizon is the latest time the replay settles at the clock reading
// now: now less the lag.
func (m *Meter) horizon(now uint64) uint64 {
	if lag := uint64(m.cfg.Lag); now > lag {
		return now - lag
	}
	return now
}

// Tick settles the replay, advances the long-run shares and forgets what
// fell out of the window. The daemon calls it every control period.
func (m *Meter) Tick() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clock := m.cfg.Now()
	m.rec.put(recordLine{Op: opTick, Now: clock})
	defer m.rec.flush()
	now := m.horizon(clock)
	m.settle(now)
	if m.lastTick != 0 && now > m.lastTick {
		dt := now - m.lastTick
		perTenant := map[TenantKey]float64{}
		for _, c := range m.ctxs {
			perTenant[TenantKey{c.cgroup, c.gpu}] += sumIn(c.held, m.lastTick, now) / float64(dt)
		}
		decay := math.Exp2(-float64(dt) / float64(m.cfg.HalfLife))
		for k, v := range m.longRun {
			m.longRun[k] = v * decay
		}
		for k, s := range perTenant {
			m.longRun[k] += s * (1 - decay)
		}
		for k, v := range m.longRun {
			if v < 1e-6 {
				delete(m.longRun, k)
			}
		}
	}
	m.lastTick = now
	m.prune(now)
}

// prune drops spans and samples older than the window and contexts of
// exited processes with nothing left in it.
func (m *Meter) prune(now uint64) {
	w := uint64(m.cfg.Window)
	if now < w {
		return
	}
	cut := now - w
	for cg, ps := range m.frozen {
		if ps = dropSpans(ps, cut); len(ps) == 0 {
			delete(m.frozen, cg)
		} else {
			m.frozen[cg] = ps
		}
	}
	for k, c := range m.ctxs {
		c.held = dropSpans(c.held, cut)
		c.stopped = dropSpans(c.stopped, cut)
		c.waited = dropSpans(c.waited, cut)
		c.waitedFor = dropSpans(c.waitedFor, cut)
		c.pausedFor = dropSpans(c.pausedFor, cut)
		c.launches = dropBefore(c.launches, cut)
		c.drains = dropBefore(c.drains, cut)
		c.syncs = dropSpans(c.syncs, cut)
		if c.exited && len(c.held) == 0 && len(c.launches) == 0 && len(c.syncs) == 0 {
			if c.unprobed {
				m.unprobed--
			}
			delete(m.ctxs, k)
			m.replayOf(c.gpu).remove(c)
			m.forgetContext(c)
		}
	}
	live := map[uint64]bool{}
	for _, c := range m.ctxs {
		live[c.cgroup] = true
	}
	for cg := range m.submitted {
		if !live[cg] {
			delete(m.submitted, cg)
		}
	}
}

func dropBefore(ts []uint64, cut uint64) []uint64 {
	i := sort.Search(len(ts), func(i int) bool { return ts[i] >= cut })
	return ts[i:]
}
