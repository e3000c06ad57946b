// Package control is the control step's translation from the meter to
// the arbiter: it gives each process's figures to its tenant, adds them up
// per tenant and GPU, and reads from them what the arbiter acts on — the
// measured shares, what a tenant would take of the GPU (its demand), what
// one of its launches costs, its SLO figures. Step is a pure function of
// recorded inputs; the daemon keeps the tenants' lifecycle and applies the
// decisions.
//
// # The demand model
//
// What a tenant wants is read from evidence that does not depend on the
// meter's modeled queue: a process wants the GPU while it waits for it
// (blocked in a stream, context or event synchronize, or in a polling
// loop of event or stream queries that finds the work not done), while
// gpuarb keeps it from the GPU (held at the launch gate, its cgroup
// frozen, its channel group paused), and while the replay has its work
// queued. It is satisfied only while it demonstrably idles with nothing
// outstanding: from the completion reaching it (its thread's wake-up in
// the sync, or the replay's drain of the work where that is less than
// the meter's realWait before) to its next launch — its return path, its
// launch's and its completion's latencies and think time, host time it
// would spend alone too. (Counted as waiting, a closed loop of 40 µs
// kernels that takes 63% alone wanted the whole GPU; with the latencies
// counted, one that took 72% alone beside the daemon read as wanting
// 85%.)
//
//   - A process would take, alone, u / (u + idle) of the GPU: its share u
//     of the window and the part of the window it idled. A closed loop of
//     W ns of work and T ns of thought runs at W / (W + T) alone; under
//     contention its work takes longer but its thought does not, so the
//     estimate holds whatever its current share. (An open-loop service,
//     rate-limited, reads a little above what it would use; what it leaves
//     is not lost, the scheduler hands it to the others.)
//   - One that would take backloggedFraction (0.9) or more is backlogged:
//     it would take the whole GPU. The remainder allows for the time a
//     loop spends between a sync's return and its next launch.
//   - A process seen for less than minActive that wanted the GPU at all
//     wants all of it: it has just arrived and launched.
//   - A tenant's demand on a GPU is the sum of its processes', at most 1;
//     a tenant held back by gpuarb in the control window is busy and
//     backlogged for the arbiter's pacing (its queue may be empty because
//     it was held), its demand still its processes'.
//   - BurstNS, the work one of its channel groups brings to a turn on the
//     GPU, is its GPU time over the times its modeled work ran out: a
//     closed loop's work between syncs (0: it never ran out) — the mean of
//     its last bursts where the meter has them (RecentBurstNS, the largest
//     among its processes), or the turn in progress where that ran
//     runsLonger times as long.
//   - Waited, the part of the control window its work waited while other
//     contexts held the GPU (summed over its processes), tells a tenant
//     the others keep from its share from one its own host time holds
//     back: only the first is served by pausing them.
//
// A change of target cannot flip a tenant between wanting and satisfied:
// held back harder, it waits longer and thinks as long, and waiting is
// wanting.
package control

import (
	"math"
	"sort"
	"time"

	"github.com/gpuarb/gpuarb/arbiter"
	"github.com/gpuarb/gpuarb/meter"
	"github.com/gpuarb/gpuarb/policy"
)

// backloggedFraction is the demand alone from which a process counts as
// backlogged: the rest allows for the time a loop spends between its
// wake-up in a sync and its next launch (the return path, the probes'
// overheads, about 0.1–0.3 ms a sync here).
const backloggedFraction = 0.9

// runsLonger is how many times its recent bursts a tenant's turn in
// progress (ContextStats.RunNS) must have run for the turn to stand as its
// burst: the bursts then grew (a phase of longer kernels or fewer syncs),
// and the last ones, still short, would keep the others' slices shrunk to
// fit them while its now long turns took most of the GPU. A turn merely
// longer than the mean is a loop's ordinary spread.
// Bursts are read turn by turn, not as the window's mean (its GPU time
// over its drains), which lags a change of phase by up to a window.
const runsLonger = 2

// minActive is the shortest active time over which a process's idle time
// is trusted: one seen for less that wanted the GPU wants all of it (a
// tenant that has just arrived and launched wants its share at once).
const minActive = 20 * time.Millisecond

// Assignment is the tenant a process belongs to: a named policy entry, or
// the cgroup that no entry names (default rules).
type Assignment struct {
	Name   string
	Rules  policy.Rules
	Cgroup string // cgroup v2 path ("" for a pid tenant)
	PID    int    // a pid tenant's root process
}

// Input is one control step's recorded inputs.
type Input struct {
	// Window is the control window, Settled the meter's longer one.
	Window, Settled time.Duration
	// Short and Long are the meter's per-context figures over them.
	Short, Long []meter.ContextStats
	// Assign gives a process's tenant.
	Assign func(pid uint32, cgroupID uint64) Assignment
	// HeldBack tells whether gpuarb held a tenant back (launch gate,
	// freeze or pause) at some time in the control window.
	HeldBack func(name string) bool
}

// Member is one process of a tenant.
type Member struct {
	PID      uint32
	CgroupID uint64
	GPU      int
	Exited   bool
}

// Tenant is what a step found of one tenant.
type Tenant struct {
	Assignment
	Members   []Member
	CgroupIDs []uint64 // the cgroups its processes were seen in
	// LaunchNS is the GPU time of one of its launches, over all its GPUs:
	// its processes' costs weighted by their launches in the window.
	LaunchNS float64
	// GPUs are the arbiter's inputs per GPU, Usage its figures there over
	// the settled window.
	GPUs  map[int]*arbiter.Input
	Usage map[int]*Usage
}

// LivePIDs are its processes that have not exited (none for nil).
func (t *Tenant) LivePIDs() []uint32 {
	var pids []uint32
	if t != nil {
		for _, m := range t.Members {
			if !m.Exited {
				pids = append(pids, m.PID)
			}
		}
	}
	return pids
}

// Usage is a tenant's use of one GPU over the settled window, for status
// and metrics.
type Usage struct {
	GPUNS     uint64 // estimated GPU time
	WantNS    uint64 // its processes' wanted time, summed
	QueueNS   uint64 // its processes' time queued behind others, summed
	Launches  int
	Syncs     int
	Processes int // live processes
	// CgroupID is the cgroup of one of its processes (its own cgroup for a
	// cgroup tenant).
	CgroupID uint64
}

// Result is one step's translation.
type Result struct {
	Tenants map[string]*Tenant
	// Inputs are the arbiter's inputs, by GPU then name.
	Inputs []arbiter.Input
}

// Step translates one control step's inputs.
func Step(in Input) Result {
	res := Result{Tenants: map[string]*Tenant{}}
	type costs struct{ sum, n float64 }
	launch := map[string]*costs{}
	waits := map[*arbiter.Input][]uint64{}
	type turns struct{ gpuNS, drains, run, recent float64 }
	bursts := map[*arbiter.Input]*turns{}
	syncs := map[*arbiter.Input]int{}
	type procOnGPU struct {
		pid uint32
		gpu int
	}
	counted := map[procOnGPU]bool{} // a process counts once however many contexts it has
	type procOf struct {
		tenant string
		pid    uint32
	}
	memberAt := map[procOf]int{}
	for _, c := range in.Long {
		a := in.Assign(c.PID, c.CgroupID)
		t := res.Tenants[a.Name]
		if t == nil {
			t = &Tenant{Assignment: a, GPUs: map[int]*arbiter.Input{}, Usage: map[int]*Usage{}}
			res.Tenants[a.Name] = t
			launch[a.Name] = &costs{}
		}
		// A process is one member however many contexts it has; it has
		// exited when all have.
		if i, ok := memberAt[procOf{a.Name, c.PID}]; ok {
			t.Members[i].Exited = t.Members[i].Exited && c.Exited
		} else {
			memberAt[procOf{a.Name, c.PID}] = len(t.Members)
			t.Members = append(t.Members, Member{PID: c.PID, CgroupID: c.CgroupID, GPU: c.GPU, Exited: c.Exited})
		}
		if !containsID(t.CgroupIDs, c.CgroupID) {
			t.CgroupIDs = append(t.CgroupIDs, c.CgroupID)
		}
		g := t.GPUs[c.GPU]
		if g == nil {
			g = &arbiter.Input{Name: a.Name, GPU: c.GPU, Rules: a.Rules, Costed: true}
			t.GPUs[c.GPU] = g
		}
		u := t.Usage[c.GPU]
		if u == nil {
			u = &Usage{CgroupID: c.CgroupID}
			t.Usage[c.GPU] = u
		}
		u.GPUNS += c.GPUNS
		u.WantNS += c.WantNS
		u.QueueNS += c.QueueNS
		u.Launches += c.Launches
		u.Syncs += c.Syncs
		if !c.Exited && !counted[procOnGPU{c.PID, c.GPU}] {
			counted[procOnGPU{c.PID, c.GPU}] = true
			u.Processes++
		}
		g.SettledShare += c.Share
		g.Costed = g.Costed && (c.Learned || c.Exited)
		waits[g] = append(waits[g], c.SyncWait...)
		syncs[g] += c.Syncs
		if !c.Exited {
			if c.LaunchNS > 0 {
				w := float64(c.Launches) + 1e-3 // one without recent launches still counts a little
				launch[a.Name].sum += w * c.LaunchNS
				launch[a.Name].n += w
			}
			if d := demandAlone(c, in.Settled); d >= backloggedFraction {
				g.Demand = 1
			} else {
				g.Demand += d
			}
		}
	}
	for _, c := range in.Short {
		a := in.Assign(c.PID, c.CgroupID)
		t := res.Tenants[a.Name]
		if t == nil || t.GPUs[c.GPU] == nil {
			continue
		}
		g := t.GPUs[c.GPU]
		g.Share += c.Share
		g.Busy = g.Busy || c.Busy || c.Launches > 0 || c.Waiting
		g.Queued += float64(c.BacklogNS) / float64(in.Window)
		g.Waited += float64(c.QueueNS) / float64(in.Window)
		g.Backlogged = g.Backlogged || backlogged(c, in.Window)
		if !c.Exited {
			g.Contexts++
			b := bursts[g]
			if b == nil {
				b = &turns{}
				bursts[g] = b
			}
			b.gpuNS += float64(c.GPUNS)
			b.drains += float64(c.Drains)
			b.run = max(b.run, float64(c.RunNS))
			b.recent = max(b.recent, float64(c.RecentBurstNS))
		}
	}
	for name, t := range res.Tenants {
		if l := launch[name]; l.n > 0 {
			t.LaunchNS = l.sum / l.n
		}
		held := in.HeldBack != nil && in.HeldBack(name)
		for _, g := range t.GPUs {
			g.LaunchNS = t.LaunchNS
			g.Groups = g.Contexts
			if b := bursts[g]; b != nil && b.drains > 0 {
				g.BurstNS = b.gpuNS / b.drains
				if b.recent > 0 {
					g.BurstNS = b.recent // its last bursts: the window's mean lags a change of phase
				}
				if b.run > runsLonger*g.BurstNS {
					g.BurstNS = b.run // its bursts grew: a phase of longer kernels or fewer syncs
				}
			}
			if held {
				g.Busy, g.Held, g.Backlogged = true, true, true // held back, so its queue may be empty: it wants more
			}
			g.Demand = math.Min(g.Demand, 1)
			g.SyncP99MS = p99(waits[g]) / 1e6
			g.FPS = float64(syncs[g]) / in.Settled.Seconds()
			res.Inputs = append(res.Inputs, *g)
		}
	}
	sort.Slice(res.Inputs, func(i, j int) bool {
		if res.Inputs[i].GPU != res.Inputs[j].GPU {
			return res.Inputs[i].GPU < res.Inputs[j].GPU
		}
		return res.Inputs[i].Name < res.Inputs[j].Name
	})
	return res
}

// backlogged tells whether a process would take nearly the whole GPU
// alone.
func backlogged(c meter.ContextStats, window time.Duration) bool {
	return !c.Exited && demandAlone(c, window) >= backloggedFraction
}

// demandAlone is what a process would take of the GPU alone, from its
// figures over a window (see the package doc): its share u over u plus the
// part of the window it idled with nothing outstanding. A process seen for
// less than minActive that wanted the GPU at all wants all of it: it has
// just arrived and launched.
func demandAlone(c meter.ContextStats, window time.Duration) float64 {
	if c.ActiveNS < uint64(minActive) {
		if c.WantNS > 0 || c.Busy || c.Waiting {
			return 1
		}
		return 0
	}
	u := c.Share
	idle := float64(c.ActiveNS-min(c.WantNS, c.ActiveNS)) / float64(window)
	switch {
	case idle <= 0 && (u > 0 || c.WantNS > 0):
		return 1
	case u+idle <= 0:
		return 0
	}
	return u / (u + idle)
}

func containsID(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// p99 is the 99th percentile of xs (0 for none).
func p99(xs []uint64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]uint64(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[int(math.Ceil(0.99*float64(len(s))))-1])
}
