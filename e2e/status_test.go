package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpuarb/gpuarb/internal/testutil"
)

// TestStatusAndTop runs the daemon and a tenant on the simulated GPU and
// reads them through `gpuarb status --json`, `gpuarb top --once` and the
// Prometheus endpoint.
func TestStatusAndTop(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	metricsAddr := testutil.FreeTCPAddr(t)
	d := startDaemon(t, gpu, "--metrics-addr", metricsAddr)
	sock := d.Socket
	cg := testutil.NewCgroup(t, "status")
	testutil.Start(t, cg, gpu.Workload(t, "hog", "--duration", "5"))
	time.Sleep(2500 * time.Millisecond)

	out, err := exec.Command(testutil.Bin(t, "gpuarb"), "status", "--json", "--socket", sock).Output()
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	var st map[string]any
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	var found bool
	for _, x := range st["tenants"].([]any) {
		ten := x.(map[string]any)
		if ten["cgroup"] != cg.Rel {
			continue
		}
		found = true
		for _, k := range []string{"name", "cgroup", "cgroup_id", "gpu", "share", "gpu_ns", "launches_per_s", "mem_bytes", "queue_ns"} {
			if _, ok := ten[k]; !ok {
				t.Errorf("tenant lacks %q: %v", k, ten)
			}
		}
		if ten["share"].(float64) < 0.95 || ten["cgroup_id"].(float64) != float64(cg.ID) || ten["state"] != "running" ||
			ten["launches_per_s"].(float64) < 40 || ten["name"] != cg.Rel {
			t.Errorf("tenant %v", ten)
		}
	}
	if !found {
		t.Fatalf("the workload's cgroup is not a tenant: %s", out)
	}
	gpus := st["gpus"].([]any)
	if len(gpus) != 1 || gpus[0].(map[string]any)["busy_share"].(float64) < 0.95 {
		t.Errorf("gpus %v", gpus)
	}
	// The simulated GPU's scheduler is steered, at the bounds its 20 µs
	// switches give.
	if g := gpus[0].(map[string]any); g["actuator"] != "gpu scheduler" || g["base_slice_us"] != 1024.0 || g["min_slice_us"] != 100.0 {
		t.Errorf("GPU 0: %v; want the gpu scheduler, timeslices 1024 µs at least 100 µs", g)
	}

	top, err := exec.Command(testutil.Bin(t, "gpuarb"), "top", "--once", "--sort", "name", "--socket", sock).Output()
	if err != nil {
		t.Fatalf("top: %v", err)
	}
	for _, want := range []string{"gpuarb top", "GPU 0", "timeslices 1024 µs, at least 100 µs", "TENANT", cg.Rel, "running"} {
		if !strings.Contains(string(top), want) {
			t.Errorf("top --once lacks %q:\n%s", want, top)
		}
	}
	if err := exec.Command(testutil.Bin(t, "gpuarb"), "top", "--sort", "color", "--socket", sock).Run(); err == nil {
		t.Error("top --sort color accepted")
	}

	checkMetrics(t, d, "http://"+metricsAddr+"/metrics", cg.Rel)

	// SIGTERM: a clean stop that leaves no pins, socket or lock.
	d.Proc.Cmd.Process.Signal(syscall.SIGTERM)
	if err := d.Proc.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("daemon after SIGTERM: %v\n%s", err, d.Proc.Stderr)
	}
	for _, p := range []string{sock, daemonLedger(sock)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after SIGTERM", p)
		}
	}
	out, err = exec.Command(testutil.Bin(t, "gpuarb"), "status", "--socket", sock).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not running") {
		t.Errorf("status without a daemon: %v %s", err, out)
	}
}

// checkMetrics scrapes the endpoint twice, 1 s apart, while the tenant
// runs alone: its GPU seconds grow by about the second, its counters agree
// with the status document.
func checkMetrics(t *testing.T, d runningDaemon, url, tenant string) {
	t.Helper()
	labels := map[string]string{"tenant": tenant, "gpu": "0"}
	read := func(fams map[string]*dto.MetricFamily, name string) float64 {
		v, ok := testutil.MetricValue(fams, name, labels)
		if !ok {
			t.Fatalf("no %s for %s", name, tenant)
		}
		return v
	}
	first := testutil.ScrapeMetrics(t, url)
	start := time.Now()
	time.Sleep(time.Second)
	second := testutil.ScrapeMetrics(t, url)
	st, err := d.Client.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start).Seconds()
	gained := read(second, "gpuarb_tenant_gpu_seconds_total") - read(first, "gpuarb_tenant_gpu_seconds_total")
	t.Logf("gpu seconds gained %.3f in %.3f s", gained, elapsed)
	// The counter advances once per control step (100 ms): two scrapes
	// a second apart see 9 to 11 steps' worth.
	if gained < 0.85*elapsed-0.1 || gained > elapsed+0.12 {
		t.Errorf("a lone hog gained %.3f GPU s in %.3f s", gained, elapsed)
	}
	if l := read(second, "gpuarb_tenant_launches_total"); l < 100 {
		t.Errorf("launches_total %v", l)
	}
	if s := read(second, "gpuarb_tenant_share"); s < 0.9 {
		t.Errorf("share %v", s)
	}
	if ten := tenantByName(st, tenant); ten == nil || float64(ten.LaunchesTotal) < read(second, "gpuarb_tenant_launches_total") {
		t.Errorf("status %+v behind the metrics", ten)
	}
	if v, ok := testutil.MetricValue(second, "gpuarb_gpu_busy_ratio", map[string]string{"gpu": "0"}); !ok || v < 0.9 {
		t.Errorf("gpu_busy_ratio %v %v", v, ok)
	}
	if v, ok := testutil.MetricValue(second, "gpuarb_probe_events_total", nil); !ok || v <= 0 {
		t.Errorf("probe_events_total %v %v", v, ok)
	}
	if _, ok := testutil.MetricValue(second, "gpuarb_probe_lost_events_total", nil); !ok {
		t.Error("no probe_lost_events_total")
	}
}

func daemonLedger(sock string) string { return filepath.Join(filepath.Dir(sock), "gated.json") }

// Tenants registered through the API (here `gpuarb attach`, as the hooks
// do) outlive a policy reload and a daemon restart; a restarted daemon
// drops the ones whose cgroup is gone.
func TestAttachedTenantsSurviveRestart(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	dir := t.TempDir()
	d := startDaemonIn(t, gpu, dir)
	keep, gone := testutil.NewCgroup(t, "keep"), testutil.NewCgroup(t, "gone")
	attach := func(args ...string) {
		t.Helper()
		out, err := exec.Command(testutil.Bin(t, "gpuarb"), append([]string{"attach", "--socket", d.Socket}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("attach %v: %v %s", args, err, out)
		}
	}
	attach("--cgroup", keep.Rel, "--name", "keep", "--limit", "30%")
	attach("--cgroup", gone.Rel, "--name", "gone", "--weight", "700")
	hasTenants := func(d runningDaemon, want map[string]bool, when string) {
		t.Helper()
		pol, err := d.Policy(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for name, in := range want {
			if strings.Contains(string(pol), "name: "+name+"\n") != in {
				t.Errorf("%s: tenant %s in the policy: %v, want %v\n%s", when, name, !in, in, pol)
			}
		}
	}
	hasTenants(d, map[string]bool{"keep": true, "gone": true}, "attached")

	// A reload of the (empty) policy file keeps them.
	if err := d.Proc.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	hasTenants(d, map[string]bool{"keep": true, "gone": true}, "after SIGHUP")

	// Stop, remove one cgroup, start again in the same directory.
	d.Proc.Cmd.Process.Signal(syscall.SIGTERM)
	if err := d.Proc.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("daemon after SIGTERM: %v\n%s", err, d.Proc.Stderr)
	}
	if err := os.Remove(gone.Path); err != nil {
		t.Fatal(err)
	}
	d2 := startDaemonIn(t, gpu, dir)
	hasTenants(d2, map[string]bool{"keep": true, "gone": false}, "after restart")
	pol, _ := d2.Policy(t.Context())
	if !strings.Contains(string(pol), "limit: 0.3") {
		t.Errorf("keep lost its limit:\n%s", pol)
	}
	// Detached tenants stay detached across a restart.
	out, err := exec.Command(testutil.Bin(t, "gpuarb"), "detach", "--socket", d2.Socket, "keep").CombinedOutput()
	if err != nil {
		t.Fatalf("detach: %v %s", err, out)
	}
	d2.Proc.Cmd.Process.Signal(syscall.SIGTERM)
	if err := d2.Proc.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("daemon after SIGTERM: %v\n%s", err, d2.Proc.Stderr)
	}
	if !strings.Contains(d2.Proc.Stderr.String(), "its cgroup is gone") {
		t.Errorf("the dropped tenant is not logged:\n%s", d2.Proc.Stderr)
	}
	d3 := startDaemonIn(t, gpu, dir)
	hasTenants(d3, map[string]bool{"keep": false, "gone": false}, "after detach and restart")
}

// Issue 56, item 14: a tenant whose cgroup name is not UTF-8 (the kernel
// takes any bytes) is scraped with the bytes escaped, beside every other
// tenant. On 3197c47 the scrape held no tenant at all.
func TestMetricsOfACgroupNamedInAnyBytes(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	metricsAddr := testutil.FreeTCPAddr(t)
	startDaemon(t, gpu, "--metrics-addr", metricsAddr)
	parent := testutil.NewCgroup(t, "bytes")
	bad := testutil.Sub(t, parent, "bad\xff\xfename")
	after := testutil.Sub(t, parent, "after")
	for _, cg := range []*testutil.Cgroup{bad, after} {
		testutil.Start(t, cg, gpu.Workload(t, "hog", "--duration", "6"))
	}
	time.Sleep(2500 * time.Millisecond)
	fams := testutil.ScrapeMetrics(t, "http://"+metricsAddr+"/metrics")
	for _, name := range []string{parent.Rel + `/bad\xff\xfename`, after.Rel} {
		v, ok := testutil.MetricValue(fams, "gpuarb_tenant_gpu_seconds_total", map[string]string{"tenant": name, "gpu": "0"})
		t.Logf("%s: %.2f GPU seconds", name, v)
		if !ok || v < 0.5 {
			t.Errorf("tenant %q scraped: %v, %.2f GPU seconds; want about 1 s of its 2.5", name, ok, v)
		}
	}
}
