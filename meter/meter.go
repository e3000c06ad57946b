package meter

import (
	"math"
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
	Processes    int     `json:"processes"`
	Busy         bool    `json:"busy"` // has outstanding work now
}

// GPUStats are one GPU's figures.
type GPUStats struct {
	Index     int     `json:"index"`
	BusyShare float64 `json:"busy_share"` // fraction of the window some context was busy
	Tenants   int     `json:"tenants"`
}

// Snapshot is the meter's view at one instant.
type Snapshot struct {
	AtNS     uint64        `json:"at_ns"`
	WindowNS uint64        `json:"window_ns"`
	Tenants  []TenantStats `json:"tenants"`
	GPUs     []GPUStats    `json:"gpus"`
}

type span struct{ start, end uint64 }

// gpuContext is what the meter keeps of one process using a GPU.
type gpuContext struct {
	pid       uint32
	cgroup    uint64
	gpu       int
	open      map[uint64]uint64 // stream -> busy since
	busySince uint64            // 0 while drained
	spans     []span            // closed busy spans, oldest first
	launches  []uint64          // launch times in the window
	syncs     []uint64
	mem       int64
	allocs    map[uint64]uint64
	exited    bool
	lastSeen  uint64
}

// Meter estimates GPU time per tenant from the event stream. Observe is
// called by one reader; Snapshot and Tick may run concurrently with it.
type Meter struct {
	cfg Config

	mu       sync.Mutex
	ctxs     map[uint32]*gpuContext
	longRun  map[TenantKey]float64
	lastTick uint64
}

// New returns a Meter.
func New(cfg Config) *Meter {
	if cfg.Window <= 0 {
		cfg.Window = time.Second
	}
	if cfg.HalfLife <= 0 {
		cfg.HalfLife = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = MonotonicNow
	}
	return &Meter{cfg: cfg, ctxs: map[uint32]*gpuContext{}, longRun: map[TenantKey]float64{}}
}

func (m *Meter) context(h *ioctlspy.Header) *gpuContext {
	c := m.ctxs[h.PID]
	if c == nil || c.exited {
		c = &gpuContext{pid: h.PID, open: map[uint64]uint64{}, allocs: map[uint64]uint64{}}
		m.ctxs[h.PID] = c
	}
	c.cgroup = h.CgroupID // processes move between cgroups
	c.lastSeen = max(c.lastSeen, h.End)
	return c
}

func (c *gpuContext) openStream(stream, t uint64) {
	if _, ok := c.open[stream]; ok {
		return
	}
	if len(c.open) == 0 {
		c.busySince = t
	}
	c.open[stream] = t
}

func (c *gpuContext) closeStream(stream, t uint64) {
	since, ok := c.open[stream]
	if !ok || since > t {
		return
	}
	delete(c.open, stream)
	if len(c.open) == 0 {
		c.closeSpan(t)
	}
}

func (c *gpuContext) closeAll(t uint64) {
	if len(c.open) == 0 {
		return
	}
	clear(c.open)
	c.closeSpan(t)
}

func (c *gpuContext) closeSpan(t uint64) {
	if t > c.busySince {
		c.spans = append(c.spans, span{c.busySince, t})
	}
	c.busySince = 0
}

// nouveauStream keys a context's kernel-submitted work apart from streams.
const nouveauStream = ^uint64(0)

// Observe feeds one event to the meter.
func (m *Meter) Observe(ev ioctlspy.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := ev.Hdr()
	switch e := ev.(type) {
	case *ioctlspy.Launch:
		c := m.context(h)
		c.openStream(e.Stream, h.Start)
		c.launches = append(c.launches, h.Start)
	case *ioctlspy.GraphLaunch:
		c := m.context(h)
		c.openStream(e.Stream, h.Start)
		c.launches = append(c.launches, h.Start)
	case *ioctlspy.Submission:
		c := m.context(h)
		c.openStream(nouveauStream, h.Start)
		c.launches = append(c.launches, h.Start)
	case *ioctlspy.Sync:
		m.sync(h, e)
	case *ioctlspy.ContextCreated:
		if e.Ret == 0 {
			m.context(h).gpu = int(e.Device)
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
			c.closeAll(h.End)
			c.exited = true
			c.mem = 0 // the driver frees a process's memory at exit
			clear(c.allocs)
		}
	}
}

func (m *Meter) sync(h *ioctlspy.Header, e *ioctlspy.Sync) {
	if e.Ret != 0 {
		return
	}
	c := m.context(h)
	c.syncs = append(c.syncs, h.End)
	switch e.Func {
	case "cuStreamSynchronize":
		c.closeStream(e.Handle, h.End)
	case "cuCtxSynchronize":
		c.closeAll(h.End)
	case "cuEventSynchronize":
		// Which work an event covers is not seen: the context had work
		// until the sync returned, and may still have.
	default: // nouveau and DRM waits
		c.closeStream(nouveauStream, h.End)
	}
}

// share splits [from, to) of each GPU among its busy contexts equally
// (processor sharing) and returns GPU ns per context and busy ns per GPU.
func (m *Meter) share(from, to uint64) (map[*gpuContext]float64, map[int]float64) {
	type edge struct {
		t     uint64
		delta int
		c     *gpuContext
	}
	byGPU := map[int][]edge{}
	for _, c := range m.ctxs {
		add := func(s, e uint64) {
			s, e = max(s, from), min(e, to)
			if e > s {
				byGPU[c.gpu] = append(byGPU[c.gpu], edge{s, 1, c}, edge{e, -1, c})
			}
		}
		for _, sp := range c.spans {
			add(sp.start, sp.end)
		}
		if c.busySince != 0 {
			add(c.busySince, to)
		}
	}
	got := map[*gpuContext]float64{}
	busy := map[int]float64{}
	for gpu, edges := range byGPU {
		sort.Slice(edges, func(i, j int) bool {
			if edges[i].t != edges[j].t {
				return edges[i].t < edges[j].t
			}
			return edges[i].delta < edges[j].delta
		})
		active := map[*gpuContext]int{}
		last := edges[0].t
		for _, e := range edges {
			if dt := float64(e.t - last); dt > 0 && len(active) > 0 {
				busy[gpu] += dt
				for c := range active {
					got[c] += dt / float64(len(active))
				}
			}
			last = e.t
			active[e.c] += e.delta
			if active[e.c] == 0 {
				delete(active, e.c)
			}
		}
	}
	return got, busy
}

// Tick advances the long-run shares to now and forgets what fell out of the
// window. The daemon calls it every control period.
func (m *Meter) Tick() {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	if m.lastTick != 0 && now > m.lastTick {
		dt := now - m.lastTick
		got, _ := m.share(m.lastTick, now)
		perTenant := map[TenantKey]float64{}
		for c, ns := range got {
			perTenant[TenantKey{c.cgroup, c.gpu}] += ns / float64(dt)
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
	for pid, c := range m.ctxs {
		i := 0
		for i < len(c.spans) && c.spans[i].end < cut {
			i++
		}
		c.spans = c.spans[i:]
		c.launches = dropBefore(c.launches, cut)
		c.syncs = dropBefore(c.syncs, cut)
		if c.exited && len(c.spans) == 0 && len(c.launches) == 0 && len(c.syncs) == 0 {
			delete(m.ctxs, pid)
		}
	}
}

func dropBefore(ts []uint64, cut uint64) []uint64 {
	i := sort.Search(len(ts), func(i int) bool { return ts[i] >= cut })
	return ts[i:]
}

// Snapshot returns the figures of the window ending now.
func (m *Meter) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	w := uint64(m.cfg.Window)
	from := uint64(0)
	if now > w {
		from = now - w
	}
	got, busy := m.share(from, now)
	tenants := map[TenantKey]*TenantStats{}
	tenant := func(c *gpuContext) *TenantStats {
		k := TenantKey{c.cgroup, c.gpu}
		t := tenants[k]
		if t == nil {
			t = &TenantStats{CgroupID: c.cgroup, GPU: c.gpu, LongRunShare: m.longRun[k]}
			tenants[k] = t
		}
		return t
	}
	secs := float64(w) / 1e9
	for _, c := range m.ctxs {
		t := tenant(c)
		t.GPUNS += uint64(got[c])
		t.LaunchesPerS += float64(len(dropBefore(c.launches, from))) / secs
		t.SyncsPerS += float64(len(dropBefore(c.syncs, from))) / secs
		t.MemBytes += c.mem
		if !c.exited {
			t.Processes++
		}
		t.Busy = t.Busy || c.busySince != 0
	}
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
