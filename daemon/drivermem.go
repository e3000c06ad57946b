package daemon

import (
	"context"
	"slices"
	"time"

	"github.com/gpuarb/gpuarb/control"
	"github.com/gpuarb/gpuarb/gpusched"
)

// driverMemory is the driver's own figure of each process's video memory,
// per GPU, as last read (GET_PID_INFO through a tenant process's control
// file): the reconciliation beside what the probes charged, whose
// difference is each context's own buffers (docs/memory.md §2).
type driverMemory map[int]map[uint32]uint64

// driverMemoryAsk is what the next read asks the driver, per GPU: through
// which groups (the first whose process still lives answers) and for which
// processes.
type driverMemoryAsk struct {
	via  []gpusched.Group
	pids []uint32
}

// maxDriverMemoryVia is how many groups of a GPU a read tries before it
// gives up on that GPU until the next: their processes may end meanwhile.
const maxDriverMemoryVia = 3

// askDriverMemory records, from a control step's tenants and their
// channel groups, what the next read of the driver's figures asks.
func (d *Daemon) askDriverMemory(res control.Result, groups map[string]map[int][]gpusched.Group) {
	ask := map[int]*driverMemoryAsk{}
	for name, byGPU := range groups {
		ct := res.Tenants[name]
		for gpu, gs := range byGPU {
			a := ask[gpu]
			if a == nil {
				a = &driverMemoryAsk{}
				ask[gpu] = a
			}
			if len(a.via) < maxDriverMemoryVia && len(gs) > 0 {
				a.via = append(a.via, gs[0])
			}
			if ct == nil {
				continue
			}
			for _, m := range ct.Members {
				if !m.Exited {
					a.pids = append(a.pids, m.PID)
				}
			}
		}
	}
	for _, a := range ask {
		slices.Sort(a.pids)
		a.pids = slices.Compact(a.pids)
	}
	d.mu.Lock()
	d.driverAsk = ask
	d.mu.Unlock()
}

// readDriverMemory reads the driver's figures once a window until ctx
// ends. A GPU whose figures cannot be read keeps none; why is logged when
// it changes.
func (d *Daemon) readDriverMemory(ctx context.Context) {
	tick := time.NewTicker(d.cfg.Window)
	defer tick.Stop()
	lastErr := map[int]string{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		d.mu.Lock()
		ask := d.driverAsk
		d.mu.Unlock()
		read := driverMemory{}
		for gpu, a := range ask {
			var why string
			for _, g := range a.via {
				got, err := d.steer.DriverMemory(g, a.pids)
				if err == nil {
					read[gpu], why = got, ""
					break
				}
				why = err.Error()
			}
			if why != lastErr[gpu] {
				if why != "" {
					d.log.Warn("GPU memory: the driver's per-process figure cannot be read", "gpu", gpu, "err", why)
				}
				lastErr[gpu] = why
			}
		}
		d.driverMem.Store(&read)
	}
}

// driverMemoryOf is what the driver last counted for a tenant's live
// processes on gpu, and whether it was read there.
func (d *Daemon) driverMemoryOf(ct *control.Tenant, gpu int) (uint64, bool) {
	read := d.driverMem.Load()
	if read == nil {
		return 0, false
	}
	byPID, ok := (*read)[gpu]
	if !ok {
		return 0, false
	}
	var sum uint64
	for _, m := range ct.Members {
		if !m.Exited {
			sum += byPID[m.PID]
		}
	}
	return sum, true
}
