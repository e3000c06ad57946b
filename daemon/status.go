package daemon

import (
	"sort"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/arbiter"
	"github.com/gpuarb/gpuarb/classify"
	"github.com/gpuarb/gpuarb/control"
	"github.com/gpuarb/gpuarb/enforce"
	"github.com/gpuarb/gpuarb/meter"
)

// stepView is what a control step published for status and metrics: a
// row per tenant and GPU, immutable once stored.
type stepView struct {
	at     time.Time
	rows   []api.Tenant
	gpus   []api.GPU
	window time.Duration
}

// publish builds the step's rows. Called with d.mu held.
func (d *Daemon) publish(res control.Result, snap meter.Snapshot, actuation map[int]arbiter.Actuation, memory map[string]enforce.MemoryUsage) {
	secs := d.cfg.Window.Seconds()
	longRun := map[meter.TenantKey]float64{}
	for _, t := range snap.Tenants {
		longRun[meter.TenantKey{CgroupID: t.CgroupID, GPU: t.GPU}] = t.LongRunShare
	}
	v := &stepView{at: time.Now(), window: d.cfg.Window}
	for name, ct := range res.Tenants {
		t := d.tenants[name]
		if t == nil {
			continue
		}
		for gpu, in := range ct.GPUs {
			u := ct.Usage[gpu]
			row := api.Tenant{Name: name, Cgroup: ct.Cgroup, CgroupID: u.CgroupID, GPU: gpu, Share: in.SettledShare,
				GPUNS: u.GPUNS, LongRunShare: longRun[meter.TenantKey{CgroupID: u.CgroupID, GPU: gpu}],
				LaunchesPerS: float64(u.Launches) / secs, SyncsPerS: float64(u.Syncs) / secs,
				QueueNS: u.QueueNS, Processes: u.Processes, LaunchNS: in.LaunchNS, Weight: int(ct.Rules.Weight),
				Limit: float64(ct.Rules.Limit), Priority: string(ct.Rules.Priority), Duty: 1, Demand: in.Demand,
				WantShare: float64(u.WantNS) / float64(d.cfg.Window), SyncP99MS: in.SyncP99MS, FPS: in.FPS,
				EqualFPS: ct.Rules.EqualFPS, State: "idle"}
			if in.Busy {
				row.State = "running"
			}
			if dec, ok := t.decisions[gpu]; ok {
				row.TargetShare, row.Duty, row.Reason, row.SLOMissed = dec.Target, dec.Duty, dec.Reason, dec.SLOMissed
				if dec.Scheduled {
					row.TimesliceUS = time.Duration(dec.Timeslice).Microseconds()
				}
			}
			row.BurstNS = in.BurstNS
			if d.spy != nil {
				row.MemBytes, row.HostMemBytes, row.ManagedBytes = d.spy.Table().Held(ct.LivePIDs(), gpu)
			}
			if b, ok := d.driverMem.Of(gpu, ct.LivePIDs()); ok {
				row.DriverMemBytes = &b
			}
			if mu, ok := memory[name]; ok {
				row.MemoryLimit, row.MemoryLimitShare, row.OOMKills = mu.Limit.On(d.driverMem.GPUBytes(gpu)), mu.Limit.Share, mu.Kills[gpu]
			}
			if name == ct.Cgroup {
				row.Label = classify.Label(ct.Cgroup)
				row.Unregistered = classify.PodCgroup(ct.Cgroup)
			}
			row.UnprobedPIDs = t.unprobed
			row.Actuator = actuatorName(actuation[gpu], t)
			if in.Unsteered {
				row.Actuator = actuatorName(arbiter.Pacing, t) + " (channel groups unknown or refused)"
			}
			tot := t.totals[gpu]
			row.GPUNSTotal, row.LaunchesTotal, row.SyncsTotal = tot.GPUNS, tot.Launches, tot.Syncs
			v.rows = append(v.rows, row)
		}
	}
	holds := d.hold.Stats()
	for _, g := range snap.GPUs {
		gv := api.GPU{Index: g.Index, BusyShare: g.BusyShare, Tenants: g.Tenants, Actuator: actuatorName(actuation[g.Index], nil),
			MemoryBytes: d.driverMem.GPUBytes(g.Index)}
		if why, ok := d.steerWhy[g.Index]; ok && actuation[g.Index] != arbiter.Scheduler {
			gv.SchedulerUnavailable = why
		}
		if actuation[g.Index] == arbiter.Scheduler {
			sl := d.arb.SlicesOf(g.Index)
			gv.BaseSliceUS, gv.MinSliceUS = sl.Base.Microseconds(), sl.Min.Microseconds()
		}
		h := holds[g.Index]
		gv.LatencyHolds, gv.LatencyHoldsCut, gv.LatencyHeldNS = h.Holds, h.Cut, uint64(h.Held)
		gv.LatencyHoldStartUS, gv.LatencyHoldBoundUS = h.Start.Microseconds(), h.Bound.Microseconds()
		v.gpus = append(v.gpus, gv)
	}
	d.published.Store(v)
}

// actuatorName says how a GPU's tenants (or one tenant) are held to their
// shares.
func actuatorName(a arbiter.Actuation, t *tenant) string {
	switch a {
	case arbiter.Scheduler:
		return "gpu scheduler"
	case arbiter.Windows:
		return "freeze windows"
	}
	if t != nil {
		return t.act.PacedBy(len(t.unprobed) > 0)
	}
	return "launch gate"
}

// Status builds the status document from the last control step's rows,
// with the tenants' live states, the policy's tenants that have no GPU
// work yet, and the probes' figures.
func (d *Daemon) Status() api.Status {
	st := api.Status{Version: d.cfg.Version, WindowNS: uint64(d.cfg.Window), Tenants: []api.Tenant{}, GPUs: []api.GPU{}}
	v := d.published.Load()
	if v != nil {
		st.Tenants = append(st.Tenants, v.rows...)
		st.GPUs = append(st.GPUs, v.gpus...)
	}
	d.mu.Lock()
	listed := map[string]bool{}
	for i := range st.Tenants {
		row := &st.Tenants[i]
		listed[row.Name] = true
		t := d.tenants[row.Name]
		if t == nil {
			continue
		}
		row.State, row.ThrottledNS = t.act.LiveState(enforce.Shown{State: row.State, Duty: row.Duty, Enforcing: d.enforcing,
			OnScheduler: row.Actuator == "gpu scheduler", SteeredAway: steeredAway(row, time.Duration(d.arb.SlicesOf(row.GPU).Base)),
			Unprobed: len(t.unprobed) > 0})
		if g := t.act.Gater(); g != nil {
			row.GateEscapes, _ = g.Escapes()
		}
		row.GateErrors, row.LastGateError = t.act.Errors()
	}
	for _, pt := range d.policy.Tenants {
		if listed[pt.Name] {
			continue
		}
		// Attached, no GPU work seen yet: shown with its rules.
		st.Tenants = append(st.Tenants, api.Tenant{Name: pt.Name, Cgroup: pt.Cgroup, GPU: -1, Weight: int(pt.Rules.Weight),
			Limit: float64(pt.Rules.Limit), Priority: string(pt.Rules.Priority), Duty: 1, State: "idle"})
	}
	st.Enforcing = d.enforcing
	st.PolicyError = d.policyErr
	if d.nri != nil {
		nri := d.nri.Status()
		st.NRI = &nri
	}
	var sum time.Duration
	for _, c := range d.controlTimes {
		sum += c
	}
	if len(d.controlTimes) > 0 {
		st.ControlNS = uint64(sum) / uint64(len(d.controlTimes))
	}
	if d.cfg.Exact != nil {
		st.ExactSource = d.cfg.Exact.Name()
		for i := range st.Tenants {
			if x, ok := d.exactShares[st.Tenants[i].Cgroup]; ok {
				st.Tenants[i].ExactShare = &x
			}
		}
	}
	d.mu.Unlock()
	sort.SliceStable(st.Tenants, func(i, j int) bool {
		if st.Tenants[i].Share != st.Tenants[j].Share {
			return st.Tenants[i].Share > st.Tenants[j].Share
		}
		return st.Tenants[i].Name < st.Tenants[j].Name
	})
	if d.guardian != nil {
		pid, restarts, cg := d.guardian.State()
		st.Guardian = &api.Guardian{PID: pid, Restarts: restarts, Cgroup: cg}
	}
	if d.probes != nil {
		st.Probes.Libcudas = d.probes.Libcudas()
		st.Probes.LostEvents, _ = d.probes.Lost()
		st.Probes.ExitsReconciled = d.exitsReconciled.Load()
		st.Probes.UprobeMulti = d.probes.UprobeMulti()
		st.Probes.UnrecordedLaunches, _ = d.probes.UnrecordedLaunches()
		st.Probes.UnfollowedForks, _ = d.probes.UnfollowedForks()
		st.Probes.LibcudasRefused = d.probes.RefusedLibcudas()
	}
	st.Probes.FoldedLaunches = d.meter.Folded()
	if d.spy != nil {
		st.Probes.Events, _ = d.spy.Counts()
		st.Probes.AttachDrops = d.spy.AttachDrops()
		st.Probes.ObjectsDropped, st.Probes.UntrackedAllocs = d.spy.Table().Dropped()
		st.Probes.MappingScans, st.Probes.FoundByMapping = d.spy.Scans()
	}
	for _, dev := range d.cfg.Devices {
		st.Probes.Devices = append(st.Probes.Devices, dev.String())
	}
	st.Probes.PinPath = d.cfg.PinPath
	return st
}

// steeredAway tells whether gpuarb runs a tenant's channel groups other
// than the driver would: a timeslice not its GPU's base, or paused part of
// each period.
func steeredAway(row *api.Tenant, base time.Duration) bool {
	return row.TimesliceUS > 0 && row.TimesliceUS != base.Microseconds() || row.Duty < 1
}
