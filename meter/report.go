package meter

import (
	"sort"
	"time"
)

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
	QueueNS      uint64  `json:"queue_ns"` // time with work queued while others held the GPU, in the window
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

// ContextStats are one process's figures on its GPU over a window.
type ContextStats struct {
	PID uint32
	// Ctx is the CUDA context's handle (0: the process's first context,
	// the one threads that made none of their own use).
	Ctx      uint64
	CgroupID uint64
	GPU      int
	GPUNS    uint64  // estimated GPU ns in the window
	Share    float64 // GPUNS over the window
	Launches int     // launches in the window
	// Drains counts the times its modeled work ran out in the window:
	// GPUNS / Drains is the work it brings to one turn on the GPU.
	Drains int
	// RecentBurstNS is the mean of its last recentBursts bursts: its GPU
	// time between the recentBursts+1 last times its modeled work ran out,
	// over recentBursts (0 with fewer drains in the meter's window). It
	// follows a change of phase within a few bursts, where GPUNS / Drains
	// keeps the window's older bursts.
	RecentBurstNS uint64
	// RunNS is its GPU time since its modeled work last ran out: the turn
	// in progress (0 if its work never ran out in the meter's window).
	RunNS uint64
	// Syncs counts the waits for the GPU that returned in the window
	// (synchronizing calls, and polling loops that found work not done),
	// SyncWait their lengths in ns.
	Syncs    int
	SyncWait []uint64
	QueueNS  uint64
	// WantNS is how long in the window it wanted the GPU: work modeled, a
	// wait for the GPU in progress (a sync or a polling loop), or kept from
	// the GPU by gpuarb. The rest of its active time it idled with nothing
	// outstanding: CPU think time.
	WantNS uint64
	// Waiting tells whether it waits for the GPU now.
	Waiting bool
	// BacklogNS is the modeled GPU work queued now, not yet run (0 until
	// the context's costs are learned: a guess would read as seconds).
	BacklogNS uint64
	// QueuedNS is the modeled GPU work queued now at the costs learned
	// or guessed (0 for a process no probe sees): what a daemon started
	// after this one takes up (Meter.RestoreBacklog).
	QueuedNS uint64
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
	// Timeslice is its channel group's own timeslice (0: the GPU's).
	Timeslice time.Duration
	// Total counts since the process entered its cgroup and GPU (they
	// start again from zero when it moves).
	Total Totals
}

// recentBursts is how many of a context's last bursts RecentBurstNS
// averages: a loop's bursts vary with its kernel mix, and a phase of
// 0.1 ms bursts replaces eight in under a millisecond.
const recentBursts = 8

// Contexts returns per-context figures over the window ending at the
// settled present.
func (m *Meter) Contexts(window time.Duration) (at uint64, out []ContextStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	clock := m.cfg.Now()
	m.rec.put(recordLine{Op: opSettle, Now: clock, NS: int64(window)})
	now := m.horizon(clock)
	m.settle(now)
	w := uint64(window)
	from := uint64(0)
	if now > w {
		from = now - w
	}
	for _, c := range m.ctxs {
		held := sumIn(c.held, from, now)
		cs := ContextStats{PID: c.pid, Ctx: c.ctx, CgroupID: c.cgroup, GPU: c.gpu, GPUNS: uint64(held), Share: held / float64(w),
			Launches: len(dropBefore(c.launches, from)), Drains: len(dropBefore(c.drains, from)), QueueNS: uint64(sumIn(c.waited, from, now)),
			WantNS: uint64(c.wantedIn(from, now, m.frozen[c.cgroup])), Waiting: len(c.waits) > 0,
			Busy: c.left() > 0, BacklogNS: c.backlog(), QueuedNS: c.queued(), ActiveNS: now - max(from, min(c.since, now)), Learned: c.learned,
			Exited: c.exited, Timeslice: c.timeslice, Total: c.total}
		if c.total.Launches > 0 {
			cs.LaunchNS = c.launchCost()
		}
		if n := len(c.drains); n > 0 {
			cs.RunNS = uint64(sumIn(c.held, c.drains[n-1], now))
			if n > recentBursts {
				cs.RecentBurstNS = uint64(sumIn(c.held, c.drains[n-1-recentBursts], c.drains[n-1]) / recentBursts)
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
	sort.Slice(out, func(i, j int) bool {
		return out[i].PID < out[j].PID || out[i].PID == out[j].PID && out[i].Ctx < out[j].Ctx
	})
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
	type procIn struct {
		TenantKey
		pid uint32
	}
	live := map[procIn]bool{}
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
		t.QueueNS += c.QueueNS
		if p := (procIn{k, c.PID}); !c.Exited && !live[p] { // once however many contexts it has
			live[p] = true
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
