package meter

import (
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/ioctlspy"
)

// Config configures a Meter.
type Config struct {
	// Window is the sliding window of Share and the rates (default 1s).
	Window time.Duration
	// HalfLife is the decay of the long-run share (default 30s).
	HalfLife time.Duration
	// Timeslice is the GPUs' channel-group timeslice the replay uses
	// (default 2ms); SetScheduling sets it per GPU.
	Timeslice time.Duration
	// Lag keeps the replay this far behind the clock so that events still
	// in the ring buffer land before their time is settled (the daemon
	// uses 20ms; default 0).
	Lag time.Duration
	// Now returns CLOCK_MONOTONIC ns, the probes' clock (tests inject one).
	Now func() uint64
}

// MonotonicNow reads CLOCK_MONOTONIC, the clock of the probes' timestamps.
func MonotonicNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// TenantKey names a tenant on one GPU.
type TenantKey struct {
	CgroupID uint64
	GPU      int
}

// TenantStats are one tenant's figures on one GPU.
type TenantStats struct {
	CgroupID     uint64  `json:"cgroup_id"`
	GPU          int     `json:"gpu"`
	Share        float64 `json:"share"`          // estimated fraction of the GPU's time in the window, 0..1
	GPUNS        uint64  `json:"gpu_ns"`         // estimated GPU ns in the window
	LongRunShare float64 `json:"long_run_share"` // exponentially decayed share
	LaunchesPerS float64 `json:"launches_per_s"`
	SyncsPerS    float64 `json:"syncs_per_s"`
	MemBytes     int64   `json:"mem_bytes"` // allocated minus freed
	QueueNS      uint64  `json:"queue_ns"`  // time with work queued while others held the GPU, in the window
	Processes    int     `json:"processes"`
	Busy         bool    `json:"busy"` // has outstanding work now
}

// GPUStats are one GPU's figures.
type GPUStats struct {
	Index     int     `json:"index"`
	BusyShare float64 `json:"busy_share"` // fraction of the window some context held the GPU
	Tenants   int     `json:"tenants"`
}

// Snapshot is the meter's view of the window ending at AtNS.
type Snapshot struct {
	AtNS     uint64        `json:"at_ns"`
	WindowNS uint64        `json:"window_ns"`
	Tenants  []TenantStats `json:"tenants"`
	GPUs     []GPUStats    `json:"gpus"`
}

type span struct{ start, end uint64 }

// Initial cost guesses: large enough that a context counts as backlogged
// until its first draining sync teaches the meter its costs.
const (
	initialNSPerBlock = 1e9
	initialNSPerGraph = 1e12
	// realWait is the shortest sync that proves the stream still had work
	// when the sync began (uprobe and wake-up overheads are below it).
	realWait = 100 * time.Microsecond
	// learnRate smooths cost corrections after the first one.
	learnRate = 0.3
	// maxStep bounds one correction of learned costs, either way.
	maxStep = 2.0
	// phaseAllowance is the part of a timeslice by which a sync may end
	// later than the replay drained its streams before the difference
	// counts as the context's own work. A whole slice (the bound) starves
	// short bursts of upward evidence (infer read 2–4 pp low); half a slice
	// lets phase noise inflate tiny kernels (storm drifted to 5% of a true
	// 2%). Measured: 0.75 read infer beside a hog 2.6–3.2 pp high, 0.85
	// read it 1.1 pp high but infer among four tenants 3.1–3.5 pp low.
	phaseAllowance = 0.8
)

// stream is one stream's modeled queue.
type stream struct {
	id       uint64  // the stream's handle
	left     float64 // modeled ns of work not yet run
	got      float64 // GPU ns received since the queue was last empty
	drained  uint64  // when the queue last became empty
	launched bool    // work since the last draining sync
	// Positions in the stream's modeled work, cumulative: enq was
	// enqueued, ran has run in the replay, proven is known complete (the
	// last sync or synchronized event).
	enq, ran, proven float64
	marks            []mark // recorded events not yet synchronized, by position
	// bounds are where its queued kernels end (positions, ascending): a
	// GPU that does not preempt switches contexts only there.
	bounds []float64
}

// maxBounds bounds the kernel ends remembered per stream; beyond it, the
// oldest queued kernels merge into one.
const maxBounds = 4096

// passBounds forgets the kernel ends the replay has run past.
func (s *stream) passBounds() {
	i := 0
	for i < len(s.bounds) && s.bounds[i] <= s.ran+1 {
		i++
	}
	s.bounds = s.bounds[i:]
}

// mark is a cuEventRecord: the event completes when the stream's work up
// to pos has run.
type mark struct {
	event   uint64
	pos     float64
	crossed uint64 // when the replay ran past pos (0: not yet)
}

// passMarks notes at t the marks the replay has now run past.
func (s *stream) passMarks(t uint64) {
	for i := range s.marks {
		if s.marks[i].crossed == 0 && s.marks[i].pos <= s.ran+1 {
			s.marks[i].crossed = t
		}
	}
}

// maxMarks bounds the events remembered per stream (recorded and never
// synchronized ones are dropped oldest first).
const maxMarks = 64

// gpuContext is what the meter keeps of one process using a GPU.
type gpuContext struct {
	pid        uint32
	cgroup     uint64
	gpu        int
	streams    []*stream // in order of first use
	nsPerBlock float64
	nsPerGraph float64
	learned    bool
	held       []span // when the replay gave it the GPU, oldest first
	waited     []span // when it had work but another context held the GPU
	launches   []uint64
	syncs      []span // sync calls that returned, by return time
	mem        int64
	allocs     map[uint64]uint64
	exited     bool
	total      Totals // since the context appeared in its cgroup and on its GPU
	// Launches the launch gate held: they reach the GPU when the process
	// is released (Released, or its next event), not when they were seen.
	since      uint64 // its first event
	deferred   []heldLaunch
	releasedAt uint64
	stopped    []span // when the launch gate held the process
	// Smoothed shape of its launches, for LaunchCost.
	avgBlocks, graphFrac float64
	shapeN               float64 // launches the shape has seen
}

// heldLaunch is a launch waiting for its process's release.
type heldLaunch struct {
	stream uint64
	blocks uint64 // 0 for a graph launch
}

// launchShapeWeight is the weight of one launch in a context's smoothed
// launch shape (blocks per kernel, share of graph launches), after a
// running mean over the first launches.
const launchShapeWeight = 0.1

// noteShape adds one launch (blocks 0: a graph launch) to the shape.
func (c *gpuContext) noteShape(blocks uint64) {
	c.shapeN++
	w := max(launchShapeWeight, 1/c.shapeN)
	graph := 0.0
	if blocks == 0 {
		graph = 1
	} else {
		kernels := max((1-c.graphFrac)*(c.shapeN-1), 0) + 1 // kernel launches seen, this one included
		c.avgBlocks += max(launchShapeWeight, 1/kernels) * (float64(blocks) - c.avgBlocks)
	}
	c.graphFrac += w * (graph - c.graphFrac)
}

// Totals are a context's cumulative counts, for counters that must not go
// back when the window moves on.
type Totals struct {
	GPUNS    uint64 // estimated GPU ns received
	Launches uint64 // kernel and graph launches, submissions
	Syncs    uint64 // syncs that returned
}

// Add adds o to t.
func (t *Totals) Add(o Totals) {
	t.GPUNS += o.GPUNS
	t.Launches += o.Launches
	t.Syncs += o.Syncs
}

func (c *gpuContext) left() float64 {
	var l float64
	for _, s := range c.streams {
		l += s.left
	}
	return l
}

// run gives the context dt ns of GPU time, split over its busy streams.
func (c *gpuContext) run(t, dt uint64) {
	busy := 0
	for _, s := range c.streams {
		if s.left > 0 {
			busy++
		}
	}
	share := float64(dt) / float64(busy)
	for _, s := range c.streams {
		if s.left > 0 {
			ran := min(share, s.left)
			s.got += ran
			s.ran += ran
			s.left -= share
			if s.left <= 1 {
				s.ran += max(s.left, 0)
				s.left = 0
				s.drained = t + dt
			}
			s.passMarks(t + dt)
			s.passBounds()
		}
	}
	c.held = appendSpan(c.held, t, t+dt)
	c.total.GPUNS += dt
}

// backlog is the modeled work queued now, once costs are learned.
func (c *gpuContext) backlog() uint64 {
	if !c.learned {
		return 0
	}
	return uint64(c.left())
}

// toBoundary is the replay time until one of the context's busy streams
// finishes its running kernel (the GPU time is split among them).
func (c *gpuContext) toBoundary() float64 {
	busy := 0
	for _, s := range c.streams {
		if s.left > 0 {
			busy++
		}
	}
	next := c.left()
	for _, s := range c.streams {
		if s.left > 0 && len(s.bounds) > 0 {
			next = min(next, (s.bounds[0]-s.ran)*float64(busy))
		}
	}
	return max(next, 1)
}

// appendSpan adds [s, e) to spans, merging with the last one when they touch.
func appendSpan(spans []span, s, e uint64) []span {
	if n := len(spans); n > 0 && spans[n-1].end == s {
		spans[n-1].end = e
		return spans
	}
	return append(spans, span{s, e})
}

// replay is one GPU's round-robin time-slicing, re-enacted on the modeled
// queues.
type replay struct {
	t        uint64
	holder   *gpuContext
	sliceEnd uint64
	runlist  []*gpuContext
	// The GPU's scheduling: its timeslice, and whether it preempts a
	// running kernel at the end of one; midKernel is set while the holder
	// of a GPU that does not is inside a kernel.
	slice      uint64
	preemptive bool
	midKernel  bool
}

// Meter estimates GPU time per tenant from the event stream. Observe is
// called by one reader; Snapshot and Tick may run concurrently with it.
type Meter struct {
	cfg Config

	mu       sync.Mutex
	ctxs     map[uint32]*gpuContext
	gpus     map[int]*replay
	longRun  map[TenantKey]float64
	lastTick uint64
	paused   map[uint64][]span // per cgroup: when the arbiter froze it
	// submitted is the work launched per cgroup, cumulative, at the costs
	// known when it was launched.
	submitted map[uint64]float64
	sched     func(gpu int) (time.Duration, bool)
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
		cfg.Timeslice = 2 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = MonotonicNow
	}
	return &Meter{cfg: cfg, ctxs: map[uint32]*gpuContext{}, gpus: map[int]*replay{}, longRun: map[TenantKey]float64{}, paused: map[uint64][]span{},
		submitted: map[uint64]float64{}}
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
		if ts, pre := m.sched(gpu); ts > 0 {
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
	c := m.ctxs[h.PID]
	if c == nil || c.exited {
		c = &gpuContext{pid: h.PID, allocs: map[uint64]uint64{},
			nsPerBlock: initialNSPerBlock, nsPerGraph: initialNSPerGraph, since: h.Start}
		m.ctxs[h.PID] = c
		r := m.replayOf(0)
		r.runlist = append(r.runlist, c)
	}
	if c.cgroup != h.CgroupID { // processes move between cgroups
		c.cgroup = h.CgroupID
		c.total = Totals{}
	}
	return c
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
	r := m.replayOf(gpu)
	r.runlist = append(r.runlist, c)
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

// next returns the first context with work after `after` in runlist order.
func (r *replay) next(after *gpuContext) *gpuContext {
	start := 0
	for i, c := range r.runlist {
		if c == after {
			start = i + 1
			break
		}
	}
	for i := range r.runlist {
		if c := r.runlist[(start+i)%len(r.runlist)]; c.left() > 0 && c != after {
			return c
		}
	}
	if after != nil && after.left() > 0 {
		return after
	}
	return nil
}

// advance re-enacts the GPU from r.t to `to`.
func (r *replay) advance(to uint64) {
	slice := r.slice
	for r.t < to {
		if r.holder == nil || r.holder.left() <= 0 {
			r.holder = r.next(r.holder)
			r.midKernel = false
			if r.holder == nil {
				r.t = to
				return
			}
			r.sliceEnd = r.t + slice
		}
		others := r.next(r.holder) != r.holder
		switch {
		case others && r.t >= r.sliceEnd && (r.preemptive || !r.midKernel):
			r.holder = r.next(r.holder)
			r.sliceEnd = r.t + slice
			r.midKernel = false
		case !others && r.t >= r.sliceEnd:
			r.sliceEnd = r.t + slice
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
		if end <= r.t {
			end = r.t + 1
		}
		if others {
			for _, c := range r.runlist {
				if c != r.holder && c.left() > 0 {
					c.waited = appendSpan(c.waited, r.t, end)
				}
			}
		}
		r.holder.run(r.t, end-r.t)
		r.midKernel = !r.preemptive && r.holder.learned && end < boundary && r.holder.left() > 0
		r.t = end
	}
}

// settle advances every GPU's replay to t.
func (m *Meter) settle(t uint64) {
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

// stream returns the stream with handle h, made on first use.
func (c *gpuContext) stream(h uint64) *stream {
	if s := c.findStream(h); s != nil {
		return s
	}
	s := &stream{id: h}
	c.streams = append(c.streams, s)
	return s
}

// findStream returns the stream with handle h, nil if it has none.
func (c *gpuContext) findStream(h uint64) *stream {
	for _, s := range c.streams {
		if s.id == h {
			return s
		}
	}
	return nil
}

func (m *Meter) enqueue(c *gpuContext, streamID uint64, t uint64, work float64) {
	m.at(c, t)
	s := c.stream(streamID)
	if s.left <= 0 {
		s.got = 0
	}
	s.left += work
	s.enq += work
	s.launched = true
	if len(s.bounds) == maxBounds {
		s.bounds = s.bounds[1:]
	}
	s.bounds = append(s.bounds, s.enq)
	if !c.learned {
		// Costs not learned yet are guesses meant to read as backlogged;
		// charged whole they would freeze a paced tenant for seconds.
		work = min(work, unlearnedCharge)
	}
	m.submitted[c.cgroup] += work
	c.launches = append(c.launches, t)
	c.total.Launches++
}

// launch enqueues a launch, or keeps it until its process is released when
// the launch gate held it there.
func (m *Meter) launch(c *gpuContext, h *ioctlspy.Header, l heldLaunch) {
	c.noteShape(l.blocks)
	switch {
	case !h.Held:
		m.enqueue(c, l.stream, h.Start, c.cost(l))
	case c.releasedAt > h.Start: // the release was reported before the event
		m.enqueue(c, l.stream, c.releasedAt, c.cost(l))
	default:
		c.deferred = append(c.deferred, l)
	}
}

func (c *gpuContext) cost(l heldLaunch) float64 {
	if l.blocks == 0 {
		return c.nsPerGraph
	}
	return float64(l.blocks) * c.nsPerBlock
}

// launchDeferred enqueues at t the launches held for the process.
func (m *Meter) launchDeferred(c *gpuContext, t uint64) {
	for _, l := range c.deferred {
		m.enqueue(c, l.stream, t, c.cost(l))
	}
	c.deferred = c.deferred[:0]
}

// Released records that the arbiter continued at t a process the launch
// gate held since `since` (CLOCK_MONOTONIC ns): its held launch runs from
// t, and its syncs across the stop teach nothing.
func (m *Meter) Released(pid uint32, since, t uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.ctxs[pid]
	if c == nil {
		return
	}
	c.releasedAt = t
	c.stopped = appendSpan(c.stopped, since, t)
	if len(c.deferred) > 0 {
		m.launchDeferred(c, t)
	}
}

// nouveauStream keys a context's kernel-submitted work apart from streams.
const nouveauStream = ^uint64(0)

// Observe feeds one event to the meter.
func (m *Meter) Observe(ev ioctlspy.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := ev.Hdr()
	if c := m.ctxs[h.PID]; c != nil && len(c.deferred) > 0 && !h.Held {
		m.launchDeferred(c, h.Start) // it runs again, so it was released
	}
	switch e := ev.(type) {
	case *ioctlspy.Launch:
		m.launch(m.context(h), h, heldLaunch{e.Stream, max(e.Blocks(), 1)})
	case *ioctlspy.GraphLaunch:
		m.launch(m.context(h), h, heldLaunch{stream: e.Stream})
	case *ioctlspy.EventRecord:
		c := m.context(h)
		m.at(c, h.Start)
		m.record(c.stream(e.Stream), e.Event)
	case *ioctlspy.Submission:
		// A submission ioctl went through before its process was held:
		// it is never deferred.
		c := m.context(h)
		c.noteShape(1)
		m.enqueue(c, nouveauStream, h.Start, c.nsPerBlock)
	case *ioctlspy.Sync:
		if e.Ret == 0 {
			m.sync(h, e)
		}
	case *ioctlspy.ContextCreated:
		if e.Ret == 0 {
			m.moveGPU(m.context(h), int(e.Device))
		}
	case *ioctlspy.MemAlloc:
		if e.Ret == 0 {
			c := m.context(h)
			c.mem += int64(e.Bytes)
			c.allocs[e.DPtr] = e.Bytes
		}
	case *ioctlspy.MemFree:
		c := m.context(h)
		if b, ok := c.allocs[e.DPtr]; ok {
			c.mem -= int64(b)
			delete(c.allocs, e.DPtr)
		}
	case *ioctlspy.ProcessExit:
		if c := m.ctxs[h.PID]; c != nil {
			m.at(c, h.End)
			c.streams = nil // the driver drops a dead process's work
			c.deferred = nil
			c.exited = true
			c.mem = 0
			clear(c.allocs)
		}
	}
}

// sync applies what a returning sync proves: the synced streams drained
// when it returned. The difference between the replay and that fact
// corrects the context's learned costs.
func (m *Meter) sync(h *ioctlspy.Header, e *ioctlspy.Sync) {
	c := m.context(h)
	now := m.at(c, h.End)
	c.syncs = append(c.syncs, span{h.Start, h.End})
	c.total.Syncs++
	var ids []uint64
	switch e.Func {
	case "cuStreamSynchronize":
		ids = []uint64{e.Handle}
	case "cuCtxSynchronize":
		for _, s := range c.streams {
			ids = append(ids, s.id)
		}
	case "cuEventSynchronize":
		m.eventSync(c, h, e.Handle, now)
		return
	default: // nouveau and DRM waits
		ids = []uint64{nouveauStream}
	}
	var left, got, early float64
	waited := h.DurationNS >= uint64(realWait)
	any := false
	for _, id := range ids {
		s := c.findStream(id)
		if s == nil || !s.launched {
			continue
		}
		any = true
		left += s.left
		got += s.got
		if s.left <= 0 && waited && s.drained+uint64(realWait) < now {
			// Drained too early in the replay: the GPU still worked on it
			// until the sync returned, at the holder's rate at best.
			early = max(early, float64(now-max(s.drained, h.Start)))
		}
		s.ran += s.left
		s.proven = s.enq
		s.marks = s.marks[:0]
		s.bounds = s.bounds[:0]
		s.left, s.got, s.launched = 0, 0, false
		s.drained = now
	}
	if !any || got <= 0 || m.pausedDuring(c, h.Start, h.End) {
		return // a sync that spanned a freeze waited for the thaw, not the GPU
	}
	others := m.busyContexts(c.gpu) - 1
	// The replay's slice phase is not the GPU's: while others are busy, a
	// wait may end up to a slice later than the replay says without any
	// work of the context's own. Only the excess is evidence.
	early -= float64(min(others, 1)) * phaseAllowance * m.phaseSpan(c)
	factor := 1.0
	switch {
	case !c.learned && waited:
		// First evidence: the backlog assumed so far, or the wait if that
		// is less; a context of tiny kernels must not start at its
		// round-robin share.
		factor = min(got, float64(h.DurationNS)) / (got + left)
	case !c.learned:
		// A sync that did not wait teaches a guess nothing (see eventSync).
	case left > 0:
		factor = got / (got + left)
	case early > 0 && m.latenessTeaches(c):
		factor = min((got+early/float64(others+1))/got, maxStep)
	}
	c.learn(factor)
}

// learn scales the context's costs: the first correction whole, later ones
// smoothed. Work still queued was costed at the old rate and is rescaled
// with it, or the next proof would correct the same error again.
func (c *gpuContext) learn(factor float64) {
	if !c.learned {
		c.learned = true
	} else {
		// One sync is one piece of evidence: an outlier (a sync the replay
		// got badly out of phase) moves learned costs by a bounded step.
		factor = math.Pow(min(max(factor, 1/maxStep), maxStep), learnRate)
	}
	c.nsPerBlock *= factor
	c.nsPerGraph *= factor
	for _, s := range c.streams {
		if s.left <= 0 {
			continue
		}
		s.left *= factor
		s.enq = s.ran + s.left
		for i := range s.marks {
			if s.marks[i].pos > s.ran {
				s.marks[i].pos = s.ran + (s.marks[i].pos-s.ran)*factor
			}
		}
		for i := range s.bounds {
			s.bounds[i] = s.ran + (s.bounds[i]-s.ran)*factor
		}
	}
}

// record remembers where a stream's work stood when an event was recorded
// on it; recording an event again moves it.
func (m *Meter) record(s *stream, event uint64) {
	s.marks = slices.DeleteFunc(s.marks, func(k mark) bool { return k.event == event })
	if len(s.marks) == maxMarks {
		s.marks = s.marks[1:]
	}
	k := mark{event: event, pos: s.enq}
	if s.ran+1 >= s.enq {
		k.crossed = s.drained
	}
	s.marks = append(s.marks, k)
}

// eventSync applies what a returning cuEventSynchronize proves: the
// stream's work up to the event's mark ran by now. Work the replay still
// has queued before the mark is dropped from it and its costs scaled down;
// a mark the replay passed well before the wait ended scales them up. An
// event the meter never saw recorded teaches nothing.
func (m *Meter) eventSync(c *gpuContext, h *ioctlspy.Header, event uint64, now uint64) {
	var s *stream
	var k mark
	for _, st := range c.streams {
		if i := slices.IndexFunc(st.marks, func(x mark) bool { return x.event == event }); i >= 0 {
			s, k = st, st.marks[i]
			st.marks = slices.Delete(st.marks, i, i+1)
			break
		}
	}
	if s == nil || k.pos <= s.proven {
		return
	}
	covered := k.pos - s.proven            // work the event covers since the last proof
	ran := min(s.ran, k.pos) - s.proven    // of which the replay ran
	behind := k.pos - max(s.ran, s.proven) // proven done, still queued in the replay
	s.proven = k.pos
	if behind > 0 {
		s.left -= behind
		s.ran += behind
		if s.left <= 1 {
			s.left = 0
			s.drained = now
		}
		s.passMarks(now)
		s.passBounds()
	}
	if covered <= 0 || m.pausedDuring(c, h.Start, h.End) {
		return
	}
	waited := h.DurationNS >= uint64(realWait)
	factor := 1.0
	switch {
	case behind > 0 && !c.learned && waited:
		factor = max(min(ran, float64(h.DurationNS)), 1) / covered
	case !c.learned:
		// A sync that did not wait proves the work done, not how long it
		// took: scaled by what the replay ran of a guess, the costs would
		// collapse (a paced tenant, whose kernels finish between its
		// spaced launches, never waits).
	case behind > 0:
		factor = max(ran, 1) / covered
	case waited && k.crossed > 0 && k.crossed+uint64(realWait) < now && m.latenessTeaches(c):
		others := m.busyContexts(c.gpu) - 1
		early := float64(now-max(k.crossed, h.Start)) - float64(min(others, 1))*phaseAllowance*m.phaseSpan(c)
		if early > 0 && ran > 0 {
			factor = min((ran+early/float64(others+1))/ran, maxStep)
		}
	}
	c.learn(factor)
}

// unlearnedCharge is what a launch of a context whose costs are not learned
// yet counts towards SubmittedNS.
const unlearnedCharge = float64(20 * time.Millisecond)

// SubmittedNS returns the GPU ns launched so far by the processes of the
// given cgroups (cumulative, as costed at launch).
func (m *Meter) SubmittedNS(cgroups []uint64) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var sum float64
	for _, id := range cgroups {
		sum += m.submitted[id]
	}
	return sum
}

// Paused records that the arbiter froze a cgroup's processes during
// [from, to) (CLOCK_MONOTONIC ns): their syncs then teach nothing.
// A freeze still in progress is reported with to = math.MaxUint64 and
// again with its end once it ends.
func (m *Meter) Paused(cgroupID, from, to uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ps := m.paused[cgroupID]
	if n := len(ps); n > 0 && ps[n-1].start == from {
		ps[n-1].end = to
		return
	}
	m.paused[cgroupID] = append(ps, span{from, to})
}

// pausedDuring reports whether the context's process was stopped by the
// arbiter (its cgroup frozen, or the process held at the launch gate)
// during [from, to).
func (m *Meter) pausedDuring(c *gpuContext, from, to uint64) bool {
	for _, p := range c.stopped {
		if p.start < to && p.end > from {
			return true
		}
	}
	for _, p := range m.paused[c.cgroup] {
		if p.start < to && p.end > from {
			return true
		}
	}
	return false
}

// latenessTeaches tells whether a drain later than the replay's says the
// context's costs are too low. On a GPU that does not preempt, only when
// no other context has work: there the replay fits whole kernels into
// slices, and a cost just under a slice lets it run two where the GPU ran
// one, so a drain late against others proves nothing (costs would climb
// past the slice).
func (m *Meter) latenessTeaches(c *gpuContext) bool {
	return m.replayOf(c.gpu).preemptive || m.othersIdle(c)
}

// othersIdle tells whether no context but c has work in the replay.
func (m *Meter) othersIdle(c *gpuContext) bool {
	for _, o := range m.replayOf(c.gpu).runlist {
		if o != c && o.left() > 0 {
			return false
		}
	}
	return true
}

// phaseSpan is how far the replay's phase may be off the GPU's for a
// context's drain: one timeslice, or on a GPU that does not preempt the
// longest running kernel of another context with work.
func (m *Meter) phaseSpan(c *gpuContext) float64 {
	r := m.replayOf(c.gpu)
	span := float64(r.slice)
	if r.preemptive {
		return span
	}
	for _, o := range r.runlist {
		if o != c && o.learned && o.left() > 0 {
			span = max(span, o.launchCost())
		}
	}
	return span
}

// launchCost is the modeled GPU time of one of the context's launches.
func (c *gpuContext) launchCost() float64 {
	return (1-c.graphFrac)*c.avgBlocks*c.nsPerBlock + c.graphFrac*c.nsPerGraph
}

func (m *Meter) busyContexts(gpu int) int {
	n := 0
	for _, c := range m.replayOf(gpu).runlist {
		if c.left() > 0 {
			n++
		}
	}
	return n + 1
}

// horizon is the latest time the replay settles: the clock less the lag.
func (m *Meter) horizon() uint64 {
	now := m.cfg.Now()
	if lag := uint64(m.cfg.Lag); now > lag {
		return now - lag
	}
	return now
}

// heldIn sums the context's held time within [from, to).
func (c *gpuContext) heldIn(from, to uint64) float64 { return sumIn(c.held, from, to) }

// sumIn sums the parts of spans within [from, to).
func sumIn(spans []span, from, to uint64) float64 {
	var ns float64
	for _, sp := range spans {
		if s, e := max(sp.start, from), min(sp.end, to); e > s {
			ns += float64(e - s)
		}
	}
	return ns
}

// Tick settles the replay, advances the long-run shares and forgets what
// fell out of the window. The daemon calls it every control period.
func (m *Meter) Tick() {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.horizon()
	m.settle(now)
	if m.lastTick != 0 && now > m.lastTick {
		dt := now - m.lastTick
		perTenant := map[TenantKey]float64{}
		for _, c := range m.ctxs {
			perTenant[TenantKey{c.cgroup, c.gpu}] += c.heldIn(m.lastTick, now) / float64(dt)
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

// prune drops held spans and samples older than the window and contexts of
// exited processes with nothing left in it.
func (m *Meter) prune(now uint64) {
	w := uint64(m.cfg.Window)
	if now < w {
		return
	}
	cut := now - w
	for cg, ps := range m.paused {
		i := 0
		for i < len(ps) && ps[i].end < cut {
			i++
		}
		if i == len(ps) {
			delete(m.paused, cg)
		} else {
			m.paused[cg] = ps[i:]
		}
	}
	for pid, c := range m.ctxs {
		i := 0
		for i < len(c.held) && c.held[i].end < cut {
			i++
		}
		c.held = c.held[i:]
		for len(c.stopped) > 0 && c.stopped[0].end < cut {
			c.stopped = c.stopped[1:]
		}
		j := 0
		for j < len(c.waited) && c.waited[j].end < cut {
			j++
		}
		c.waited = c.waited[j:]
		c.launches = dropBefore(c.launches, cut)
		k := 0
		for k < len(c.syncs) && c.syncs[k].end < cut {
			k++
		}
		c.syncs = c.syncs[k:]
		if c.exited && len(c.held) == 0 && len(c.launches) == 0 && len(c.syncs) == 0 {
			delete(m.ctxs, pid)
			m.replayOf(c.gpu).remove(c)
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

// ContextStats are one process's figures on its GPU over a window.
type ContextStats struct {
	PID      uint32
	CgroupID uint64
	GPU      int
	GPUNS    uint64  // estimated GPU ns in the window
	Share    float64 // GPUNS over the window
	Launches int     // launches in the window
	Syncs    int     // syncs that returned in the window
	SyncWait []uint64
	MemBytes int64
	QueueNS  uint64
	// BacklogNS is the modeled GPU work queued now, not yet run (0 until
	// the context's costs are learned: a guess would read as seconds).
	BacklogNS uint64
	// ActiveNS is the part of the window since the process's first event
	// (the whole window for an older process).
	ActiveNS uint64
	// LaunchNS is the GPU time one launch of the process costs, as its
	// recent launches and syncs taught the meter (0 before its first
	// launch; an unlearned guess is capped at 20 ms).
	LaunchNS float64
	// Learned tells whether a sync has taught the meter its costs yet.
	Learned bool
	Busy    bool // work outstanding now
	Exited  bool
	// Total counts since the process entered its cgroup and GPU (they
	// start again from zero when it moves).
	Total Totals
}

// Contexts returns per-process figures over the window ending at the
// settled present.
func (m *Meter) Contexts(window time.Duration) (at uint64, out []ContextStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.horizon()
	m.settle(now)
	w := uint64(window)
	from := uint64(0)
	if now > w {
		from = now - w
	}
	for _, c := range m.ctxs {
		held := c.heldIn(from, now)
		cs := ContextStats{PID: c.pid, CgroupID: c.cgroup, GPU: c.gpu, GPUNS: uint64(held), Share: held / float64(w),
			Launches: len(dropBefore(c.launches, from)), MemBytes: c.mem, QueueNS: uint64(sumIn(c.waited, from, now)),
			Busy: c.left() > 0, BacklogNS: c.backlog(), ActiveNS: now - max(from, min(c.since, now)), Learned: c.learned,
			Exited: c.exited, Total: c.total}
		if c.total.Launches > 0 {
			cs.LaunchNS = c.launchCost()
			if !c.learned {
				cs.LaunchNS = min(cs.LaunchNS, unlearnedCharge)
			}
		}
		for _, sp := range c.syncs {
			if sp.end >= from {
				cs.Syncs++
				cs.SyncWait = append(cs.SyncWait, sp.end-sp.start)
			}
		}
		out = append(out, cs)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return now, out
}

// Snapshot returns per-cgroup figures over the meter's window ending at the
// settled present.
func (m *Meter) Snapshot() Snapshot {
	now, ctxs := m.Contexts(m.cfg.Window)
	w := uint64(m.cfg.Window)
	secs := float64(w) / 1e9
	tenants := map[TenantKey]*TenantStats{}
	busy := map[int]float64{}
	m.mu.Lock()
	for _, c := range ctxs {
		k := TenantKey{c.CgroupID, c.GPU}
		t := tenants[k]
		if t == nil {
			t = &TenantStats{CgroupID: c.CgroupID, GPU: c.GPU, LongRunShare: m.longRun[k]}
			tenants[k] = t
		}
		busy[c.GPU] += float64(c.GPUNS)
		t.GPUNS += c.GPUNS
		t.LaunchesPerS += float64(c.Launches) / secs
		t.SyncsPerS += float64(c.Syncs) / secs
		t.MemBytes += c.MemBytes
		t.QueueNS += c.QueueNS
		if !c.Exited {
			t.Processes++
		}
		t.Busy = t.Busy || c.Busy
	}
	m.mu.Unlock()
	snap := Snapshot{AtNS: now, WindowNS: w, Tenants: []TenantStats{}, GPUs: []GPUStats{}}
	perGPU := map[int]int{}
	for _, t := range tenants {
		t.Share = float64(t.GPUNS) / float64(w)
		snap.Tenants = append(snap.Tenants, *t)
		perGPU[t.GPU]++
	}
	sort.Slice(snap.Tenants, func(i, j int) bool {
		a, b := snap.Tenants[i], snap.Tenants[j]
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		return a.CgroupID < b.CgroupID
	})
	for gpu, n := range perGPU {
		snap.GPUs = append(snap.GPUs, GPUStats{Index: gpu, BusyShare: busy[gpu] / float64(w), Tenants: n})
	}
	sort.Slice(snap.GPUs, func(i, j int) bool { return snap.GPUs[i].Index < snap.GPUs[j].Index })
	return snap
}
