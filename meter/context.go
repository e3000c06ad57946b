package meter

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/gpuarb/gpuarb/ioctlspy"
)

type span struct{ start, end uint64 }

// appendSpan adds [s, e) to spans, merging with the last one when they touch.
func appendSpan(spans []span, s, e uint64) []span {
	if n := len(spans); n > 0 && spans[n-1].end == s {
		spans[n-1].end = e
		return spans
	}
	return append(spans, span{s, e})
}

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

// dropSpans forgets spans that ended before cut.
func dropSpans(spans []span, cut uint64) []span {
	i := 0
	for i < len(spans) && spans[i].end < cut {
		i++
	}
	return spans[i:]
}

// costKey names what a launch runs: a kernel function, costed per block of
// its grid, or an instantiated graph, costed per launch. The two learn
// apart, each from the syncs that cover its launches.
type costKey struct {
	graph  bool
	handle uint64
}

// cost is what the meter knows of one costKey: ns per block (a kernel) or
// per launch (a graph), and whether a proof has taught it yet.
type cost struct {
	ns      float64
	learned bool
}

// Initial cost guesses: large enough that a context counts as backlogged
// until a draining sync teaches the meter its costs. A guess high rather
// than low: the evidence that lowers a cost (work the replay still has
// queued when a sync proves it done) is sharp, the evidence that raises
// one (a drain later than the replay's) is blurred by the time-slicing's
// phase.
const (
	initialNSPerBlock = 1e9
	initialNSPerGraph = 1e12
)

// composition is how much of a stream's modeled work each costKey made,
// cumulative since the stream began.
type composition map[costKey]float64

func (c composition) clone() composition {
	out := make(composition, len(c))
	for k, v := range c {
		out[k] = v
	}
	return out
}

// minus is c − o, keys with no work dropped.
func (c composition) minus(o composition) composition {
	out := composition{}
	for k, v := range c {
		if d := v - o[k]; d > 1 {
			out[k] = d
		}
	}
	return out
}

// stream is one stream's modeled queue.
type stream struct {
	id       uint64  // the stream's key (ioctlspy stream keys)
	left     float64 // modeled ns of work not yet run
	got      float64 // GPU ns received since the queue was last empty
	drained  uint64  // when the queue last became empty
	launched bool    // work since the last draining sync
	// Positions in the stream's modeled work, cumulative: enq was
	// enqueued, ran has run in the replay, proven is known complete (the
	// last sync or synchronized event).
	enq, ran, proven float64
	// comp is the work enqueued per costKey, cumulative; provenComp what
	// of it was proven complete.
	comp, provenComp composition
	marks            []mark // recorded events not yet synchronized, by position
	// bounds are where its queued kernels end (positions, ascending): a
	// GPU that does not preempt switches contexts only there.
	bounds []float64
	// unseen is set until the first sync of a stream that may hold work
	// queued before the meter could see it: that sync proves nothing.
	unseen bool
	// released is set, until the next proof, once work the launch gate
	// held reached the stream at its release (releaseSlack).
	released bool
	// capturing is set while the stream is in a stream capture (that of
	// stream captureOf): what is launched on it builds a graph.
	capturing bool
	captureOf uint64
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
// to pos has run; comp is the stream's composition at the record.
type mark struct {
	event   uint64
	pos     float64
	comp    composition
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

// wait is a wait for the GPU in progress: a synchronizing call entered,
// or a polling loop that found its work not done.
type wait struct {
	of     ioctlspy.WaitTarget
	handle uint64
	since  uint64
}

// gpuContext is what the meter keeps of one process using a GPU.
type gpuContext struct {
	pid    uint32
	ctx    uint64 // its CUDA context's handle (0: the process's first)
	cgroup uint64
	gpu    int
	// groupGPU is set once its channel group put it on gpu: the ordinal
	// its cuCtxCreate named then moves it no more.
	groupGPU bool
	streams  []*stream // in order of first use
	turn     *stream   // the stream whose kernel runs in the replay
	// unseenBefore is set for a process that ran before the meter could
	// see it: each of its streams first seen may hold unseen work.
	unseenBefore bool
	costs        map[costKey]*cost
	learned      bool // a proof has taught any of its costs
	// evidence sums, per learned key, the proofs not applied yet.
	evidence map[costKey]*evidence
	// timeslice is its channel group's own timeslice (0: the GPU's), and
	// paused set while gpuarb keeps its group off the GPU; pauseAt, where
	// gpuarb descheduled the group while the replay ran it, is when the
	// slice it is in ends and the pause begins (0: none pending).
	timeslice time.Duration
	paused    bool
	pauseAt   uint64
	// unprobed is set for a process whose launches no probe sees (it has
	// GPU channels but maps no probed libcuda): the replay gives it work
	// whenever it may run, none while its cgroup is frozen (frozenNow).
	unprobed  bool
	frozenNow bool
	held      []span // when the replay gave it the GPU, oldest first
	waited    []span // when it had work but another context held the GPU
	// waitedFor are its finished waits for the GPU (syncs, polls), waits
	// those in progress; pausedFor when gpuarb kept its group off the GPU.
	waitedFor []span
	waits     []wait
	pausedFor []span
	launches  []uint64
	syncs     []span // sync calls that returned, by return time
	// drains are when its modeled work ran out (the replay ran it dry or
	// a sync proved it done): a closed loop drains once a turn.
	drains []uint64
	// capturedEvents are events recorded in a stream capture, by the
	// stream whose capture they belong to: a stream that waits on one
	// joins that capture (capture.go).
	capturedEvents map[uint64]uint64
	exited         bool
	total          Totals // since the context appeared in its cgroup and on its GPU
	since          uint64 // its first event
	// tsgAt is when its first channel group was allocated (0: not seen):
	// its place on the GPU's runlist.
	tsgAt uint64
	// deferred are the launches the launch gate held, in the order they
	// were held: they reach the GPU when the process is released
	// (HoldReleased, or its next event), not when they were seen.
	deferred   []heldLaunch
	releasedAt uint64
	// releaseAt is when deferred run, a release reported ahead of the
	// replay's present (0: none pending): the replay reaches it in time
	// order, after the events still on their way from the probes.
	releaseAt uint64
	stopped   []span // when the launch gate held the process
	// shape is its recent launches by costKey (LaunchCost prices it at
	// the costs learned since); launchN counts the launches it has seen.
	shape   map[costKey]*keyShape
	launchN float64
}

// keyShape is one costKey's part of a context's recent launches: the
// fraction of them it makes and the units (blocks) of one, smoothed.
type keyShape struct{ frac, units float64 }

// heldLaunch is a launch waiting for its process's release.
type heldLaunch struct {
	stream uint64
	key    costKey
	units  float64 // blocks, or 1 for a graph
	heldAt uint64  // when the launch gate held it (0: not held)
}

// launchShapeWeight is the weight of one launch in a context's smoothed
// launch shape, after a running mean over the first launches.
const launchShapeWeight = 0.1

// maxShapeKeys bounds the costKeys a launch shape follows; the rarest
// make way for a new one.
const maxShapeKeys = 64

// noteLaunch adds one launch of units of key k to the launch shape.
func (c *gpuContext) noteLaunch(k costKey, units float64) {
	c.launchN++
	w := max(launchShapeWeight, 1/c.launchN)
	for _, s := range c.shape {
		s.frac *= 1 - w
	}
	s := c.shape[k]
	if s == nil {
		if len(c.shape) >= maxShapeKeys {
			var rarest costKey
			least := 2.0
			for key, x := range c.shape {
				if x.frac < least {
					rarest, least = key, x.frac
				}
			}
			delete(c.shape, rarest)
		}
		s = &keyShape{units: units}
		c.shape[k] = s
	}
	s.frac += w
	s.units += w * (units - s.units)
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

// unprobedWork is what an unprobed context has queued while it may run:
// more than any replay step covers, so it never drains.
const unprobedWork = float64(time.Hour)

func (c *gpuContext) left() float64 {
	if c.unprobed {
		if c.frozenNow || c.exited {
			return 0
		}
		return unprobedWork
	}
	var l float64
	for _, s := range c.streams {
		l += s.left
	}
	return l
}

// runlistAt is what orders the context on its GPU's runlist: when its
// channel group was allocated, or its first event where the meter saw no
// allocation (a process that ran before the meter started).
func (c *gpuContext) runlistAt() uint64 {
	if c.tsgAt != 0 {
		return c.tsgAt
	}
	return c.since
}

// runnable tells whether the replay may give the context the GPU: it has
// modeled work and gpuarb does not keep its group off the GPU.
func (c *gpuContext) runnable() bool { return !c.paused && c.left() > 0 }

// setPaused keeps the group off the GPU from t, or puts it back; a
// pending deschedule is settled either way.
func (c *gpuContext) setPaused(paused bool, t uint64) {
	c.pauseAt = 0
	if c.paused == paused {
		return
	}
	c.paused = paused
	if paused {
		c.pausedFor = append(c.pausedFor, span{t, math.MaxUint64})
	} else if n := len(c.pausedFor); n > 0 {
		c.pausedFor[n-1].end = max(t, c.pausedFor[n-1].start)
	}
}

// costOf returns the cost of a key, a guess until learned.
func (c *gpuContext) costOf(k costKey) *cost {
	if x := c.costs[k]; x != nil {
		return x
	}
	x := &cost{ns: initialNSPerBlock}
	if k.graph {
		x.ns = initialNSPerGraph
	}
	c.costs[k] = x
	return x
}

// work is the modeled GPU time of units of key k.
func (c *gpuContext) work(k costKey, units float64) float64 { return units * c.costOf(k).ns }

// run gives the context dt ns of GPU time from t. Its streams share it as
// the GPU runs one context's kernels: one kernel at a time, whole, the
// streams taking turns kernel by kernel (the simulated GPU's round robin
// over a group's channels; a real GPU's work distributor, for kernels that
// fill it, starts them in about that order). Shared at once instead, each
// stream's burst drained later than on the GPU, and the event or stream
// syncs of a multi-stream loop proved its costs too high at every turn
// but the last (4 streams of 0.2–1.4 ms kernels alone read 81% for 90%).
func (c *gpuContext) run(t, dt uint64) {
	c.held = appendSpan(c.held, t, t+dt)
	c.total.GPUNS += dt
	if c.unprobed {
		return
	}
	rest, at := float64(dt), float64(t)
	for rest > 0 {
		s := c.runningStream()
		if s == nil {
			break
		}
		end := s.toKernelEnd()
		step := min(rest, end)
		s.got += step
		s.ran += step
		s.left -= step
		rest -= step
		at += step
		if s.left <= 1 {
			s.ran += max(s.left, 0)
			s.left = 0
			s.drained = uint64(at)
		}
		s.passMarks(uint64(at))
		s.passBounds()
		if step >= end-1 {
			c.turn = c.nextStream(s) // the kernel ended: the next stream's turn
		}
	}
	if c.left() == 0 {
		c.drains = append(c.drains, t+dt)
	}
}

// runningStream is the stream whose kernel the context runs: the one whose
// turn it is, or the next with work.
func (c *gpuContext) runningStream() *stream {
	if c.turn != nil && c.turn.left > 0 { // a stream dropped from streams has no work left
		return c.turn
	}
	c.turn = c.nextStream(c.turn)
	return c.turn
}

// nextStream is the first stream with work after s in the context's order
// (from the first when s is gone or nil), s itself if no other has work.
func (c *gpuContext) nextStream(s *stream) *stream {
	i := slices.Index(c.streams, s)
	for k := 1; k <= len(c.streams); k++ {
		if n := c.streams[(i+k)%len(c.streams)]; n.left > 0 {
			return n
		}
	}
	return nil
}

// toKernelEnd is the modeled work until the stream's running kernel ends
// (all it has queued where its kernel ends were not kept).
func (s *stream) toKernelEnd() float64 {
	if len(s.bounds) > 0 {
		return max(min(s.bounds[0]-s.ran, s.left), 1)
	}
	return max(s.left, 1)
}

// backlog is the modeled work queued now, once costs are learned.
// queued is the modeled work queued now, at the costs learned or guessed
// (0 for an unprobed context, whose work is not modeled).
func (c *gpuContext) queued() uint64 {
	if c.unprobed {
		return 0
	}
	return uint64(c.left())
}

func (c *gpuContext) backlog() uint64 {
	if !c.learned {
		return 0
	}
	return uint64(c.left())
}

// toBoundary is the replay time until the context's running kernel ends.
func (c *gpuContext) toBoundary() float64 {
	if s := c.runningStream(); s != nil {
		return s.toKernelEnd()
	}
	return max(c.left(), 1)
}

// wantedIn is how long within [from, to) the context wanted the GPU: it
// had work modeled (held or waited in the replay), waited for the GPU in a
// sync or a polling loop, or was kept from it by gpuarb (held at the
// launch gate, paused, or its cgroup frozen: frozen). The evidence of
// waits and stops does not depend on the modeled queue.
func (c *gpuContext) wantedIn(from, to uint64, frozen []span) float64 {
	var open []span
	for _, w := range c.waits {
		open = append(open, span{w.since, to})
	}
	if c.paused && len(c.pausedFor) == 0 {
		open = append(open, span{from, to})
	}
	slices.SortFunc(open, byStart)
	return unionLength(from, to, c.held, c.waited, c.waitedFor, c.stopped, c.pausedFor, frozen, open)
}

func byStart(a, b span) int { return cmp.Compare(a.start, b.start) }

// unionLength is the length within [from, to) of the union of the spans
// of lists. A list in time order (each span starting at or after the one
// before: the replay appends them as it advances) is merged as it stands,
// in one pass over all lists; otherwise the spans are copied and sorted.
// The replay's list of a launch-bound context holds a span per kernel,
// hundreds of thousands a second.
func unionLength(from, to uint64, lists ...[]span) float64 {
	for _, l := range lists {
		if !slices.IsSortedFunc(l, byStart) {
			var all []span
			for _, l := range lists {
				all = append(all, l...)
			}
			slices.SortFunc(all, byStart)
			return unionLength(from, to, all)
		}
	}
	next := make([]int, len(lists))
	var total float64
	var cur span
	started := false
	for {
		// The list whose next span within [from, to) starts first.
		best, bestSpan := -1, span{}
		for i, l := range lists {
			for next[i] < len(l) {
				sp := l[next[i]]
				if s, e := max(sp.start, from), min(sp.end, to); e > s {
					if best < 0 || s < bestSpan.start {
						best, bestSpan = i, span{s, e}
					}
					break
				}
				next[i]++
			}
		}
		if best < 0 {
			break
		}
		next[best]++
		switch {
		case !started:
			cur, started = bestSpan, true
		case bestSpan.start <= cur.end:
			cur.end = max(cur.end, bestSpan.end)
		default:
			total += float64(cur.end - cur.start)
			cur = bestSpan
		}
	}
	if started {
		total += float64(cur.end - cur.start)
	}
	return total
}

// Bounds on what one context keeps, whatever handles its process passes:
// streams (a drained one makes way for a new one; with none drained, the
// new stream's work goes to overflowStream) and cost keys (beyond the
// bound, new kernels and graphs share overflowKey). Real processes stay
// far below both (PyTorch uses tens of streams and hundreds of kernels).
const (
	maxStreams  = 1024
	maxCostKeys = 4096
)

// overflowStream and overflowKey take what a context's bounds have no
// room for.
const overflowStream = ^uint64(0) - 1

var overflowKey = costKey{handle: ^uint64(0) - 1}

// restoredStream and restoredKey hold the work a daemon before this one
// modeled queued (Meter.RestoreBacklog).
const restoredStream = ^uint64(0) - 2

var restoredKey = costKey{handle: ^uint64(0) - 2}

// stream returns the stream with key h, made on first use; folded is set
// when the bound sent h's work to the overflow stream.
func (c *gpuContext) stream(h uint64) (s *stream, folded bool) {
	if s := c.findStream(h); s != nil {
		return s, false
	}
	if len(c.streams) >= maxStreams {
		i := slices.IndexFunc(c.streams, func(s *stream) bool {
			return s.left <= 0 && len(s.marks) == 0 && !s.capturing && s.id != overflowStream && s.id != restoredStream
		})
		if i < 0 {
			if s := c.findStream(overflowStream); s != nil {
				return s, true
			}
			// The oldest stream, its work kept, becomes the overflow.
			c.streams[0].id = overflowStream
			return c.streams[0], true
		}
		c.streams = slices.Delete(c.streams, i, i+1)
	}
	s = &stream{id: h, comp: composition{}, provenComp: composition{}, unseen: c.unseenBefore}
	c.streams = append(c.streams, s)
	return s, false
}

// keyFor returns k, or overflowKey once the context has maxCostKeys costs
// and k is not one of them; folded tells which.
func (c *gpuContext) keyFor(k costKey) (key costKey, folded bool) {
	if _, ok := c.costs[k]; ok || len(c.costs) < maxCostKeys {
		return k, false
	}
	return overflowKey, true
}

// findStream returns the stream with key h, nil if it has none.
func (c *gpuContext) findStream(h uint64) *stream {
	for _, s := range c.streams {
		if s.id == h {
			return s
		}
	}
	return nil
}

// learn teaches the keys of a burst of the context's work (its
// composition by costKey) not learned yet their first cost, from a
// correction factor proven over the burst: taken whole, and all of it
// where there are learned keys in the burst too (they are assumed right;
// their later corrections come from evidence, prove). The work still
// queued scales with the costs.
func (c *gpuContext) learn(factor float64, burst composition) {
	if len(burst) == 0 || math.IsNaN(factor) || math.IsInf(factor, 0) || factor <= 0 {
		return
	}
	var known, unknown float64
	for k, w := range burst {
		if c.costOf(k).learned {
			known += w
		} else {
			unknown += w
		}
	}
	total := known + unknown
	newRate := factor // what the burst's unlearned keys' guesses scale by
	if known > 0 && unknown > 0 {
		// The burst's true work less what the learned costs made is the
		// unlearned ones': at least a little of that true work
		// (newKeyFloor), never a part of their guess — a percent of a
		// guess of 1 s a block still read a 0.25 ms kernel as 2.5 s.
		newRate = max(factor*total-known, newKeyFloor*factor*total) / unknown
	}
	rate := make(map[costKey]float64, len(burst)) // what each key's cost scaled by
	for k := range burst {
		// A learned key is assumed right: the burst's factor, dominated
		// by the guesses, cut it by a fifth at every new kernel.
		rate[k] = 1
		if x := c.costOf(k); !x.learned {
			rate[k] = newRate
			x.ns *= newRate
			x.learned = true
		}
	}
	c.learned = true
	// Queued work was costed at the old rates: each key's part scales with
	// its cost, or the next proof would correct the same error again; a
	// key still guessed scales as the burst's new ones did.
	for _, s := range c.streams {
		var was, is float64
		for k, w := range s.comp.minus(s.provenComp) {
			r, in := rate[k]
			switch {
			case !in && c.costOf(k).learned:
				r = 1
			case !in:
				r = newRate
			}
			was += w
			is += w * r
		}
		if was > 0 {
			s.rescale(is / was)
		}
	}
}

// rescale scales the stream's queued work (and the positions of its marks
// and kernel ends in it) by scale.
func (s *stream) rescale(scale float64) {
	if s.left <= 0 {
		return
	}
	s.left *= scale
	s.enq = s.ran + s.left
	for i := range s.marks {
		if s.marks[i].pos > s.ran {
			s.marks[i].pos = s.ran + (s.marks[i].pos-s.ran)*scale
		}
	}
	for i := range s.bounds {
		s.bounds[i] = s.ran + (s.bounds[i]-s.ran)*scale
	}
}

// learnKey corrects one learned key's cost by factor, and its part of the
// queued work with it: smoothed within maxStep (phase noise), a whole
// maxStep beyond it (the evidence says the cost is far off, and a smoothed
// step would take dozens of corrections to get there).
func (c *gpuContext) learnKey(k costKey, factor float64) {
	f := math.Pow(factor, learnRate)
	if factor > maxStep || factor < 1/maxStep {
		f = min(max(factor, 1/maxStep), maxStep)
	}
	c.costOf(k).ns *= f
	for _, s := range c.streams {
		pending := s.comp.minus(s.provenComp)
		var total float64
		for _, w := range pending {
			total += w
		}
		if total > 0 {
			s.rescale(1 + (f-1)*pending[k]/total)
		}
	}
}

// evidence is what a learned key's proofs said since its cost last moved:
// the replay's lateness (positive: the cost too high) against the modeled
// work they covered, each proof's split among the keys by their part of
// its work.
type evidence struct {
	late, covered float64
	proofs        int
}

// minFactor keeps a learned key's correction positive: lateness of all
// the covered work says the costs are far too high, not that the work was
// free. newKeyFloor is the least part of a burst's true work its new keys
// take where the learned ones made (nearly) all of it.
const (
	minFactor   = 1e-3
	newKeyFloor = 0.01
)

// prove adds one proof's lateness over covered work of composition burst.
// A proof that covers a key not learned yet corrects at once (a new kernel
// or graph is far off, not by a phase); a learned key corrects once its
// evidence sums evidenceWork or evidenceProofs (learn.go), by the share of
// its covered work the lateness says was not there, or was missing.
func (c *gpuContext) prove(late, covered float64, burst composition) {
	var total float64
	for _, w := range burst {
		total += w
	}
	if covered <= 0 || total <= 0 || math.IsNaN(late) || math.IsInf(late, 0) {
		return
	}
	for k := range burst {
		if !c.costOf(k).learned {
			// Taken whole, what the replay ran of the proven work is its
			// true work: no floor (minFactor) here, where the covered work
			// is mostly a new key's guess — a thousandth of a guess of 1 s
			// a block read a phase of 13 ms kernels as 13 s a launch. Where
			// the replay ran none of it, the proof teaches nothing yet.
			if f := 1 - late/covered; f > 0 {
				c.learn(f, burst)
			}
			return
		}
	}
	if c.evidence == nil {
		c.evidence = map[costKey]*evidence{}
	}
	for k, w := range burst {
		e := c.evidence[k]
		if e == nil {
			e = &evidence{}
			c.evidence[k] = e
		}
		e.late += late * w / total
		e.covered += covered * w / total
		e.proofs++
		if e.covered >= evidenceWork || e.proofs >= evidenceProofs || e.proofs >= decisiveProofs && math.Abs(e.late) >= evidenceWork {
			c.learnKey(k, max(1-e.late/e.covered, minFactor))
			delete(c.evidence, k)
		}
	}
}

// unlearnedCharge is what a launch of a kernel whose cost the context has
// not learned yet counts towards Submitted, which paces it at the launch
// gate: the mean cost of its launches of learned kernels, where it has
// any, else unlearnedCharge. A new kernel (a program's next phase, a
// cost key past its bound) charged at unlearnedCharge put a paced tenant
// of 0.1 ms kernels seconds in debt before its first sync: held through
// its syncs, which then teach nothing, it never learned the kernel and
// was held for good (0% for a target of 95%).
func (c *gpuContext) unlearnedCharge() float64 {
	if mean, ok := c.shapeMean(true); ok {
		return min(mean, unlearnedCharge)
	}
	return unlearnedCharge
}

// launchCost is the modeled GPU time of one of the context's launches, at
// the costs learned now; a key still a guess counts at most
// unlearnedCharge.
func (c *gpuContext) launchCost() float64 {
	mean, _ := c.shapeMean(false)
	return mean
}

// shapeMean is the mean modeled cost of a launch over the context's launch
// shape: of its kernels with learned costs alone (learnedOnly), or of all
// of them, a guessed one at most unlearnedCharge. ok is false where the
// shape holds no such kernel.
func (c *gpuContext) shapeMean(learnedOnly bool) (mean float64, ok bool) {
	var ns, frac float64
	for k, s := range c.shape {
		x := c.costOf(k)
		per := s.units * x.ns
		if !x.learned {
			if learnedOnly {
				continue
			}
			per = min(per, unlearnedCharge)
		}
		ns += s.frac * per
		frac += s.frac
	}
	if frac == 0 {
		return 0, false
	}
	return ns / frac, true
}
