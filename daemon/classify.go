package daemon

import (
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/meter"
)

// pidTrees returns the processes of the pid tenants rooted at roots
// (bpf.TreeFollower). Called by the control loop (under stepMu), which
// owns d.trees.
func (d *Daemon) pidTrees(roots []int) map[int][]int {
	if d.trees == nil {
		d.trees = bpf.NewTreeFollower(d.probes)
	}
	out, err := d.trees.Trees(roots)
	if err != nil {
		d.log.Warn("follow pid tenants", "err", err)
	}
	return out
}

// meterUnprobed hands the meter the live processes that have GPU channel
// groups but map no libcuda the probes could attach to (ioctlspy's
// Unprobed): their launches are unseen, so the meter models each as busy
// whenever it may run. It logs each one once and returns them.
func (d *Daemon) meterUnprobed() map[uint32]bool {
	out := map[uint32]bool{}
	if d.spy == nil {
		return out
	}
	now := meter.MonotonicNow()
	for _, p := range d.spy.Unprobed() {
		if cgroup.Gone(int(p.PID)) {
			continue
		}
		out[p.PID] = true
		d.meter.Observe(meter.Unprobed(p.PID, p.CgroupID, int(p.Groups()[0].GPU), now))
		if !d.unprobed[p.PID] {
			d.log.Warn("a process uses the GPU through a driver gpuarb does not probe: it is metered as busy whenever it may run and held by pausing its channel groups or freezing it",
				"pid", p.PID, "comm", p.Comm)
		}
	}
	d.unprobed = out
	return out
}
