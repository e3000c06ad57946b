package enforce

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuarb/gpuarb/gpusched"
)

// DriverMemory reads, once a window, the driver's own figure of the video
// memory of each process it is asked about (Steering.DriverMemory): the
// reconciliation beside what the probes charged, whose difference is each
// context's own buffers (docs/memory.md §2). It reads and holds nothing.
type DriverMemory struct {
	steer *Steering
	log   *slog.Logger

	mu  sync.Mutex
	ask map[int]*driverMemoryAsk // per GPU, what the next read asks
	// read is what the last read found, per GPU, per process.
	read atomic.Pointer[map[int]map[uint32]uint64]
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

// NewDriverMemory returns a reader through s.
func NewDriverMemory(s *Steering, log *slog.Logger) *DriverMemory {
	return &DriverMemory{steer: s, log: log}
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
	r.mu.Unlock()
}

// Run reads every period until ctx ends. A GPU whose figures cannot be
// read keeps none; why is logged when it changes.
func (r *DriverMemory) Run(ctx context.Context, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	lastErr := map[int]string{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		r.mu.Lock()
		ask := r.ask
		r.mu.Unlock()
		read := map[int]map[uint32]uint64{}
		for gpu, a := range ask {
			var why string
			for _, g := range a.via {
				got, err := r.steer.DriverMemory(g, a.pids)
				if err == nil {
					read[gpu], why = got, ""
					break
				}
				why = err.Error()
			}
			if why != lastErr[gpu] {
				if why != "" {
					r.log.Warn("GPU memory: the driver's per-process figure cannot be read", "gpu", gpu, "err", why)
				}
				lastErr[gpu] = why
			}
		}
		r.read.Store(&read)
	}
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
