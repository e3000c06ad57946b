package enforce

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuarb/gpuarb/arbiter"
	"github.com/gpuarb/gpuarb/control"
	"github.com/gpuarb/gpuarb/gpusched"
	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/meter"
	"github.com/gpuarb/gpuarb/policy"
)

// Latency holds: on a GPU whose scheduler gpuarb steers, the other
// tenants' channel groups go off the GPU the moment a latency tenant
// launches work and come back when its wait for that work ends.
//
// Slices alone bound a latency tenant's wait for the GPU by the others'
// shortest timeslices, one per other group ahead of it in the rotation,
// plus a context switch each. Where a switch costs hundreds of µs (an
// H200 switched in about 256 µs, e2e/realgpu), the shortest slice worth
// having is a millisecond, and an inference request of 1 ms waited up to
// two of them: 3.3× its time alone on the simulated GPU at those costs.
// A hold cuts that to the time the daemon takes to act (its launch wakes
// the event reader at once: bpf.Probes.SetUrgent) and one switch (HoldMode
// says how the others go: evicted, or descheduled).
//
// Where switches are cheap the slices win: at the simulated GPU's default
// 20 µs switch the others' slices are 100 µs, and a hold took 0.5 ms to
// start on this project's 2-CPU VM. So a GPU's holds go on only while the
// time they take to start (the median of the last ones) is shorter than the
// wait the slices bound, the others' groups times the GPU's shortest
// slice; where they are off, one hold a second measures them again.
const (
	// defaultMaxHold bounds one hold (LatencyHold.MaxHold): a latency
	// tenant that launches and does not wait (or whose wait gpuarb does
	// not see) lets the others run again after it, for holdRest before it
	// can hold them again.
	defaultMaxHold = 20 * time.Millisecond
	holdRest       = 5 * time.Millisecond
	// holdSignals is how many launches and waits the event reader may
	// queue for the hold loop before it drops them (a dropped launch costs
	// one request its hold, a dropped wait ends a hold at MaxHold).
	holdSignals = 1024
	// holdRetry spaces the tries to resume the others where the driver
	// refused it.
	holdRetry = 10 * time.Millisecond
	// maxHeldGroups bounds the groups one hold takes off a GPU: every one
	// is a control to the driver, and a hold that takes longer to start
	// than a slice lasts gains the latency tenant nothing (its slices
	// still bound its wait there).
	maxHeldGroups = 32
	// holdProbe spaces the holds that measure how long a hold takes to
	// start on a GPU where holds are off because they took longer than
	// its slices bound a wait.
	holdProbe = time.Second
	// holdStarts is how many of a GPU's last holds' starts their median
	// takes: a host stall of milliseconds (this VM has them) delays one,
	// and a GPU's first holds also record its groups (their timeslices
	// read, the ledger written: 2.8 ms once), neither of which should turn
	// holds off.
	holdStarts = 15
	// minHoldStarts is how many holds a GPU starts before their median
	// can turn its holds off. The first one also records the groups, and
	// the median of two is the slower: with one hold a second after that,
	// a GPU whose first hold took 2.8 ms held nothing for its latency
	// tenant's first two seconds (request p50 2.3 ms on the GPU where
	// holds read 1.7 ms: the simulator at an H200's costs).
	minHoldStarts = 5
)

// HoldMode is how latency holds take the other tenants' channel groups
// off the GPU.
type HoldMode int

const (
	// HoldEvict evicts them at once (FIFO_DISABLE_CHANNELS preempting
	// what runs): the driver answers once they are off the GPU. Such
	// holds go on only while they start sooner than the others' slices
	// bound the wait: on the simulated GPU at an H200's costs, not on the
	// real-GPU check's H200, whose driver answered 2 ms later for two
	// burners.
	HoldEvict HoldMode = iota
	// HoldDeschedule stops scheduling them (bOnlyDisableScheduling): what
	// runs of them finishes its slice, so a hold never lengthens a
	// latency tenant's wait, however slowly the driver answers, and every
	// launch holds. The others lose the GPU while the latency tenant's
	// work is pending and until the driver has put them back (1.5 ms on
	// that H200): there its requests' p99 beside two burners read 2.7 ms
	// against 4.5 ms without holds, and the GPU was busy 84% of the time
	// (e2e/realgpu).
	HoldDeschedule
	// HoldOff starts no holds: the others' slices bound a latency
	// tenant's wait.
	HoldOff
)

var holdModeNames = []string{"evict", "deschedule", "off"}

// String names the mode as ParseHoldMode reads it.
func (m HoldMode) String() string {
	if int(m) < len(holdModeNames) {
		return holdModeNames[m]
	}
	return fmt.Sprintf("HoldMode(%d)", int(m))
}

// ParseHoldMode reads a HoldMode by its name: evict, deschedule or off.
func ParseHoldMode(s string) (HoldMode, error) {
	if i := slices.Index(holdModeNames, s); i >= 0 {
		return HoldMode(i), nil
	}
	return 0, fmt.Errorf("%q: want one of %s", s, strings.Join(holdModeNames, ", "))
}

// HoldPlan is who holds whom, from the last control step: per urgent
// process (a latency tenant's) the GPUs it holds, and per GPU the other
// tenants' channel groups a hold takes off it. A process with groups on
// several GPUs holds all of them at a launch: the launch's record does not
// say which GPU it goes to. A process of a latency tenant that the step
// did not see with groups (new since) holds every GPU the plan holds,
// found by its cgroup (cgroups: the latency tenants' own and those their
// processes were seen in), until the next step: a service's first
// requests waited through the others' slices for up to a control period
// (p50 3.5 ms in its first 100 ms, 1.7 ms after, at an H200's costs).
type HoldPlan struct {
	gpusOf  map[uint32][]int
	cgroups map[uint64][]int
	others  map[int][]gpusched.Group
	// mates are the held groups' processes: never urgent by their cgroup
	// (a tenant nested in a latency tenant's cgroup).
	mates map[uint32]bool
	// bound is per GPU the longest a latency tenant's work waits for a
	// turn without a hold: one shortest slice per other group.
	bound map[int]time.Duration
}

// PlanHolds is a control step's plan: on every GPU whose scheduler
// gpuarb steers, while it enforces, the processes of latency tenants with
// channel groups there hold the groups of the other tenants busy there (at
// most maxHeldGroups); so do those found by the latency tenants' cgroups
// (urgentCgroups) on every such GPU.
func PlanHolds(enforcing bool, actuation map[int]arbiter.Actuation, bounds map[int]gpusched.Slices, res control.Result,
	groups map[string]map[int][]gpusched.Group, urgentCgroups []uint64) *HoldPlan {
	p := &HoldPlan{gpusOf: map[uint32][]int{}, cgroups: map[uint64][]int{}, others: map[int][]gpusched.Group{},
		mates: map[uint32]bool{}, bound: map[int]time.Duration{}}
	if !enforcing {
		return p
	}
	urgent := map[int][]uint32{}
	others := map[int][]gpusched.Group{}
	for _, in := range res.Inputs {
		ct := res.Tenants[in.Name]
		if in.Unsteered || ct == nil || actuation[in.GPU] != arbiter.Scheduler {
			continue
		}
		// A latency tenant holds from its first launch, before any step
		// has seen it busy: its first requests waited through the
		// others' base slices.
		for _, g := range groups[in.Name][in.GPU] {
			switch {
			case ct.Rules.Priority == policy.Latency:
				urgent[in.GPU] = append(urgent[in.GPU], g.PID)
			case in.Busy:
				others[in.GPU] = append(others[in.GPU], g)
			}
		}
	}
	var held []int
	for gpu, others := range others {
		urgent := urgent[gpu]
		if len(urgent) == 0 && len(urgentCgroups) == 0 || len(others) > maxHeldGroups {
			continue
		}
		held = append(held, gpu)
		slices.SortFunc(others, func(a, b gpusched.Group) int {
			return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.Client, b.Client), cmp.Compare(a.TSG, b.TSG))
		})
		p.others[gpu] = others
		floor := time.Duration(arbiter.DefaultSlices.Min)
		if sl, ok := bounds[gpu]; ok {
			floor = sl.Min
		}
		p.bound[gpu] = time.Duration(len(others)) * floor
		for _, g := range others {
			p.mates[g.PID] = true
		}
		for _, pid := range urgent {
			if !slices.Contains(p.gpusOf[pid], gpu) {
				p.gpusOf[pid] = append(p.gpusOf[pid], gpu)
			}
		}
	}
	for _, gs := range p.gpusOf {
		slices.Sort(gs)
	}
	if len(held) > 0 {
		slices.Sort(held)
		for _, cg := range urgentCgroups {
			p.cgroups[cg] = held
		}
	}
	return p
}

// gpusOfProcess returns the GPUs a latency tenant's process holds at a launch:
// its own, or by its cgroup every GPU the plan holds (nil: none).
func (p *HoldPlan) gpusOfProcess(pid uint32, cgroupID uint64) []int {
	if gpus := p.gpusOf[pid]; gpus != nil || p.mates[pid] {
		return gpus
	}
	return p.cgroups[cgroupID]
}

// holdSignal is a latency tenant's process launching work (work) or
// ending a wait for it.
type holdSignal struct {
	pid  uint32
	gpus []int // the GPUs it holds (holdPlan.gpusOfProcess)
	work bool
	at   uint64 // the record's time, CLOCK_MONOTONIC ns
}

// HoldStats counts one GPU's latency holds.
type HoldStats struct {
	Holds uint64        // holds started
	Cut   uint64        // holds ended by MaxHold, not by the wait's end
	Held  time.Duration // the others' time off the GPU
	// Start is how long a hold takes to start, from the latency tenant's
	// launch to the others off the GPU (the median of the last
	// holdStarts); Bound the
	// wait the slices bound without one (holdPlan.bound). Holds are on
	// while Start is the shorter.
	Start, Bound time.Duration
}

// gpuHold is the hold loop's state of one GPU.
type gpuHold struct {
	pending   map[uint32]bool // urgent processes with work launched and not waited for
	held      []gpusched.Group
	since     time.Time
	restUntil time.Time
	starts    []time.Duration // how long the last holds took to start, oldest first
	start     time.Duration   // their median (0: none yet)
	probed    time.Time       // when the last hold began
}

// LatencyHold runs the holds. Its plan and the urgent processes change
// with every control step (setPlan); the event reader feeds it (observe).
type LatencyHold struct {
	// pause takes groups off their GPU (off) or lets them run again, as
	// far as the holds are concerned (steering.pause byHold).
	pause  func(groups []gpusched.Group, off bool) error
	urgent func(pids []uint32, cgroups []uint64) error // bpf.Probes.SetUrgent
	// everyLaunch holds at every launch, however slowly holds start
	// (HoldDeschedule: such a hold never lengthens the wait).
	everyLaunch bool
	// MaxHold bounds one hold (0: 20 ms); set before Run.
	MaxHold time.Duration
	log     *slog.Logger
	plan    atomic.Pointer[HoldPlan]
	signals chan holdSignal

	mu    sync.Mutex
	stats map[int]HoldStats
}

func NewLatencyHold(pause func([]gpusched.Group, bool) error, urgent func([]uint32, []uint64) error, everyLaunch bool, log *slog.Logger) *LatencyHold {
	return &LatencyHold{pause: pause, urgent: urgent, everyLaunch: everyLaunch, log: log,
		signals: make(chan holdSignal, holdSignals), stats: map[int]HoldStats{}}
}

// SetPlan replaces the plan and the processes whose records wake the
// event reader at once.
func (h *LatencyHold) SetPlan(p *HoldPlan) {
	old := h.plan.Swap(p)
	if old != nil && maps.EqualFunc(old.gpusOf, p.gpusOf, slices.Equal) && maps.EqualFunc(old.cgroups, p.cgroups, slices.Equal) {
		return
	}
	if err := h.urgent(slices.Sorted(maps.Keys(p.gpusOf)), slices.Sorted(maps.Keys(p.cgroups))); err != nil {
		h.log.Warn("latency holds: mark urgent processes", "err", err)
	}
}

// Observe passes a latency tenant's launches and the ends of its waits to
// the hold loop. Called by the event reader for every event: a map lookup
// for the others.
func (h *LatencyHold) Observe(ev ioctlspy.Event) {
	p := h.plan.Load()
	if p == nil || len(p.gpusOf) == 0 && len(p.cgroups) == 0 {
		return
	}
	hdr := ev.Hdr()
	gpus := p.gpusOfProcess(hdr.PID, hdr.CgroupID)
	if gpus == nil {
		return
	}
	var work bool
	switch e := ev.(type) {
	case *ioctlspy.Launch, *ioctlspy.GraphLaunch, *ioctlspy.Submission:
		work = true
	case *ioctlspy.Copy:
		work = e.Async
	case *ioctlspy.Sync:
	default:
		return
	}
	select {
	case h.signals <- holdSignal{hdr.PID, gpus, work, hdr.Start}:
	default:
	}
}

// Stats returns every GPU's hold counts.
func (h *LatencyHold) Stats() map[int]HoldStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.stats)
}

// Run holds and releases until ctx ends, then releases every hold.
func (h *LatencyHold) Run(ctx context.Context) {
	gpus := map[int]*gpuHold{}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	defer func() {
		for gpu, g := range gpus {
			if g.held != nil {
				h.release(gpu, g, false)
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-h.signals:
			p := h.plan.Load()
			for _, gpu := range s.gpus {
				g := gpus[gpu]
				if g == nil {
					g = &gpuHold{pending: map[uint32]bool{}}
					gpus[gpu] = g
				}
				h.signal(gpu, g, s, p.others[gpu], p.bound[gpu])
			}
		case <-timer.C:
		}
		now := time.Now()
		next := time.Hour
		for gpu, g := range gpus {
			if g.held == nil {
				continue
			}
			left := h.maxHold() - now.Sub(g.since)
			if left <= 0 {
				h.release(gpu, g, true)
				continue
			}
			next = min(next, left)
		}
		timer.Reset(next)
	}
}

// signal starts GPU gpu's hold at a latency tenant's launch, and ends it
// when no latency tenant there has work pending. None starts while the
// GPU rests after a hold cut at MaxHold, nor, unless everyLaunch, while
// holds take longer to start than the slices bound the wait (but one a
// holdProbe).
func (h *LatencyHold) signal(gpu int, g *gpuHold, s holdSignal, others []gpusched.Group, bound time.Duration) {
	now := time.Now()
	if !s.work {
		delete(g.pending, s.pid)
		if g.held != nil && len(g.pending) == 0 {
			h.release(gpu, g, false)
		}
		return
	}
	g.pending[s.pid] = true
	slower := !h.everyLaunch && len(g.starts) >= minHoldStarts && g.start > bound && now.Sub(g.probed) < holdProbe
	if g.held != nil || len(others) == 0 || now.Before(g.restUntil) || slower {
		return
	}
	if err := h.pause(others, true); err != nil && !onlyGone(err) {
		h.log.Debug("latency hold", "gpu", gpu, "err", err)
	}
	g.held, g.since, g.probed = others, now, now
	took := time.Duration(max(int64(meter.MonotonicNow())-int64(s.at), 0))
	g.starts = append(g.starts, took)
	if len(g.starts) > holdStarts {
		g.starts = g.starts[1:]
	}
	g.start = median(g.starts)
	h.mu.Lock()
	st := h.stats[gpu]
	st.Holds++
	st.Start, st.Bound = g.start, bound
	h.stats[gpu] = st
	h.mu.Unlock()
}

// maxHold is MaxHold, or its default.
func (h *LatencyHold) maxHold() time.Duration { return cmp.Or(h.MaxHold, defaultMaxHold) }

// release ends GPU gpu's hold; cut says MaxHold ended it, which lets the
// others run for holdRest before the next.
func (h *LatencyHold) release(gpu int, g *gpuHold, cut bool) {
	now := time.Now()
	if err := h.pause(g.held, false); err != nil && !onlyGone(err) {
		// Still held: the run loop tries again in holdRetry.
		h.log.Warn("latency hold: resume the others", "gpu", gpu, "err", err)
		g.since = now.Add(holdRetry - h.maxHold())
		return
	}
	h.mu.Lock()
	st := h.stats[gpu]
	st.Held += now.Sub(g.since)
	if cut {
		st.Cut++
	}
	h.stats[gpu] = st
	h.mu.Unlock()
	g.held = nil
	if cut {
		g.restUntil = now.Add(holdRest)
		clear(g.pending)
	}
}

// median is the median of ds (which it leaves in order).
func median(ds []time.Duration) time.Duration {
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}
