package metrics

import (
	"math"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

func TestScrapeStatus(t *testing.T) {
	driver := uint64(1<<30 + 32<<20)
	st := api.Status{Version: "v9", Enforcing: true,
		Tenants: []api.Tenant{
			{Name: "train", GPU: 0, Share: 0.7, TargetShare: 0.5, Duty: 0.6, GPUNSTotal: 12_500_000_000,
				ThrottledNS: 3_000_000_000, LaunchesTotal: 4000, SyncsTotal: 40, MemBytes: 1 << 30, DriverMemBytes: &driver, MemoryLimit: 2 << 30, OOMKills: 3, SyncP99MS: 25, Processes: 4, GateErrors: 2,
				UnprobedPIDs: []int{77, 78}, ManagedBytes: 512 << 20},
			{Name: "train", GPU: 1, Duty: 1, ManagedBytes: 512 << 20},
			{Name: "infer", GPU: 1, Share: 0.2, Duty: 1, GPUNSTotal: 1_000_000, LaunchesTotal: 7, SyncsTotal: 7},
		},
		GPUs: []api.GPU{{Index: 0, BusyShare: 0.95, MemoryBytes: 80 << 30, BaseSliceUS: 2048, MinSliceUS: 1024,
			LatencyHolds: 400, LatencyHoldsCut: 3, LatencyHeldNS: 520_000_000}, {Index: 1, BusyShare: 0.2}},
		Probes: api.Probes{Events: 123456, LostEvents: 3, ExitsReconciled: 2, UnfollowedForks: 5,
			LibcudasRefused: 7, ObjectsDropped: 6, FoldedLaunches: 8, UntrackedAllocs: 9},
	}
	srv := httptest.NewServer(Handler(func() api.Status { return st }))
	defer srv.Close()
	fams := testutil.ScrapeMetrics(t, srv.URL+Path)
	train := map[string]string{"tenant": "train", "gpu": "0"}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
		kind   dto.MetricType
	}{
		{"gpuarb_tenant_gpu_seconds_total", train, 12.5, dto.MetricType_COUNTER},
		{"gpuarb_tenant_share", train, 0.7, dto.MetricType_GAUGE},
		{"gpuarb_tenant_target_share", train, 0.5, dto.MetricType_GAUGE},
		{"gpuarb_tenant_duty", train, 0.6, dto.MetricType_GAUGE},
		{"gpuarb_tenant_throttled_seconds_total", train, 3, dto.MetricType_COUNTER},
		{"gpuarb_tenant_launches_total", train, 4000, dto.MetricType_COUNTER},
		{"gpuarb_tenant_syncs_total", train, 40, dto.MetricType_COUNTER},
		{"gpuarb_tenant_memory_bytes", train, 1 << 30, dto.MetricType_GAUGE},
		{"gpuarb_tenant_driver_memory_bytes", train, 1<<30 + 32<<20, dto.MetricType_GAUGE},
		{"gpuarb_gpu_memory_limit_bytes", train, 2 << 30, dto.MetricType_GAUGE},
		{"gpuarb_managed_memory_bytes", map[string]string{"tenant": "train"}, 512 << 20, dto.MetricType_GAUGE},
		{"gpuarb_gpu_memory_oom_kills_total", train, 3, dto.MetricType_COUNTER},
		{"gpuarb_tenant_sync_p99_seconds", train, 0.025, dto.MetricType_GAUGE},
		{"gpuarb_tenant_processes", train, 4, dto.MetricType_GAUGE},
		{"gpuarb_tenant_gate_errors_total", train, 2, dto.MetricType_COUNTER},
		{"gpuarb_tenant_unprobed_processes", train, 2, dto.MetricType_GAUGE},
		{"gpuarb_tenant_launches_total", map[string]string{"tenant": "infer", "gpu": "1"}, 7, dto.MetricType_COUNTER},
		{"gpuarb_gpu_busy_ratio", map[string]string{"gpu": "0"}, 0.95, dto.MetricType_GAUGE},
		{"gpuarb_gpu_memory_bytes", map[string]string{"gpu": "0"}, 80 << 30, dto.MetricType_GAUGE},
		{"gpuarb_gpu_base_timeslice_seconds", map[string]string{"gpu": "0"}, 0.002048, dto.MetricType_GAUGE},
		{"gpuarb_gpu_min_timeslice_seconds", map[string]string{"gpu": "0"}, 0.001024, dto.MetricType_GAUGE},
		{"gpuarb_gpu_latency_holds_total", map[string]string{"gpu": "0"}, 400, dto.MetricType_COUNTER},
		{"gpuarb_gpu_latency_holds_cut_total", map[string]string{"gpu": "0"}, 3, dto.MetricType_COUNTER},
		{"gpuarb_gpu_latency_held_seconds_total", map[string]string{"gpu": "0"}, 0.52, dto.MetricType_COUNTER},
		{"gpuarb_probe_events_total", nil, 123456, dto.MetricType_COUNTER},
		{"gpuarb_probe_lost_events_total", nil, 3, dto.MetricType_COUNTER},
		{"gpuarb_meter_exits_reconciled_total", nil, 2, dto.MetricType_COUNTER},
		{"gpuarb_probe_unfollowed_forks_total", nil, 5, dto.MetricType_COUNTER},
		{"gpuarb_probe_libcudas_refused_total", nil, 7, dto.MetricType_COUNTER},
		{"gpuarb_probe_objects_dropped_total", nil, 6, dto.MetricType_COUNTER},
		{"gpuarb_meter_folded_launches_total", nil, 8, dto.MetricType_COUNTER},
		{"gpuarb_probe_untracked_allocs_total", nil, 9, dto.MetricType_COUNTER},
		{"gpuarb_enforcing", nil, 1, dto.MetricType_GAUGE},
		{"gpuarb_build_info", map[string]string{"version": "v9"}, 1, dto.MetricType_GAUGE},
	} {
		if got, ok := testutil.MetricValue(fams, c.name, c.labels); !ok || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
		if k := fams[c.name].GetType(); k != c.kind {
			t.Errorf("%s is a %v, want %v", c.name, k, c.kind)
		}
	}
	if _, ok := testutil.MetricValue(fams, "gpuarb_gpu_memory_bytes", map[string]string{"gpu": "1"}); ok {
		t.Error("a memory size for a GPU whose size was not read")
	}
	if n := len(fams["gpuarb_managed_memory_bytes"].GetMetric()); n != 1 {
		t.Errorf("%d managed memory series, want 1: a tenant's, not one per GPU row", n)
	}
	if _, ok := testutil.MetricValue(fams, "gpuarb_tenant_driver_memory_bytes", map[string]string{"tenant": "infer", "gpu": "1"}); ok {
		t.Error("a driver memory figure for a tenant whose driver was not asked")
	}
	if fams["go_goroutines"] == nil || fams["process_resident_memory_bytes"] == nil {
		t.Error("the daemon's own process metrics are missing")
	}
	// Labels stay low-cardinality: tenant and gpu only.
	for name, f := range fams {
		if !strings.HasPrefix(name, "gpuarb_tenant_") {
			continue
		}
		for _, m := range f.Metric {
			if len(m.Label) != 2 {
				t.Errorf("%s has labels %v", name, m.Label)
			}
		}
	}
}

func TestListenAddr(t *testing.T) {
	for _, c := range []struct{ in, want, err string }{
		{"9400", "127.0.0.1:9400", ""},
		{":9400", "127.0.0.1:9400", ""},
		{"0.0.0.0:9400", "0.0.0.0:9400", ""},
		{"[::1]:9400", "[::1]:9400", ""},
		{"localhost", "", "missing port"},
	} {
		got, err := ListenAddr(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: err %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

// A tenant whose name is not UTF-8 (a cgroup named with any bytes) is
// scraped with its bytes escaped, and the tenants after it still are.
func TestNamesThatAreNotUTF8AreEscaped(t *testing.T) {
	st := api.Status{Version: "v9", Tenants: []api.Tenant{
		{Name: "/a/bad\xff\xfename", LaunchesTotal: 1},
		{Name: `/system.slice/systemd\x2dx.service`, LaunchesTotal: 2},
		{Name: "/a/after", LaunchesTotal: 3},
	}}
	srv := httptest.NewServer(Handler(func() api.Status { return st }))
	defer srv.Close()
	fams := testutil.ScrapeMetrics(t, srv.URL+Path)
	for name, want := range map[string]float64{`/a/bad\xff\xfename`: 1, `/system.slice/systemd\x2dx.service`: 2, "/a/after": 3} {
		if got, ok := testutil.MetricValue(fams, "gpuarb_tenant_launches_total", map[string]string{"tenant": name, "gpu": "0"}); !ok || got != want {
			t.Errorf("launches of %q: %v %v, want %v", name, got, ok, want)
		}
	}
	if got := len(fams["gpuarb_tenant_launches_total"].GetMetric()); got != 3 {
		t.Errorf("%d tenants scraped, want 3", got)
	}
}
