package fakegpu

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Config describes the simulated GPUs.
type Config struct {
	GPUs          int           // number of GPUs (default 1)
	Timeslice     time.Duration // default channel-group timeslice (default 1024µs, as Volta and later)
	NoPreempt     bool          // run each kernel to completion (no preemption at slice end)
	ContextSwitch time.Duration // cost of switching channel groups (default 20µs)
	CopyBandwidth uint64        // copy engine bytes per second (default 25e9)
	Memory        uint64        // device memory per GPU in bytes (default 80 GiB)
	// ContextMemory is what each context holds of its GPU's memory from
	// its creation, outside any allocation (the driver's own buffers for
	// it: no RM memory allocation shows it; default 0).
	ContextMemory uint64
	Poll          time.Duration // longest sleep while an engine runs (default 1ms)
	Realism       Realism       // what real GPUs do that a meter cannot know
}

// Realism is what a real GPU does beyond round robin over exact kernel
// costs; gpuarb's meter knows none of it. The zero value turns it all off.
type Realism struct {
	// Jitter is the relative spread (standard deviation of a mean-one
	// log-normal factor) of each kernel's duration.
	Jitter float64
	// Contention slows kernels by this fraction per other channel group
	// with work (caches and memory shared with co-runners; up to four).
	Contention float64
	// WavePreempt preempts a kernel only between waves of its blocks (a
	// wave is up to SMs blocks): a slice ends at the next wave boundary.
	WavePreempt bool
	// SwitchSpread varies each context switch's cost uniformly within
	// ContextSwitch × (1 ± SwitchSpread).
	SwitchSpread float64
	// DriverTimeslices are the timeslices the driver's libcuda sets on new
	// contexts' channel groups, in turn (0: it leaves the default).
	DriverTimeslices []time.Duration
	// Seed seeds the randomness (0: from the clock).
	Seed uint64
}

// RealisticDefaults is what `fakegpud serve --realism` turns on: 10%
// kernel jitter, 3% slowdown per co-runner, preemption at wave boundaries,
// context switches of ±50%, and a libcuda that sets 2048µs on every other
// context (docs/driver.md §2: 1024µs by default, 2048µs read back on one system).
func RealisticDefaults() Realism {
	return Realism{Jitter: 0.1, Contention: 0.03, WavePreempt: true, SwitchSpread: 0.5,
		DriverTimeslices: []time.Duration{0, 2048 * time.Microsecond}}
}

// On reports whether any realism is on.
func (r Realism) On() bool {
	return r.Jitter > 0 || r.Contention > 0 || r.WavePreempt || r.SwitchSpread > 0 || len(r.DriverTimeslices) > 0
}

func (c *Config) setDefaults() {
	if c.GPUs <= 0 {
		c.GPUs = 1
	}
	if c.Timeslice <= 0 {
		c.Timeslice = DefaultTimeslice
	}
	if c.ContextSwitch < 0 {
		c.ContextSwitch = 0
	} else if c.ContextSwitch == 0 {
		c.ContextSwitch = DefaultContextSwitch
	}
	if c.CopyBandwidth == 0 {
		c.CopyBandwidth = 25e9
	}
	if c.Memory == 0 {
		c.Memory = 80 << 30
	}
	if c.Poll <= 0 {
		c.Poll = time.Millisecond
	}
	if c.Realism.Seed == 0 {
		c.Realism.Seed = uint64(time.Now().UnixNano())
	}
}

// Defaults of the device model.
const (
	// DefaultTimeslice is the TSG timeslice of Volta and later GPUs:
	// 128 << 3 µs (open-gpu-kernel-modules kernel_fifo_gv100.c).
	DefaultTimeslice     = 1024 * time.Microsecond
	DefaultContextSwitch = 20 * time.Microsecond
	// SMs is the simulated GPU's multiprocessor count (as an H100 SXM):
	// a wave of a kernel runs up to this many blocks.
	SMs = 132
)

// idleWait is how long an idle device sleeps when nothing wakes it. Short
// on purpose: in a VM a fully halted vCPU can take milliseconds to wake
// (measured: infer p99 outliers of 10 ms with 100 ms, ≤5 ms with 2 ms), and
// 500 idle wake-ups a second cost well under 1% of a core.
const idleWait = 2 * time.Millisecond

// maxCostNS bounds one entry's cost so a hostile client cannot wedge a GPU.
const maxCostNS = int64(60 * time.Second)

func monotonicNS() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

type arrival struct {
	upto uint64 // entries below this index arrived at
	at   int64
}

type chanState struct {
	known    uint64 // GPPut seen by the device
	next     uint64 // index of the head entry (entries below it completed)
	headLeft int64  // remaining ns of work of a started head entry, -1 if not started
	wave     int64  // ns of work per wave of the started head kernel (0: preempt anywhere)
	busy     bool   // the head is on an engine
	handle   uint32 // the channel's RM handle, as libcuda allocated it
	// disabled keeps the channel off the runlist (FIFO_DISABLE_CHANNELS);
	// nextDisabled is the state the next runlist restart applies, and
	// nextOnlyScheduling (bOnlyDisableScheduling) leaves it running there
	// until its slice ends instead of evicting it.
	disabled, nextDisabled, nextOnlyScheduling bool
	arrivals                                   []arrival
}

// gpuContext is one channel group (TSG): a client's CUDA context.
type gpuContext struct {
	id     uint64
	gpu    *gpu
	pid    int
	cgroup string
	fd     int
	mem    []byte
	shm    *ctxShm
	chans  [MaxChannels]chanState
	// pending has bit i set while channel i has entries the device has not run.
	pending uint32
	// completed has bit i set where channel i completed entries since the
	// device last woke its waiters (wake).
	completed uint32
	rr        int
	// The RM handles libcuda allocated the context's objects under: its
	// client, channel group (TSG) and subdevice.
	client, tsg, subdevice uint32
	tsgAt                  int64 // when the client allocated the group: its place on the runlist
	// timeslice is the group's own timeslice (0: the GPU's default);
	// nextSlice one set since, applied at the next runlist restart.
	timeslice, nextSlice time.Duration
	// scheduled is set once the group has run: from then on scheduling
	// changes wait for a runlist restart.
	scheduled bool

	busyNS, copyNS, queueNS uint64
	kernels, copies         uint64
	memBytes                uint64
	allocs                  map[uint64]uint64
	alive                   bool
}

// slice is the group's timeslice.
func (c *gpuContext) slice() int64 {
	if c.timeslice > 0 {
		return int64(c.timeslice)
	}
	return int64(c.gpu.cfg.Timeslice)
}

type gpu struct {
	index int
	cfg   *Config
	reg   *registry

	dbFD  int
	dbMem []byte
	db    *doorbellShm

	mu       sync.Mutex
	vt       int64         // virtual time simulated up to (CLOCK_MONOTONIC ns)
	ctxs     []*gpuContext // the runlist
	ended    []*gpuContext // destroyed, kept for stats until reset
	lastRing uint32
	rng      *rand.Rand

	cur      *gpuContext // compute engine owner
	curCh    int
	running  bool
	sliceEnd int64
	rate     float64     // work ns per ns of the running kernel (below 1 with co-runners)
	cp       *gpuContext // copy engine owner
	cpCh     int
	copying  bool
	blocked  bool // a channel head waits on another context or GPU

	busyNS, copyBusyNS uint64
	memUsed            uint64
	nextAddr           uint64

	stopped atomic.Bool
	done    chan struct{}
}

// registry is what the GPUs of one server share: every live context by id
// (for waits on another context's events) and the 32-bit words written by
// stream memory operations (for waits on them).
type registry struct {
	mu     sync.RWMutex
	ctxs   map[uint64]*gpuContext
	values map[uint64]uint32
	// files are the open control files RM clients are bound to (the
	// server's own duplicates, received with each client's hello).
	files map[uint32]int
}

func newRegistry() *registry {
	return &registry{ctxs: map[uint64]*gpuContext{}, values: map[uint64]uint32{}, files: map[uint32]int{}}
}

// bind records the control file an RM client is bound to.
func (r *registry) bind(client uint32, fd int) {
	r.mu.Lock()
	r.files[client] = fd
	r.mu.Unlock()
}

// unbind forgets a client's file when its connection ends.
func (r *registry) unbind(client uint32, fd int) {
	r.mu.Lock()
	if r.files[client] == fd {
		delete(r.files, client)
	}
	r.mu.Unlock()
}

// sameFile tells whether fd is the open file client is bound to (kcmp:
// the same open file description, not merely the same device node, as
// the driver checks).
func (r *registry) sameFile(client uint32, fd int) bool {
	r.mu.RLock()
	own, ok := r.files[client]
	r.mu.RUnlock()
	if !ok {
		return false
	}
	pid := uintptr(os.Getpid())
	res, _, errno := unix.Syscall6(unix.SYS_KCMP, pid, pid, 0 /* KCMP_FILE */, uintptr(own), uintptr(fd), 0)
	return errno == 0 && res == 0
}

// completed returns how many entries channel ch of context id has
// completed, and whether the context exists. Lock-free on the context's
// shared memory: the caller may hold another GPU's lock.
func (r *registry) completed(id uint64, ch int) (uint64, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	c, ok := r.ctxs[id]
	if !ok || c.shm == nil {
		return 0, false
	}
	return atomic.LoadUint64(&c.shm.Ch[ch].GPGet), true
}

func (r *registry) write(addr uint64, v uint32) {
	r.mu.Lock()
	r.values[addr] = v
	r.mu.Unlock()
}

func (r *registry) read(addr uint64) uint32 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.values[addr]
}

// forget drops the words written within [addr, addr+bytes) when the
// allocation holding them is freed.
func (r *registry) forget(addr, bytes uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for a := range r.values {
		if a >= addr && a < addr+bytes {
			delete(r.values, a)
		}
	}
}

func newGPU(index int, cfg *Config, reg *registry) (*gpu, error) {
	fd, mem, err := sharedMemory(fmt.Sprintf("fakegpu-doorbell-%d", index), doorbellShmSize)
	if err != nil {
		return nil, err
	}
	g := &gpu{index: index, cfg: cfg, reg: reg, dbFD: fd, dbMem: mem, db: (*doorbellShm)(unsafe.Pointer(&mem[0])),
		nextAddr: 0x7f0000000000 + uint64(index)<<36, done: make(chan struct{}), rate: 1,
		rng: rand.New(rand.NewPCG(cfg.Realism.Seed, uint64(index)))}
	g.db.Magic = magicDoorbell
	g.db.Version = abiVersion
	return g, nil
}

func sharedMemory(name string, size int) (int, []byte, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd %s: %w", name, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("size memfd %s: %w", name, err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("map memfd %s: %w", name, err)
	}
	return fd, mem, nil
}

func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 1 /* FUTEX_WAKE */, 1<<30, 0, 0, 0)
}

// futexWaitUntil sleeps while *addr == val, until the CLOCK_MONOTONIC
// deadline at the latest.
func futexWaitUntil(addr *uint32, val uint32, deadline int64) {
	ts := unix.NsecToTimespec(deadline)
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 9 /* FUTEX_WAIT_BITSET */, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0xffffffff /* FUTEX_BITSET_MATCH_ANY */)
}

// addContext creates a channel group for a client process; client, tsg and
// subdevice are the RM handles its libcuda allocated the group under, tsgAt
// when (0: now).
func (g *gpu) addContext(id uint64, pid int, cgroup string, client, tsg, subdevice uint32, tsgAt int64) (*gpuContext, error) {
	fd, mem, err := sharedMemory(fmt.Sprintf("fakegpu-ctx-%d", id), ctxShmSize)
	if err != nil {
		return nil, err
	}
	c := &gpuContext{id: id, gpu: g, pid: pid, cgroup: cgroup, fd: fd, mem: mem, client: client, tsg: tsg, subdevice: subdevice,
		shm: (*ctxShm)(unsafe.Pointer(&mem[0])), allocs: map[uint64]uint64{}, alive: true}
	c.shm.Magic = magicCtx
	c.shm.Version = abiVersion
	for i := range c.chans {
		c.chans[i].headLeft = -1
	}
	if tsgAt <= 0 {
		tsgAt = monotonicNS()
	}
	c.tsgAt = tsgAt
	g.mu.Lock()
	c.memBytes = g.cfg.ContextMemory
	g.memUsed += c.memBytes
	// The runlist holds the groups in the order they were allocated, as
	// the hardware's (by channel group ID), not in the order their
	// clients' requests reached the server.
	i := len(g.ctxs)
	for i > 0 && g.ctxs[i-1].tsgAt > tsgAt {
		i--
	}
	g.ctxs = slices.Insert(g.ctxs, i, c)
	g.mu.Unlock()
	g.reg.mu.Lock()
	g.reg.ctxs[id] = c
	g.reg.mu.Unlock()
	return c, nil
}

// removeContext drops a context and its queued work, as a real GPU does
// when the owning process goes away; its figures stay for stats.
func (g *gpu) removeContext(c *gpuContext) {
	g.mu.Lock()
	if !c.alive {
		g.mu.Unlock()
		return
	}
	for i, x := range g.ctxs {
		if x == c {
			g.ctxs = append(g.ctxs[:i], g.ctxs[i+1:]...)
			break
		}
	}
	if g.cur == c {
		g.cur, g.running = nil, false
	}
	if g.cp == c {
		g.cp, g.copying = nil, false
	}
	g.memUsed -= c.memBytes
	c.memBytes = 0 // a destroyed context holds no memory
	allocs := c.allocs
	c.allocs = nil
	c.alive = false
	g.ended = append(g.ended, c)
	g.reg.mu.Lock()
	delete(g.reg.ctxs, c.id)
	mem, fd := c.mem, c.fd
	c.mem, c.shm = nil, nil
	g.reg.mu.Unlock()
	g.mu.Unlock()
	for addr, bytes := range allocs {
		g.reg.forget(addr, bytes)
	}
	unix.Munmap(mem)
	unix.Close(fd)
}

// run is the device loop: poll the doorbell, simulate the engines in real
// time, complete entries, then sleep on the doorbell until the next event
// (a completion or a slice end). A client that rings the doorbell of an
// empty channel while the device sleeps wakes it; entries added behind
// pending ones are found when the device next wakes.
func (g *gpu) run() {
	defer close(g.done)
	runtime.LockOSThread()
	// Precise wake-ups: the default 50µs timer slack would be timing error.
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	g.mu.Lock()
	g.vt = monotonicNS()
	g.mu.Unlock()
	for !g.stopped.Load() {
		g.mu.Lock()
		now := g.catchUp()
		g.poll(now, false)
		g.advance(now, now) // start what just arrived
		g.wake()
		next := g.nextEvent(now)
		if g.running || g.copying || g.blocked {
			next = min(next, now+int64(g.cfg.Poll))
		}
		g.mu.Unlock()

		atomic.StoreUint32(&g.db.Sleeping, 1)
		if ring := atomic.LoadUint32(&g.db.Ring); ring == g.lastRing && !g.stopped.Load() {
			futexWaitUntil(&g.db.Ring, ring, next)
		}
		atomic.StoreUint32(&g.db.Sleeping, 0)
	}
}

// catchUp simulates both engines up to the present and returns it. Called
// with g.mu held, by the device loop and by Snapshot, so the ground truth
// is read at the instant its window ends, not where the device thread last
// woke. Entries arrive when their doorbell rang (the client's RingAt), not
// when the device thread got a CPU to poll: a GPU sees a doorbell at once.
func (g *gpu) catchUp() int64 {
	now := max(monotonicNS(), g.vt)
	for {
		at, ok := g.earliestRing(now)
		if !ok {
			break
		}
		g.advance(g.vt, at)
		g.vt = at
		g.poll(at, true)
		g.advance(at, at) // start what just arrived
	}
	g.advance(g.vt, now)
	g.vt = now
	return now
}

// earliestRing is the earliest doorbell, before `to`, of entries the
// device has not polled yet (one rung before the simulation's present
// counts as now).
func (g *gpu) earliestRing(to int64) (int64, bool) {
	if atomic.LoadUint32(&g.db.Ring) == g.lastRing {
		return 0, false
	}
	at, ok := to, false
	for _, c := range g.ctxs {
		for m := c.usedChans(); m != 0; m &= m - 1 {
			i := bits.TrailingZeros32(m)
			sh := &c.shm.Ch[i]
			if atomic.LoadUint64(&sh.GPPut) <= c.chans[i].known {
				continue
			}
			if r := int64(atomic.LoadUint64(&sh.RingAt)); r > 0 && r < at {
				at, ok = max(r, g.vt), true
			}
		}
	}
	return at, ok
}

// poll reads GPPut of every channel when the doorbell moved: entries
// arrive at now. Where rungOnly, only those whose doorbell rang by now (a
// poll at a past instant must not take entries submitted after it).
func (g *gpu) poll(now int64, rungOnly bool) {
	ring := atomic.LoadUint32(&g.db.Ring)
	if ring == g.lastRing {
		return
	}
	all := true
	for _, c := range g.ctxs {
		for m := c.usedChans(); m != 0; m &= m - 1 {
			i := bits.TrailingZeros32(m)
			sh := &c.shm.Ch[i]
			put := atomic.LoadUint64(&sh.GPPut)
			st := &c.chans[i]
			if put <= st.known {
				continue
			}
			if r := int64(atomic.LoadUint64(&sh.RingAt)); rungOnly && r > now {
				all = false
				continue
			}
			atomic.StoreUint64(&sh.RingAt, 0)
			if put-st.next > RingEntries { // a client overran its ring: ignore the excess
				put = st.next + RingEntries
			}
			st.arrivals = append(st.arrivals, arrival{upto: put, at: now})
			st.known = put
			c.pending |= 1 << i
		}
	}
	if all {
		g.lastRing = ring
	}
}

// usedChans is the mask of the channels the client has used (ctxShm.Chans):
// the only ones whose GPPut can move.
func (c *gpuContext) usedChans() uint32 { return atomic.LoadUint32(&c.shm.Chans) }

func (c *gpuContext) head(ch int) *entry {
	st := &c.chans[ch]
	return &c.shm.Ch[ch].Ring[st.next%RingEntries]
}

// advance simulates both engines from t to `to`, completing entries at
// their exact virtual completion times.
func (g *gpu) advance(t, to int64) {
	for {
		g.dispatch(t)
		if !g.running && !g.copying {
			return
		}
		// A group whose slice is over yields as soon as another has work,
		// also one that arrived just now (t == to).
		evict := g.running && g.cur.chans[g.curCh].disabled
		if g.running && !g.cfg.NoPreempt && t >= g.sliceEnd && (evict || g.othersWaiting()) && g.atPreemptionPoint() {
			g.cur.chans[g.curCh].busy = false // preempted: headLeft is kept
			g.running = false
			continue
		}
		if t >= to {
			return
		}
		step := to - t
		var kst, cst *chanState
		if g.running {
			kst = &g.cur.chans[g.curCh]
			step = min(step, g.wallFor(kst.headLeft))
			if !g.cfg.NoPreempt && (evict || g.othersWaiting()) {
				if t < g.sliceEnd {
					step = min(step, g.sliceEnd-t)
				} else {
					step = min(step, g.wallFor(g.toPreemptionPoint()))
				}
			}
		}
		if g.copying {
			cst = &g.cp.chans[g.cpCh]
			step = min(step, cst.headLeft)
		}
		step = max(step, 0)
		t += step
		if kst != nil {
			kst.headLeft -= g.workIn(step, kst.headLeft)
			g.cur.busyNS += uint64(step)
			g.busyNS += uint64(step)
			if kst.headLeft <= 0 {
				g.cur.kernels++
				g.complete(g.cur, g.curCh, t)
				g.running = false
				g.poll(t, true) // entries queued behind it without a wake-up
			}
		}
		if cst != nil {
			cst.headLeft -= step
			g.cp.copyNS += uint64(step)
			g.copyBusyNS += uint64(step)
			if cst.headLeft <= 0 {
				g.cp.copies++
				g.complete(g.cp, g.cpCh, t)
				g.copying = false
				g.poll(t, true)
			}
		}
	}
}

// wallFor is the wall time the running kernel needs for work ns of work at
// its rate.
func (g *gpu) wallFor(work int64) int64 {
	if g.rate >= 1 {
		return work
	}
	return int64(math.Ceil(float64(work) / g.rate))
}

// workIn is the work the running kernel does in step ns of wall time, at
// most left.
func (g *gpu) workIn(step, left int64) int64 {
	if g.rate >= 1 || step >= g.wallFor(left) {
		return min(step, left)
	}
	return int64(float64(step) * g.rate)
}

// toPreemptionPoint is the work the running kernel does before it can be
// preempted: to the end of its current wave when only wave boundaries
// preempt, else none.
func (g *gpu) toPreemptionPoint() int64 {
	st := &g.cur.chans[g.curCh]
	if !g.cfg.Realism.WavePreempt || st.wave <= 0 || st.headLeft <= 0 {
		return 0
	}
	return st.headLeft % st.wave
}

func (g *gpu) atPreemptionPoint() bool { return g.toPreemptionPoint() == 0 }

// dispatch completes what needs no engine at channel heads (markers,
// memory writes, waits whose condition holds) and starts idle engines.
func (g *gpu) dispatch(t int64) {
	g.blocked = false
	for _, c := range g.ctxs {
		for p := c.pending; p != 0; p &= p - 1 {
			ch := trailingZeros(p)
			st := &c.chans[ch]
			for !st.disabled && st.next < st.known && !st.busy && st.headLeft < 0 {
				e := c.head(ch)
				if e.Kind == entryKernel || e.Kind == entryCopy {
					break
				}
				if !g.ready(c, ch, e) {
					g.blocked = true
					break
				}
				if e.Kind == entryWriteValue {
					g.reg.write(e.A0, uint32(e.A1))
				}
				g.complete(c, ch, t) // markers, writes, waits that hold and unknown kinds complete at once
			}
		}
	}
	if !g.running {
		g.pickCompute(t)
	}
	if !g.copying {
		g.pickCopy(t)
	}
}

// ready tells whether a wait at the head of channel ch of c may complete.
func (g *gpu) ready(c *gpuContext, ch int, e *entry) bool {
	switch e.Kind {
	case entryWaitEvent:
		id, tch, target := e.A0, int(e.A1>>56)%MaxChannels, e.A1&(1<<56-1)
		for _, o := range g.ctxs {
			if o.id == id {
				return o.chans[tch].next >= target
			}
		}
		done, ok := g.reg.completed(id, tch) // another GPU's, or gone (then it is complete)
		return !ok || done >= target
	case entryHost:
		return atomic.LoadUint64(&c.shm.Ch[ch].HostDone) > e.Seq
	case entryWaitValue:
		v, want := g.reg.read(e.A0), uint32(e.A1)
		switch e.A1 >> 32 {
		case waitEQ:
			return v == want
		case waitAND:
			return v&want != 0
		case waitNOR:
			return ^(v | want) != 0
		default:
			return int32(v-want) >= 0 // GEQ, as CUDA: wrap-around aware
		}
	}
	return true
}

func trailingZeros(x uint32) int {
	n := 0
	for x&1 == 0 {
		x >>= 1
		n++
	}
	return n
}

// kernelChannel picks, round robin, a channel of c whose head is a kernel
// ready to run and advances the round robin; -1 if none.
func (c *gpuContext) kernelChannel() int {
	ch := c.readyKernel()
	if ch >= 0 {
		c.rr = ch + 1
	}
	return ch
}

// readyKernel is kernelChannel without advancing the round robin.
func (c *gpuContext) readyKernel() int {
	for i := 0; i < MaxChannels; i++ {
		ch := (c.rr + i) % MaxChannels
		if c.pending&(1<<ch) == 0 {
			continue
		}
		st := &c.chans[ch]
		if st.busy || st.disabled || st.next >= st.known {
			continue
		}
		if st.headLeft > 0 || c.head(ch).Kind == entryKernel {
			return ch
		}
	}
	return -1
}

func (c *gpuContext) copyChannel() int {
	for i := 0; i < MaxChannels; i++ {
		ch := (c.rr + i) % MaxChannels
		if c.pending&(1<<ch) == 0 {
			continue
		}
		st := &c.chans[ch]
		if !st.busy && !st.disabled && st.next < st.known && st.headLeft < 0 && c.head(ch).Kind == entryCopy {
			return ch
		}
	}
	return -1
}

// othersWaiting reports whether a channel group other than the running
// one has kernels ready.
func (g *gpu) othersWaiting() bool {
	for _, c := range g.ctxs {
		if c != g.cur && c.pending != 0 && c.readyKernel() >= 0 {
			return true
		}
	}
	return false
}

// coRunners counts the channel groups other than c with kernels ready.
func (g *gpu) coRunners(c *gpuContext) int {
	n := 0
	for _, o := range g.ctxs {
		if o != c && o.pending != 0 && o.readyKernel() >= 0 {
			n++
		}
	}
	return n
}

// pickCompute keeps the running group within its timeslice, else rotates
// the runlist to the next group with kernels ready.
func (g *gpu) pickCompute(t int64) {
	if g.cur != nil && t < g.sliceEnd {
		if ch := g.cur.kernelChannel(); ch >= 0 {
			g.startKernel(g.cur, ch, t, false)
			return
		}
	}
	g.rotate(g.cur, func(c *gpuContext) bool {
		ch := c.kernelChannel()
		if ch < 0 {
			return false
		}
		switched := c != g.cur
		g.cur = c
		g.sliceEnd = t + c.slice()
		c.scheduled = true
		g.startKernel(c, ch, t, switched)
		return true
	})
}

// rotate visits the contexts with pending work in runlist order, starting
// after `after`, until visit returns true.
func (g *gpu) rotate(after *gpuContext, visit func(*gpuContext) bool) {
	n := len(g.ctxs)
	start := 0
	for i, c := range g.ctxs {
		if c == after {
			start = i + 1
			break
		}
	}
	for i := 0; i < n; i++ {
		if c := g.ctxs[(start+i)%n]; c.pending != 0 && visit(c) {
			return
		}
	}
}

func (g *gpu) startKernel(c *gpuContext, ch int, t int64, switched bool) {
	st := &c.chans[ch]
	r := &g.cfg.Realism
	if st.headLeft < 0 {
		e := c.head(ch)
		cost := min(max(int64(e.CostNS), 0), maxCostNS)
		if r.Jitter > 0 {
			// A mean-one log-normal factor: durations vary, the average stays.
			cost = int64(float64(cost) * math.Exp(r.Jitter*g.rng.NormFloat64()-r.Jitter*r.Jitter/2))
		}
		st.headLeft = max(cost, 1)
		st.wave = 0
		if waves := (int64(e.A0) + SMs - 1) / SMs; waves > 0 {
			st.wave = max(st.headLeft/waves, 1)
		}
		c.queueNS += uint64(max(t-c.arrivalOf(ch), 0))
	}
	if switched {
		sw := float64(g.cfg.ContextSwitch)
		if r.SwitchSpread > 0 {
			sw *= 1 + r.SwitchSpread*(2*g.rng.Float64()-1)
		}
		st.headLeft += int64(sw)
	}
	g.rate = 1 / (1 + r.Contention*float64(min(g.coRunners(c), 4)))
	st.busy = true
	g.running = true
	g.curCh = ch
}

func (g *gpu) pickCopy(t int64) {
	g.rotate(g.cp, func(c *gpuContext) bool {
		ch := c.copyChannel()
		if ch < 0 {
			return false
		}
		st := &c.chans[ch]
		cost := int64(float64(c.head(ch).Bytes) * 1e9 / float64(g.cfg.CopyBandwidth))
		st.headLeft = min(max(cost, 1), maxCostNS)
		c.queueNS += uint64(max(t-c.arrivalOf(ch), 0))
		st.busy = true
		g.cp, g.cpCh, g.copying = c, ch, true
		return true
	})
}

// arrivalOf is when the head entry of ch was first seen.
func (c *gpuContext) arrivalOf(ch int) int64 {
	st := &c.chans[ch]
	for len(st.arrivals) > 0 && st.arrivals[0].upto <= st.next {
		st.arrivals = st.arrivals[1:]
	}
	if len(st.arrivals) == 0 {
		return 0
	}
	return st.arrivals[0].at
}

// complete retires the head entry of ch at virtual time t.
func (g *gpu) complete(c *gpuContext, ch int, t int64) {
	st := &c.chans[ch]
	e := c.head(ch)
	if ev := e.Event; ev != noEvent && ev < MaxEvents {
		atomic.StoreUint64(&c.shm.EventTS[ev], uint64(t))
	}
	st.next++
	st.headLeft = -1
	st.busy = false
	c.completed |= 1 << ch
	sh := &c.shm.Ch[ch]
	atomic.StoreUint64(&sh.GPGet, st.next)
	atomic.AddUint32(&sh.Done, 1)
	if st.next >= st.known {
		c.pending &^= 1 << ch
	}
}

// wake wakes clients sleeping on channels that completed entries.
func (g *gpu) wake() {
	for _, c := range g.ctxs {
		for m := c.completed; m != 0; m &= m - 1 {
			sh := &c.shm.Ch[bits.TrailingZeros32(m)]
			if atomic.LoadUint32(&sh.Waiters) > 0 {
				futexWake(&sh.Done)
			}
		}
		c.completed = 0
	}
}

// nextEvent is the virtual time of the next completion or slice end; an
// idle device looks again after idleWait (a stop also wakes it).
func (g *gpu) nextEvent(now int64) int64 {
	next := now + int64(idleWait)
	if g.running {
		next = min(next, now+g.wallFor(g.cur.chans[g.curCh].headLeft))
		// A slice already over matters only once others wait: the next
		// poll finds them. Nothing completes at a slice end itself:
		// whichever group runs next first runs some kernel's remaining
		// work, so the device need not wake before then (catchUp
		// simulates the switches exactly when it does). Waking at every
		// slice end cost the host 10,000 wake-ups a second at 100 µs
		// slices, CPU time the tenants' own processes then lacked.
		if !g.cfg.NoPreempt && g.sliceEnd > now {
			// (Work, not wall time: a kernel runs no faster than its
			// work, and the co-runners' slowdown may change by then.)
			next = min(next, g.sliceEnd+g.shortestReadyKernel())
		}
	}
	if g.copying {
		next = min(next, now+g.cp.chans[g.cpCh].headLeft)
	}
	return next
}

// shortestReadyKernel bounds from below the work of any kernel that can run
// next: the least remaining work of the kernels ready at channel heads,
// the running one included; 0 where kernels not yet started draw their
// cost with jitter (any cost may come out).
func (g *gpu) shortestReadyKernel() int64 {
	least := int64(math.MaxInt64)
	for _, c := range g.ctxs {
		if c.pending == 0 {
			continue
		}
		for ch := 0; ch < MaxChannels; ch++ {
			st := &c.chans[ch]
			if c.pending&(1<<ch) == 0 || st.disabled || st.next >= st.known {
				continue
			}
			switch {
			case st.headLeft > 0:
				least = min(least, st.headLeft)
			case st.busy || c.head(ch).Kind != entryKernel:
			case g.cfg.Realism.Jitter > 0:
				return 0
			default:
				least = min(least, max(min(int64(c.head(ch).CostNS), maxCostNS), 1))
			}
		}
	}
	if least == math.MaxInt64 {
		return 0
	}
	return least
}

// stop ends the device loop and tells every client the device is gone.
func (g *gpu) stop() {
	g.stopped.Store(true)
	atomic.StoreUint32(&g.db.Dead, 1)
	atomic.AddUint32(&g.db.Ring, 1)
	futexWake(&g.db.Ring)
	<-g.done
	g.mu.Lock()
	for _, c := range g.ctxs {
		atomic.StoreUint32(&c.shm.Dead, 1)
		for i := range c.shm.Ch {
			atomic.AddUint32(&c.shm.Ch[i].Done, 1)
			futexWake(&c.shm.Ch[i].Done)
		}
	}
	g.mu.Unlock()
}
