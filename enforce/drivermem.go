package enforce

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/gpusched"
)

// DriverMemory reads, once a window, the driver's own figure of the video
// memory of each process it is asked about (Steering.DriverMemory): the
// reconciliation beside what the probes charged, whose difference is each
// context's own buffers (docs/memory.md §2). It also reads each GPU's
// memory once (Steering.GPUMemorySize), against which the probes hold
// limits given as a share (bpf.Probes.SetGPUMemorySize). It holds nothing.
type DriverMemory struct {
	steer  *Steering
	probes *bpf.Probes // nil: none to tell GPU sizes to
	log    *slog.Logger

	mu  sync.Mutex
	ask map[int]*driverMemoryAsk // per GPU, what the next read asks
	// read is what the last read found, per GPU, per process.
	read atomic.Pointer[map[int]map[uint32]uint64]
	// sizes is each GPU's memory in bytes, once read (a GPU's size does
	// not change while its driver is loaded).
	sizes atomic.Pointer[map[int]uint64]
	// kicked are the GPUs Ask has woken Run for (under mu): a GPU whose
	// size cannot be read is tried again once a period, not every step.
	kicked map[int]bool
	// unsized wakes Run for a GPU asked about whose size is not read: a
	// share limit holds there from that read, not from the next window.
	unsized chan struct{}
}

// driverMemoryAsk is one GPU's question: through which groups (the first
// whose process still lives answers) and about which processes.
type driverMemoryAsk struct {
	via  []gpusched.Group
	pids []uint32
}

// maxDriverMemoryVia is how many groups of a GPU a read tries before it
// gives up on that GPU until the next: their processes may end meanwhile.
const maxDriverMemoryVia = 3

// NewDriverMemory returns a reader through s that tells p (nil: none)
// each GPU's size.
func NewDriverMemory(s *Steering, p *bpf.Probes, log *slog.Logger) *DriverMemory {
	return &DriverMemory{steer: s, probes: p, log: log, kicked: map[int]bool{}, unsized: make(chan struct{}, 1)}
}

// Ask sets what the next read asks: per tenant, the channel groups of its
// processes per GPU (the reads go through them) and its live processes
// (pidsOf), whose figures are read on every GPU a group of any tenant is
// on.
func (r *DriverMemory) Ask(groups map[string]map[int][]gpusched.Group, pidsOf func(tenant string) []uint32) {
	ask := map[int]*driverMemoryAsk{}
	for name, byGPU := range groups {
		for gpu, gs := range byGPU {
			a := ask[gpu]
			if a == nil {
				a = &driverMemoryAsk{}
				ask[gpu] = a
			}
			if len(a.via) < maxDriverMemoryVia && len(gs) > 0 {
				a.via = append(a.via, gs[0])
			}
			a.pids = append(a.pids, pidsOf(name)...)
		}
	}
	for _, a := range ask {
		slices.Sort(a.pids)
		a.pids = slices.Compact(a.pids)
	}
	r.mu.Lock()
	r.ask = ask
	kick := false
	for gpu := range ask {
		if !r.kicked[gpu] && r.GPUBytes(gpu) == 0 {
			r.kicked[gpu], kick = true, true
		}
	}
	r.mu.Unlock()
	if kick {
		select {
		case r.unsized <- struct{}{}:
		default:
		}
	}
}

// Run reads every period until ctx ends, and the size of a GPU as soon as
// Ask names one whose size is not read. A GPU whose figures cannot be read
// keeps none; why is logged when it changes.
func (r *DriverMemory) Run(ctx context.Context, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	lastErr, lastSizeErr := map[int]string{}, map[int]string{}
	for {
		var sizesOnly bool
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-r.unsized:
			sizesOnly = true
		}
		r.mu.Lock()
		ask := r.ask
		r.mu.Unlock()
		if sizesOnly {
			r.readSizes(ask, lastSizeErr)
			continue
		}
		read := map[int]map[uint32]uint64{}
		for gpu, a := range ask {
			why := firstAnswer(a.via, func(g gpusched.Group) error {
				got, err := r.steer.DriverMemory(g, a.pids)
				if err == nil {
					read[gpu] = got
				}
				return err
			})
			r.logChange(lastErr, gpu, why, "GPU memory: the driver's per-process figure cannot be read")
		}
		r.read.Store(&read)
		r.readSizes(ask, lastSizeErr)
	}
}

// readSizes reads the memory of each GPU asked about whose size is not
// known yet, through the first of its groups that answers, and tells the
// probes. Why a GPU's cannot be read is logged when it changes.
func (r *DriverMemory) readSizes(ask map[int]*driverMemoryAsk, lastErr map[int]string) {
	sizes := r.sizes.Load()
	next := map[int]uint64{}
	if sizes != nil {
		maps.Copy(next, *sizes)
	}
	for gpu, a := range ask {
		if next[gpu] != 0 {
			continue
		}
		why := firstAnswer(a.via, func(g gpusched.Group) error {
			size, err := r.steer.GPUMemorySize(g)
			if err == nil && r.probes != nil {
				err = r.probes.SetGPUMemorySize(gpu, size)
			}
			if err == nil {
				next[gpu] = size
				r.log.Info("GPU memory size read from the driver", "gpu", gpu, "bytes", size)
			}
			return err
		})
		r.logChange(lastErr, gpu, why, "GPU memory: the GPU's size cannot be read; limits given as a share do not hold on it")
	}
	r.sizes.Store(&next)
}

// firstAnswer calls read with each of groups until one succeeds: "" then,
// else why the last failed.
func firstAnswer(groups []gpusched.Group, read func(gpusched.Group) error) string {
	why := "no group to ask through"
	for _, g := range groups {
		err := read(g)
		if err == nil {
			return ""
		}
		why = err.Error()
	}
	return why
}

// logChange logs why gpu's figure cannot be read when it changed from
// last[gpu], and records it.
func (r *DriverMemory) logChange(last map[int]string, gpu int, why, msg string) {
	if why != last[gpu] && why != "" {
		r.log.Warn(msg, "gpu", gpu, "err", why)
	}
	last[gpu] = why
}

// GPUBytes is gpu's memory as read from the driver; 0 until read.
func (r *DriverMemory) GPUBytes(gpu int) uint64 {
	if sizes := r.sizes.Load(); sizes != nil {
		return (*sizes)[gpu]
	}
	return 0
}

// Of is what the driver last counted for pids on gpu, and whether it was
// read there.
func (r *DriverMemory) Of(gpu int, pids []uint32) (uint64, bool) {
	read := r.read.Load()
	if read == nil {
		return 0, false
	}
	byPID, ok := (*read)[gpu]
	if !ok {
		return 0, false
	}
	var sum uint64
	for _, pid := range pids {
		sum += byPID[pid]
	}
	return sum, true
}
