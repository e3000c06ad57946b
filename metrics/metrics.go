// Package metrics exposes the daemon's status document as Prometheus
// metrics. Every scrape reads a fresh status; labels are only the tenant
// name and the GPU index, so the series count grows with tenants, never
// with processes or events.
package metrics

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuarb/gpuarb/api"
)

// Path is where the metrics are served.
const Path = "/metrics"

var (
	tenantLabels = []string{"tenant", "gpu"}

	gpuSeconds  = desc("tenant_gpu_seconds_total", "GPU time attributed to the tenant (estimated from the probes).", tenantLabels)
	share       = desc("tenant_share", "Fraction of the GPU's time the tenant used in the last window (0..1).", tenantLabels)
	target      = desc("tenant_target_share", "Share the arbiter aims the tenant at (0..1).", tenantLabels)
	duty        = desc("tenant_duty", "Fraction of each control period the tenant may submit work (1: not throttled).", tenantLabels)
	throttled   = desc("tenant_throttled_seconds_total", "Time the arbiter held the tenant frozen or stopped.", tenantLabels)
	launches    = desc("tenant_launches_total", "Kernel and graph launches and submissions of the tenant.", tenantLabels)
	syncs       = desc("tenant_syncs_total", "Synchronizations of the tenant that returned.", tenantLabels)
	memory      = desc("tenant_memory_bytes", "Device memory the tenant's processes hold on the GPU, as the driver made and freed it.", tenantLabels)
	driverMem   = desc("tenant_driver_memory_bytes", "Video memory the driver itself counts for the tenant's processes on the GPU, the contexts' own buffers included (only where the driver could be asked).", tenantLabels)
	managedMem  = desc("managed_memory_bytes", "Address space the tenant's processes reserved as managed memory (cudaMallocManaged), on no GPU in particular (only tenants with some).", []string{"tenant"})
	memLimit    = desc("gpu_memory_limit_bytes", "The tenant's GPU memory limit on each GPU (only tenants with one).", tenantLabels)
	oomKills    = desc("gpu_memory_oom_kills_total", "Processes of the tenant killed at a device memory allocation past its GPU memory limit.", tenantLabels)
	syncP99     = desc("tenant_sync_p99_seconds", "99th percentile of the tenant's sync waits in the last window.", tenantLabels)
	processes   = desc("tenant_processes", "Processes of the tenant using the GPU.", tenantLabels)
	gateErrors  = desc("tenant_gate_errors_total", "Failed freezes, thaws and pauses of the tenant (each undone; it may get more than its share meanwhile).", tenantLabels)
	unprobed    = desc("tenant_unprobed_processes", "Processes of the tenant using the GPU through a driver gpuarb does not probe (metered as busy whenever they may run).", tenantLabels)
	gpuMemory   = desc("gpu_memory_bytes", "The GPU's memory as the driver reports it to allocators (limits given as a share are of it; only once read).", []string{"gpu"})
	gpuBusy     = desc("gpu_busy_ratio", "Fraction of the GPU's time some tenant held it in the last window (0..1).", []string{"gpu"})
	baseSlice   = desc("gpu_base_timeslice_seconds", "Timeslice the steered GPU's busy channel groups average when they weigh the same (set by what a switch costs there).", []string{"gpu"})
	minSlice    = desc("gpu_min_timeslice_seconds", "Shortest timeslice gpuarb gives a channel group on the steered GPU.", []string{"gpu"})
	holds       = desc("gpu_latency_holds_total", "Times a latency tenant's launch took the other tenants' channel groups off the GPU until its wait ended.", []string{"gpu"})
	holdsCut    = desc("gpu_latency_holds_cut_total", "Latency holds ended by their bound (20 ms) rather than by the wait's end.", []string{"gpu"})
	held        = desc("gpu_latency_held_seconds_total", "Time the other tenants' channel groups were off the GPU for latency holds.", []string{"gpu"})
	probeEvents = desc("probe_events_total", "Events read from the probes' ring buffer.", nil)
	probeLost   = desc("probe_lost_events_total", "Events the probes dropped because the ring buffer was full.", nil)
	exitsRecon  = desc("meter_exits_reconciled_total", "Processes the meter ended because they were gone with no exit event seen (lost).", nil)
	unfollowed  = desc("probe_unfollowed_forks_total", "Processes forked below a pid tenant's that the probes could not follow (table full).", nil)
	libsRefused = desc("probe_libcudas_refused_total", "libcuda copies not probed because 256 were already, or 16 of one cgroup's (their processes are held as unprobed).", nil)
	objsDropped = desc("probe_objects_dropped_total", "RM objects not kept because their process had 4096 already (a process's claims of allocations are read from its memory).", nil)
	folded      = desc("meter_folded_launches_total", "Launches a process's bounds (1024 streams, 4096 kernels) sent to one overflow stream and cost (still charged).", nil)
	untracked   = desc("probe_untracked_allocs_total", "Device memory allocations beyond 65536 per process, not counted in its memory.", nil)
	enforcing   = desc("enforcing", "1 while the arbiter enforces the policy, 0 while it only observes.", nil)
	build       = desc("build_info", "The daemon's version.", []string{"version"})
)

func desc(name, help string, labels []string) *prometheus.Desc {
	return prometheus.NewDesc("gpuarb_"+name, help, labels, nil)
}

// Collector turns the status document into metrics at every scrape.
type Collector struct {
	status func() api.Status
}

// NewCollector returns a Collector reading status at every scrape.
func NewCollector(status func() api.Status) *Collector {
	return &Collector{status: status}
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{gpuSeconds, share, target, duty, throttled, launches, syncs, memory, driverMem, managedMem, memLimit, oomKills,
		syncP99, processes, gateErrors, unprobed, gpuMemory, gpuBusy, baseSlice, minSlice, holds, holdsCut, held, probeEvents, probeLost, exitsRecon, unfollowed, libsRefused, objsDropped, folded, untracked, enforcing, build} {
		ch <- d
	}
}

// Collect reads the status once and sends its figures.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	managed := map[string]bool{} // tenants whose managed memory is sent: once, not per GPU
	for _, t := range st.Tenants {
		gpu := strconv.Itoa(t.GPU)
		name := labelValue(t.Name)
		m := func(d *prometheus.Desc, kind prometheus.ValueType, v float64) {
			ch <- prometheus.MustNewConstMetric(d, kind, v, name, gpu)
		}
		m(gpuSeconds, prometheus.CounterValue, float64(t.GPUNSTotal)/1e9)
		m(share, prometheus.GaugeValue, t.Share)
		m(target, prometheus.GaugeValue, t.TargetShare)
		m(duty, prometheus.GaugeValue, t.Duty)
		m(throttled, prometheus.CounterValue, float64(t.ThrottledNS)/1e9)
		m(launches, prometheus.CounterValue, float64(t.LaunchesTotal))
		m(syncs, prometheus.CounterValue, float64(t.SyncsTotal))
		m(memory, prometheus.GaugeValue, float64(t.MemBytes))
		if t.DriverMemBytes != nil {
			m(driverMem, prometheus.GaugeValue, float64(*t.DriverMemBytes))
		}
		if t.ManagedBytes != 0 && !managed[name] {
			managed[name] = true
			ch <- prometheus.MustNewConstMetric(managedMem, prometheus.GaugeValue, float64(t.ManagedBytes), name)
		}
		if t.MemoryLimit != 0 {
			m(memLimit, prometheus.GaugeValue, float64(t.MemoryLimit))
		}
		if t.MemoryLimit != 0 || t.MemoryLimitShare != 0 {
			m(oomKills, prometheus.CounterValue, float64(t.OOMKills))
		}
		m(syncP99, prometheus.GaugeValue, t.SyncP99MS/1e3)
		m(processes, prometheus.GaugeValue, float64(t.Processes))
		m(gateErrors, prometheus.CounterValue, float64(t.GateErrors))
		m(unprobed, prometheus.GaugeValue, float64(len(t.UnprobedPIDs)))
	}
	for _, g := range st.GPUs {
		ch <- prometheus.MustNewConstMetric(gpuBusy, prometheus.GaugeValue, g.BusyShare, strconv.Itoa(g.Index))
		if g.MemoryBytes != 0 {
			ch <- prometheus.MustNewConstMetric(gpuMemory, prometheus.GaugeValue, float64(g.MemoryBytes), strconv.Itoa(g.Index))
		}
		if g.BaseSliceUS > 0 {
			ch <- prometheus.MustNewConstMetric(baseSlice, prometheus.GaugeValue, float64(g.BaseSliceUS)/1e6, strconv.Itoa(g.Index))
			ch <- prometheus.MustNewConstMetric(minSlice, prometheus.GaugeValue, float64(g.MinSliceUS)/1e6, strconv.Itoa(g.Index))
			ch <- prometheus.MustNewConstMetric(holds, prometheus.CounterValue, float64(g.LatencyHolds), strconv.Itoa(g.Index))
			ch <- prometheus.MustNewConstMetric(holdsCut, prometheus.CounterValue, float64(g.LatencyHoldsCut), strconv.Itoa(g.Index))
			ch <- prometheus.MustNewConstMetric(held, prometheus.CounterValue, float64(g.LatencyHeldNS)/1e9, strconv.Itoa(g.Index))
		}
	}
	ch <- prometheus.MustNewConstMetric(probeEvents, prometheus.CounterValue, float64(st.Probes.Events))
	ch <- prometheus.MustNewConstMetric(probeLost, prometheus.CounterValue, float64(st.Probes.LostEvents))
	ch <- prometheus.MustNewConstMetric(exitsRecon, prometheus.CounterValue, float64(st.Probes.ExitsReconciled))
	ch <- prometheus.MustNewConstMetric(unfollowed, prometheus.CounterValue, float64(st.Probes.UnfollowedForks))
	ch <- prometheus.MustNewConstMetric(libsRefused, prometheus.CounterValue, float64(st.Probes.LibcudasRefused))
	ch <- prometheus.MustNewConstMetric(objsDropped, prometheus.CounterValue, float64(st.Probes.ObjectsDropped))
	ch <- prometheus.MustNewConstMetric(folded, prometheus.CounterValue, float64(st.Probes.FoldedLaunches))
	ch <- prometheus.MustNewConstMetric(untracked, prometheus.CounterValue, float64(st.Probes.UntrackedAllocs))
	on := 0.0
	if st.Enforcing {
		on = 1
	}
	ch <- prometheus.MustNewConstMetric(enforcing, prometheus.GaugeValue, on)
	ch <- prometheus.MustNewConstMetric(build, prometheus.GaugeValue, 1, labelValue(st.Version))
}

// labelValue makes s a valid label value: a name that is not UTF-8 (a
// cgroup's, which the kernel takes as any bytes) has each byte that is not
// part of a UTF-8 character written as \xNN; a valid one is kept as it is
// (systemd's own escapes included). A crafted valid name equal to another's
// escaped form makes both series duplicates, which the scrape reports and
// leaves out; the other tenants' series stay.
func labelValue(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&b, "\\x%02x", s[0])
		} else {
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

// Handler serves the gpuarb metrics and the daemon process's own (Go
// runtime, CPU, memory) on Path.
func Handler(status func() api.Status) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(status), collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle(Path, promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	return mux
}

// ListenAddr completes a --metrics-addr value: a bare port (":9400" or
// "9400") listens on 127.0.0.1 only; an explicit host is kept.
func ListenAddr(addr string) (string, error) {
	if _, err := strconv.Atoi(addr); err == nil {
		return net.JoinHostPort("127.0.0.1", addr), nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}
