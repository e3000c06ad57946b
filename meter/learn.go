package meter

import (
	"slices"
	"time"

	"github.com/gpuarb/gpuarb/ioctlspy"
)

const (
	// realWait is the shortest sync that proves the stream still had work
	// when the sync began (uprobe and wake-up overheads are below it).
	realWait = 100 * time.Microsecond
	// learnRate smooths cost corrections after the first one.
	learnRate = 0.3
	// maxStep bounds one correction of learned costs, either way.
	maxStep = 2.0
	// evidenceWork and evidenceProofs are how much modeled work, or how
	// many proofs, a learned context's evidence sums before it corrects
	// its costs. One proof's lateness is the replay's phase against the
	// GPU's as much as its costs: beside others, a burst waits up to a
	// rotation for its turn on either, at an unrelated phase, so its
	// drain is early or late by up to that much. Summed over proofs the
	// phases cancel and the costs' error remains.
	evidenceWork   = float64(20 * time.Millisecond)
	evidenceProofs = 16
	// decisiveProofs is how many proofs whose lateness sums evidenceWork
	// either way correct a learned context's costs at once, however
	// little modeled work they covered: a cost far too low covers almost
	// no modeled work, and waiting for evidenceWork of it would leave the
	// context under-metered for hundreds of proofs (a tenant of 7.6 ms
	// kernels learned at 0.11 ms read 1% while it took 67%).
	decisiveProofs = 3
)

// waitBegan records a wait for the GPU that has begun.
func (m *Meter) waitBegan(h *ioctlspy.Header, e *ioctlspy.WaitBegin) {
	c := m.context(h)
	m.at(c, h.Start)
	for _, w := range c.waits {
		if w.of == e.Of && w.handle == e.Handle {
			return // a poll already waiting
		}
	}
	if len(c.waits) < maxWaits {
		c.waits = append(c.waits, wait{of: e.Of, handle: e.Handle, since: h.Start})
	}
}

// maxWaits bounds the waits a context keeps in progress (a thread waits
// for one thing at a time; a process has few threads waiting).
const maxWaits = 64

// waitEnded closes the wait a returning sync ends and records it, up to
// when the work it waited for completed (completedBy): from the wake-up
// on, the thread runs on the host with nothing outstanding on the GPU —
// its return, think time and next launch are its own round trip, which
// it would spend alone too. Counted as waiting, that round trip made a
// closed loop of short kernels want the whole GPU (40 µs kernels with a
// sync every 4 take 63% alone) and held a tenant beside it at 4%.
//
// Where the replay ran the waited-for work dry less than realWait before
// that (modeledEnd), the wait ends at the replay's drain: the rest is the
// completion's way to the thread and the launch's way to the GPU — host
// latency that takes as long alone, not a want of the GPU, and costs that
// put the drain there are not corrected (the realWait tolerance of sync
// and eventSync). Counted, it read such a loop as wanting 85% of the GPU
// where it took 72% alone beside the daemon, and the arbiter paused a
// tenant beside it for the 13 pp it could never take. A drain earlier
// than that is the replay's error, not the GPU's: the wait stays whole.
func (c *gpuContext) waitEnded(h *ioctlspy.Header, e *ioctlspy.Sync) {
	end := completedBy(h, e)
	start := h.Start
	c.waits = slices.DeleteFunc(c.waits, func(w wait) bool {
		if w.of == e.Of && w.handle == e.Handle {
			start = min(start, w.since)
			return true
		}
		return false
	})
	if drained, ok := c.modeledEnd(e); ok && drained < end && drained+uint64(realWait) >= end {
		end = max(drained, start)
	}
	if end > start {
		c.waitedFor = appendSpan(c.waitedFor, start, end)
	}
}

// modeledEnd is when the replay ran out of the work a sync waited for:
// the synced streams' last drain (syncedStreams), the event's mark passed
// for an event sync. ok is false while the replay still has some of that
// work queued, or for work it never saw launched.
func (c *gpuContext) modeledEnd(e *ioctlspy.Sync) (drained uint64, ok bool) {
	if e.Of == ioctlspy.WaitEvent {
		if s, i := c.markOf(e.Handle); s != nil {
			return s.marks[i].crossed, s.marks[i].crossed > 0
		}
		return 0, false
	}
	for _, id := range c.syncedStreams(e) {
		s := c.findStream(id)
		if s == nil || !s.launched {
			continue
		}
		if s.left > 0 {
			return 0, false
		}
		drained, ok = max(drained, s.drained), true
	}
	return drained, ok
}

// syncedStreams are the streams a sync other than an event's waits for:
// the stream synced, every stream of a context sync, a nouveau or DRM
// wait's submissions.
func (c *gpuContext) syncedStreams(e *ioctlspy.Sync) []uint64 {
	switch e.Of {
	case ioctlspy.WaitStream:
		return []uint64{e.Handle}
	case ioctlspy.WaitContext:
		ids := make([]uint64, 0, len(c.streams))
		for _, s := range c.streams {
			ids = append(ids, s.id)
		}
		return ids
	default: // nouveau and DRM waits
		return []uint64{nouveauStream}
	}
}

// markOf finds where an event was last recorded: its stream and the
// mark's index there (nil if the meter never saw it recorded).
func (c *gpuContext) markOf(event uint64) (*stream, int) {
	for _, s := range c.streams {
		if i := slices.IndexFunc(s.marks, func(k mark) bool { return k.event == event }); i >= 0 {
			return s, i
		}
	}
	return nil, 0
}

// waitedForGPU tells whether a returning sync was a wait for the GPU, one
// that counts as a sync (its wait towards a p99 SLO, its return towards
// frames/s): every synchronizing call, and a polling loop that found the
// work not done at least once (its Start is that first query, before the
// query that ends it). A query that finds work already done proves it
// done but waited for nothing: a caching allocator that checks its
// blocks' events would otherwise bury a serving loop's per-token waits
// in thousands of instant ones.
func waitedForGPU(h *ioctlspy.Header, e *ioctlspy.Sync) bool {
	return !e.Polled || h.End > h.Start
}

// sync applies what a returning sync proves: the synced streams drained
// by the time it returned, or by when its thread was woken where it slept
// (completedBy). The difference between the replay there and that fact
// corrects the costs of the work that ran since the last proof. A
// completion query that found the work done proves the same.
func (m *Meter) sync(h *ioctlspy.Header, e *ioctlspy.Sync) {
	c := m.context(h)
	done := completedBy(h, e)
	now := m.at(c, done)
	c.waitEnded(h, e)
	if c.left() > 0 {
		defer func() {
			if c.left() == 0 {
				c.drains = append(c.drains, now)
			}
		}()
	}
	if waitedForGPU(h, e) {
		c.syncs = append(c.syncs, span{h.Start, h.End})
		c.total.Syncs++
	}
	if e.Of == ioctlspy.WaitEvent {
		m.eventSync(c, h, e, now, done)
		return
	}
	ids := c.syncedStreams(e)
	var left, got, early float64
	var drained uint64 // the latest drain of a synced stream in the replay
	burst := composition{}
	waited := h.DurationNS >= uint64(realWait)
	any, unseen, released := false, false, false
	for _, id := range ids {
		s := c.findStream(id)
		if s == nil || !s.launched {
			continue
		}
		any = true
		unseen = unseen || s.unseen
		released = released || s.released
		s.unseen, s.released = false, false
		left += s.left
		got += s.got
		if s.left <= 0 {
			drained = max(drained, s.drained)
		}
		if s.left <= 0 && waited && s.drained+uint64(realWait) < now {
			// Drained too early in the replay: the GPU still worked on it
			// until the sync returned, at the holder's rate at best.
			early = max(early, float64(now-max(s.drained, h.Start)))
		}
		for k, w := range s.comp.minus(s.provenComp) {
			burst[k] += w
		}
		s.ran += s.left
		s.proven = s.enq
		s.provenComp = s.comp.clone()
		s.marks = s.marks[:0]
		s.bounds = s.bounds[:0]
		s.left, s.got, s.launched = 0, 0, false
		s.drained = now
	}
	stopped := m.pausedDuring(c, h.Start, h.End)
	if r := m.replayOf(c.gpu); any && waited && r.outOfPhase(early, got <= 0 && left > 0) && !unseen && !stopped {
		r.anchor(c)
	}
	if got <= 0 && left > 0 && !c.learned {
		// The replay had not begun the synced work: it ran the context's
		// other streams first, the GPU this one (or in its turn): the
		// proof covers the context's work, what ran of it and what not.
		og, ol := c.othersSinceEmpty(ids)
		got, left = got+og, left+ol
	}
	if !any || got <= 0 || unseen || stopped {
		// A sync that spanned a stop waited for the resume, not the GPU;
		// one of work queued before the meter saw it, for unseen work.
		if any {
			m.traceProof(c, Proof{At: done, Of: e.Of, WaitNS: done - h.Start, RanNS: got, LeftNS: left,
				Skipped: skipped(unseen, stopped)})
		}
		return
	}
	switch {
	case !c.learned && waited:
		// First evidence: the backlog assumed so far, or the wait if that
		// is less; a context of tiny kernels must not start at its
		// round-robin share.
		c.learn(min(got, float64(done-h.Start))/(got+left), burst)
		m.traceProof(c, Proof{At: done, Of: e.Of, First: true, WaitNS: done - h.Start, RanNS: got, LeftNS: left})
	case !c.learned:
		// A sync that did not wait teaches a guess nothing (see eventSync).
	default:
		late := left
		if pl, pe, ok := m.pollLateness(c, h, e, left, drained); ok {
			late, early = pl, pe
		}
		if released {
			early = max(early-m.releaseSlack(c), 0)
		}
		taught := m.lateness(c, late, early)
		c.prove(taught, got+left, burst)
		m.traceProof(c, Proof{At: done, Of: e.Of, WaitNS: done - h.Start, RanNS: got, LeftNS: left, LateNS: taught})
	}
}

// othersSinceEmpty is the GPU time the context's streams other than ids
// received since their queues were last empty, and the work they have
// left.
func (c *gpuContext) othersSinceEmpty(ids []uint64) (got, left float64) {
	for _, s := range c.streams {
		if !slices.Contains(ids, s.id) {
			got += s.got
			left += s.left
		}
	}
	return got, left
}

// completedBy bounds when the work a sync waited for completed: when its
// thread was last woken inside the call if it slept there (the completion
// reaching it: the driver's interrupt, the simulated GPU's wake-up), else
// when the call returned. What follows the wake-up, the thread's wait for
// a CPU and the return path with its uretprobe, is host time: taken as
// GPU time it inflated closed loops of short kernels. (The decoder keeps
// only wake-ups within the call.)
func completedBy(h *ioctlspy.Header, e *ioctlspy.Sync) uint64 {
	if e.Woken > 0 {
		return e.Woken
	}
	return h.End
}

// pollLateness is, for a polling loop that knows its last query that
// found the work not done (NotDoneAt), what the proof says against the
// middle of the last poll interval — the work completed between that
// query and the one that found it done, and the middle is the unbiased
// guess — as lateness' left (work) and early (time): drained is when the
// replay drained the proven work, left what it still had of it at the
// proof's end. Time late against the middle counts as the context's
// round-robin part of it, as an early drain does (lateness). ok is false
// for other proofs: a synchronizing call returns a wake-up and more after
// the completion, never before, so only an early drain beyond realWait
// teaches there. Measured against the success alone, every burst read
// half a poll interval long (a loop of 0.3 ms bursts polled every 0.2 ms:
// +13 pp); measured to the end of the interval and only late, −10 pp.
func (m *Meter) pollLateness(c *gpuContext, h *ioctlspy.Header, e *ioctlspy.Sync, left float64, drained uint64) (late, early float64, ok bool) {
	if !e.Polled || e.NotDoneAt == 0 || e.NotDoneAt >= h.End || left <= 0 && drained == 0 {
		return 0, 0, false
	}
	mid := e.NotDoneAt + (h.End-e.NotDoneAt)/2
	var lateTime float64
	switch {
	case left > 0:
		lateTime = float64(h.End - mid)
	case drained > mid:
		lateTime = float64(drained - mid)
	default:
		return 0, float64(mid - drained), true
	}
	if m.latenessTeaches(c) {
		left += lateTime * m.turnPart(c)
	}
	return left, 0, true
}

// lateness is what one proof says of a learned context's costs, in its
// own work: the replay still had left of the proven work queued (its
// costs too high by up to that), or drained early ns before the GPU did
// (too low by what it would have received meanwhile, its part of the
// GPU's round robin: turnPart). A drain late against others proves
// nothing where latenessTeaches says so.
func (m *Meter) lateness(c *gpuContext, left, early float64) float64 {
	switch {
	case left > 0:
		return left
	case early > 0 && m.latenessTeaches(c):
		return -early * m.turnPart(c)
	}
	return 0
}

// record remembers where a stream's work stood when an event was recorded
// on it; recording an event again moves it.
func (m *Meter) record(s *stream, event uint64) {
	s.marks = slices.DeleteFunc(s.marks, func(k mark) bool { return k.event == event })
	if len(s.marks) == maxMarks {
		s.marks = s.marks[1:]
	}
	k := mark{event: event, pos: s.enq, comp: s.comp.clone()}
	if s.ran+1 >= s.enq {
		k.crossed = s.drained
	}
	s.marks = append(s.marks, k)
}

// eventSync applies what a returning event synchronize (or a query that
// found the event complete) proves: the stream's work up to the event's
// mark ran by done (completedBy), the replay being at now. Work the
// replay still has queued before the mark is dropped from it and its
// costs scaled down; a mark the replay passed well before the wait ended
// scales them up. An event the meter never saw
// recorded teaches nothing.
func (m *Meter) eventSync(c *gpuContext, h *ioctlspy.Header, e *ioctlspy.Sync, now, done uint64) {
	s, i := c.markOf(e.Handle)
	if s == nil {
		return
	}
	k := s.marks[i]
	s.marks = slices.Delete(s.marks, i, i+1)
	if k.pos <= s.proven {
		return
	}
	covered := k.pos - s.proven               // work the event covers since the last proof
	ran := max(min(s.ran, k.pos)-s.proven, 0) // of which the replay ran
	behind := k.pos - max(s.ran, s.proven)    // proven done, still queued in the replay
	burst := k.comp.minus(s.provenComp)
	s.proven = k.pos
	s.provenComp = k.comp
	unseen, released := s.unseen, s.released
	s.unseen, s.released = false, false
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
	waited := h.DurationNS >= uint64(realWait)
	stopped := m.pausedDuring(c, h.Start, h.End)
	var early float64 // how long before the GPU's the replay's drain came
	if waited && k.crossed > 0 && k.crossed+uint64(realWait) < now {
		early = float64(now - max(k.crossed, h.Start))
	}
	if r := m.replayOf(c.gpu); waited && r.outOfPhase(early, ran <= 0 && behind > 0) && !unseen && !stopped {
		r.anchor(c) // as in sync
	}
	if covered <= 0 || unseen || stopped {
		if covered > 0 {
			m.traceProof(c, Proof{At: done, Of: e.Of, WaitNS: done - h.Start, RanNS: ran, LeftNS: max(behind, 0),
				Skipped: skipped(unseen, stopped)})
		}
		return
	}
	switch {
	case behind > 0 && !c.learned && waited:
		if ran <= 0 { // as in sync: the replay ran the others first
			og, ol := c.othersSinceEmpty([]uint64{s.id})
			ran, covered = og, covered+og+ol
		}
		if ran > 0 {
			c.learn(min(ran, float64(done-h.Start))/covered, burst)
			m.traceProof(c, Proof{At: done, Of: e.Of, First: true, WaitNS: done - h.Start, RanNS: ran, LeftNS: covered - ran})
		} else {
			m.traceProof(c, Proof{At: done, Of: e.Of, WaitNS: done - h.Start, LeftNS: covered, Skipped: skipped(false, false)})
		}
		// Else the replay gave the context no turn before the proof: its
		// phase is off (another's slice still runs there), and the work
		// scaled to nothing would read 0% for the many proofs a learned
		// cost takes to climb back.
	case !c.learned:
		// A sync that did not wait proves the work done, not how long it
		// took: scaled by what the replay ran of a guess, the costs would
		// collapse (a paced tenant, whose kernels finish between its
		// spaced launches, never waits).
	default:
		late := max(behind, 0)
		if pl, pe, ok := m.pollLateness(c, h, e, late, k.crossed); ok {
			late, early = pl, pe
		}
		if released {
			early = max(early-m.releaseSlack(c), 0)
		}
		taught := m.lateness(c, late, early)
		c.prove(taught, covered, burst)
		m.traceProof(c, Proof{At: done, Of: e.Of, WaitNS: done - h.Start, RanNS: ran, LeftNS: max(behind, 0), LateNS: taught})
	}
}

// releaseSlack is how much of an early drain a proof of work the launch
// gate released leaves untaught: the longest slice of the other
// contexts with work on c's GPU. Released one launch at a time, work
// reaches the GPU at a point of the others' rotation the replay does not
// know, and the sync returns after the host's wake-ups around the release
// and the completion (0.1–1 ms on a loaded host): taught as early drains,
// those raised a paced tenant's costs at every proof, and the tenant,
// charged the raised costs, was held below its rate (12% for 25). A
// drain earlier than that still teaches its excess.
func (m *Meter) releaseSlack(c *gpuContext) float64 {
	r := m.replayOf(c.gpu)
	var slack uint64
	for _, o := range r.runlist {
		if o != c && o.runnable() {
			slack = max(slack, r.sliceOf(o))
		}
	}
	return float64(slack)
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

// othersIdle tells whether no context but c has work the replay may run
// (a paused context's queue waits; it takes no turn).
func (m *Meter) othersIdle(c *gpuContext) bool {
	for _, o := range m.replayOf(c.gpu).runlist {
		if o != c && o.runnable() {
			return false
		}
	}
	return true
}

// turnPart is the part of the GPU's time c receives in round robin while
// it has work: its timeslice over the slices of c and of the contexts the
// replay may run (paused ones take no turn). With equal slices it is one
// over their number; with the weighted slices gpuarb sets it is not, and
// learning an early drain at one over their number misprices a context
// whose slice is far from the others' by the ratio of the two.
func (m *Meter) turnPart(c *gpuContext) float64 {
	r := m.replayOf(c.gpu)
	own := float64(r.sliceOf(c))
	total := own
	for _, o := range r.runlist {
		if o != c && o.runnable() {
			total += float64(r.sliceOf(o))
		}
	}
	return own / total // slices are never 0: the GPU's default stands in
}

// Proof is one completion proof that taught a context its costs, as
// Config.Proofs receives it: what the replay did with the proven work and
// what the meter learned from it.
type Proof struct {
	PID uint32
	// At is when the work completed (the waiting thread's wake-up, or the
	// call's return), CLOCK_MONOTONIC ns.
	At uint64
	Of ioctlspy.WaitTarget // what was synchronized
	// First is set for the context's first proof, which scales its
	// guessed costs whole.
	First bool
	// WaitNS is how long the process waited in the call.
	WaitNS uint64
	// RanNS is the GPU time the replay gave the proven work; LeftNS what
	// it still had of it queued.
	RanNS, LeftNS float64
	// LateNS is what a later proof taught, in the context's own work:
	// costs too high by that much where positive, too low where negative
	// (lateness).
	LateNS float64
	// TurnPart is the context's part of the replay's round robin then.
	TurnPart float64
	// Skipped says why a proof taught nothing (empty where it taught): the
	// replay had not begun the proven work, the process was stopped
	// during the wait, or the work was queued before the meter saw it.
	// What the replay still had of it (LeftNS) is dropped all the same.
	Skipped string
	// LaunchNS is its modeled cost of a launch once taught.
	LaunchNS float64
}

// traceProof hands a proof to Config.Proofs, where one is set.
func (m *Meter) traceProof(c *gpuContext, p Proof) {
	if m.cfg.Proofs == nil {
		return
	}
	p.PID, p.TurnPart, p.LaunchNS = c.pid, m.turnPart(c), c.launchCost()
	m.cfg.Proofs(p)
}

// skipped is why a proof that taught nothing did not (Proof.Skipped).
func skipped(unseen, stopped bool) string {
	switch {
	case stopped:
		return "the process was stopped during the wait"
	case unseen:
		return "the work was queued before the meter saw it"
	}
	return "the replay had not begun the proven work"
}
