package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/classify"
	"github.com/gpuarb/gpuarb/enforce"
	"github.com/gpuarb/gpuarb/exact"
	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/meter"
	"github.com/gpuarb/gpuarb/policy"
)

func TestLifecycle(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	pins := filepath.Join(bpf.BPFFSPath, "gpuarb-test-"+filepath.Base(dir))
	cfg := Config{
		Socket: filepath.Join(dir, "gpuarb.sock"), PinPath: pins,
		Devices: []bpf.Device{{Major: 1, Minor: 7, Kind: bpf.KindNvidiaCtl}},
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "test",
	}
	d, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(cfg); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second daemon: %v, want ErrAlreadyRunning", err)
	}
	for _, m := range bpf.PinnedMaps() {
		if _, err := os.Stat(filepath.Join(pins, m)); err != nil {
			t.Errorf("map %s not pinned: %v", m, err)
		}
	}
	if fi, err := os.Stat(cfg.Socket); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket: %v %v, want mode 0660", fi, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	st, err := api.NewClient(cfg.Socket).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != "test" || st.Tenants == nil || st.Probes.PinPath != pins || len(st.Probes.Devices) != 1 || st.WindowNS != uint64(time.Second) {
		t.Errorf("status %+v", st)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("daemon did not stop")
	}
	for _, p := range []string{pins, cfg.Socket, filepath.Join(dir, "gpuarb.lock")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", p, err)
		}
	}
	if _, err := api.NewClient(cfg.Socket).Status(context.Background()); !errors.Is(err, api.ErrNoDaemon) {
		t.Errorf("status after stop: %v, want ErrNoDaemon", err)
	}
	// The lock is free again: a new daemon starts.
	d2, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d2.Stop(); err != nil {
		t.Fatal(err)
	}
}

// fakeSource reports the test process as having used 0.4 s of GPU time per
// sample: an exact source as DRM fdinfo or NVML would.
type fakeSource struct{ busy uint64 }

func (f *fakeSource) Name() string { return "fake" }

func (f *fakeSource) Sample() (exact.Sample, error) {
	f.busy += 400_000_000
	return exact.Sample{uint32(os.Getpid()): f.busy}, nil
}

func TestExactShareBesideTheEstimate(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	d, err := Start(Config{
		Socket: filepath.Join(dir, "gpuarb.sock"), PinPath: filepath.Join(bpf.BPFFSPath, "gpuarb-test-"+filepath.Base(dir)),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Exact: &fakeSource{},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	self, err := cgroup.ProcessPath(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	root, err := cgroup.UnifiedMount()
	if err != nil {
		t.Fatal(err)
	}
	id, err := cgroup.ID(filepath.Join(root, self))
	if err != nil {
		t.Fatal(err)
	}
	now := meter.MonotonicNow()
	d.meter.Observe(&ioctlspy.Launch{Header: ioctlspy.Header{PID: uint32(os.Getpid()), CgroupID: id, Start: now, End: now},
		Grid: [3]uint32{1, 1, 1}})
	d.sampleExact()
	d.exactAt = d.exactAt.Add(-time.Second) // the two samples one second apart
	d.sampleExact()
	d.control(context.Background()) // status shows the last control step's figures
	st := d.Status()
	if st.ExactSource != "fake" {
		t.Errorf("exact source %q", st.ExactSource)
	}
	var found bool
	for _, ten := range st.Tenants {
		if ten.Cgroup == self {
			found = true
			if ten.ExactShare == nil || *ten.ExactShare < 0.39 || *ten.ExactShare > 0.41 {
				t.Errorf("exact share %v, want 0.4", ten.ExactShare)
			}
		}
	}
	if !found {
		t.Errorf("no tenant for %s in %+v", self, st.Tenants)
	}
}

// Attaches that arrive together all count: each derives its policy from
// the one in force after the others (they read the same one and the last
// to install it dropped the rest).
func TestConcurrentAttachesAllCount(t *testing.T) {
	testutil.Privileged(t)
	client := runDaemon(t, "")
	parent := testutil.NewCgroup(t, "attach")
	const n = 16
	errs := make(chan error, n)
	for i := range n {
		cg := testutil.Sub(t, parent, fmt.Sprintf("t%d", i))
		go func() {
			_, err := client.Attach(t.Context(), "", fmt.Appendf(nil, `{"name": "t%d", "cgroup": %q, "weight": %d}`, i, cg.Rel, 100+i))
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	pol, err := client.Policy(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for i := range n {
		if !strings.Contains(string(pol), fmt.Sprintf("name: t%d\n", i)) {
			missing = append(missing, fmt.Sprintf("t%d", i))
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d concurrent attaches, %v missing from the policy:\n%s", n, missing, pol)
	}
}

// runDaemon starts a daemon with the policy file policyYAML ("": none) and
// runs it until the test ends; it returns a client of its socket.
func runDaemon(t *testing.T, policyYAML string) *api.Client {
	t.Helper()
	return api.NewClient(runDaemonAt(t, policyYAML))
}

// runDaemonAt is runDaemon, returning the daemon's socket. The daemon's
// stop must not fail.
func runDaemonAt(t *testing.T, policyYAML string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := Config{
		Socket: filepath.Join(dir, "gpuarb.sock"), PinPath: filepath.Join(bpf.BPFFSPath, "gpuarb-test-"+filepath.Base(dir)),
		PolicyPath: filepath.Join(dir, "policy.yaml"),
		Devices:    []bpf.Device{{Major: 1, Minor: 7, Kind: bpf.KindNvidiaCtl}},
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "test",
	}
	if policyYAML != "" {
		if err := os.WriteFile(cfg.PolicyPath, []byte(policyYAML), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return cfg.Socket
}

// A client's connection that has sent nothing (an HTTP client dials one
// more than it uses when requests come at once) does not fail the
// daemon's stop: net/http waits 5 s for such a connection, longer than
// the grace the daemon gives its requests.
func TestStopWithAnOpenConnection(t *testing.T) {
	testutil.Privileged(t)
	var conn net.Conn
	t.Cleanup(func() { // after the daemon's stop, which runDaemonAt's cleanup checks
		if conn != nil {
			conn.Close()
		}
	})
	socket := runDaemonAt(t, "")
	var err error
	if conn, err = net.Dial("unix", socket); err != nil {
		t.Fatal(err)
	}
	if _, err := api.NewClient(socket).Status(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A workload (a container's hook, a VM's) registers itself with rules it
// brought: the policy's admission rules bound them, it cannot take or
// remove a name that is not its own, and the operator's file entries stay
// the operator's.
func TestWorkloadsAttachOnlyWhatIsTheirs(t *testing.T) {
	testutil.Privileged(t)
	parent := testutil.NewCgroup(t, "owners")
	ops, a, b := testutil.Sub(t, parent, "ops"), testutil.Sub(t, parent, "a"), testutil.Sub(t, parent, "b")
	client := runDaemon(t, fmt.Sprintf(`
tenants: [{name: ops, cgroup: %s, weight: 500}]
admission: [{cgroup_prefix: %s, max_weight: 1000}]
`, ops.Rel, parent.Rel))
	ctx := t.Context()
	attach := func(owner, name string, cg *testutil.Cgroup, rules string) (api.AttachResult, error) {
		return client.Attach(ctx, owner, fmt.Appendf(nil, `{"name": %q, "cgroup": %q%s}`, name, cg.Rel, rules))
	}
	// policyHas checks the named tenants' rules in the policy in force
	// (nil: the name is absent).
	policyHas := func(want map[string]*policy.Rules) {
		t.Helper()
		out, err := client.Policy(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pol, err := policy.Parse(out)
		if err != nil {
			t.Fatal(err)
		}
		for name, w := range want {
			got, ok := pol.Tenant(name)
			switch {
			case w == nil && ok:
				t.Errorf("policy has %s: %+v", name, got)
			case w != nil && (!ok || got.Rules != *w):
				t.Errorf("policy's %s: %+v (present %v), want %+v", name, got.Rules, ok, *w)
			}
		}
	}

	// Bounded: weight 10000 and latency against a cap of 1000 without latency.
	res, err := attach("container a", "wa", a, `, "weight": 10000, "priority": "latency", "slo": {"p99_sync_ms": 1}`)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Adjusted) != 2 || !strings.Contains(res.Adjusted[0], "10000 lowered to 1000") {
		t.Errorf("adjusted %q, want the weight lowered and latency refused", res.Adjusted)
	}
	policyHas(map[string]*policy.Rules{"wa": {Weight: 1000, Priority: policy.Normal}})
	// The operator is not bounded.
	if res, err := attach("", "wb", b, `, "weight": 10000, "priority": "latency"`); err != nil || len(res.Adjusted) != 0 {
		t.Errorf("operator's attach: %v, adjusted %q", err, res.Adjusted)
	}
	policyHas(map[string]*policy.Rules{"wb": {Weight: 10000, Priority: policy.Latency}})

	// Names that are not the workload's own.
	for _, tc := range []struct{ owner, name, want string }{
		{"container b", "ops", "policy file"},
		{"container b", "wa", "attached by container a"},
		{"container b", "wb", "attached by the operator"},
	} {
		if _, err := attach(tc.owner, tc.name, b, ""); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s attaching %s: %v, want ErrConflict saying %q", tc.owner, tc.name, err, tc.want)
		}
	}
	for _, tc := range []struct{ owner, name string }{{"container b", "wa"}, {"container b", "ops"}, {"container a", "wb"}} {
		if err := client.Detach(ctx, tc.owner, tc.name); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("%s detaching %s: %v, want ErrNotFound", tc.owner, tc.name, err)
		}
	}
	policyHas(map[string]*policy.Rules{"ops": {Weight: 500, Priority: policy.Normal}, "wa": {Weight: 1000, Priority: policy.Normal},
		"wb": {Weight: 10000, Priority: policy.Latency}})
	// The operator detaches attachments only; file entries are the file's.
	if err := client.Detach(ctx, "", "ops"); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "remove it there") {
		t.Errorf("operator detaching the file's ops: %v, want ErrConflict", err)
	}
	// A workload re-registering itself (a restarted container) may.
	if _, err := attach("container a", "wa", a, `, "weight": 700`); err != nil {
		t.Errorf("container a again: %v", err)
	}
	if err := client.Detach(ctx, "container a", "wa"); err != nil {
		t.Errorf("container a detaching wa: %v", err)
	}
	policyHas(map[string]*policy.Rules{"wa": nil, "ops": {Weight: 500, Priority: policy.Normal}})
}

// A pid tenant is its process, not its pid: once the process is gone and
// the pid names another (pid reuse), that other process is neither
// classified into the tenant nor gated as it (issue 18 item 9).
func TestPIDTenantIsPinnedToItsProcess(t *testing.T) {
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	pid := child.Process.Pid
	start := classify.PIDStart(pid)
	if start == 0 {
		t.Fatal("no start time for the child")
	}
	cfg, err := policy.Default().With(policy.Tenant{Name: "p", Selector: policy.Selector{PID: pid}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pinned uint64
		want   bool
		why    string
	}{
		{start, true, "the process attached"},
		{start + 1, false, "another process under the same pid"},
		{0, false, "no process when attached"},
	} {
		name, _, _, _ := classify.New(cfg, "", nil, map[int]uint64{pid: tc.pinned}, cgroup.Descendants).Classify(uint32(pid), 0)
		if (name == "p") != tc.want {
			t.Errorf("%s: classified into %q", tc.why, name)
		}
		d := &Daemon{pidStarts: map[int]uint64{pid: tc.pinned}}
		if _, err := d.gateFor(d.stepOf(&tenant{name: "p", pid: pid, act: enforce.NewTenant("p", nil)}, time.Second)); (err == nil) != tc.want {
			t.Errorf("%s: gate err %v", tc.why, err)
		}
	}
}

// Issue 18, item 12: a metered pid whose process now started at another
// time than at the last pass (its exit event lost, the pid reused) is
// ended in the meter, as one gone from /proc is; a process that is the
// same is left alone.
func TestReconcileEndsAReusedPID(t *testing.T) {
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	pid := uint32(child.Process.Pid)
	clk := uint64(10 * time.Second)
	d := &Daemon{log: slog.New(slog.DiscardHandler), meter: meter.New(meter.Config{Now: func() uint64 { return clk }})}
	d.meter.Observe(&ioctlspy.Launch{Header: ioctlspy.Header{PID: pid, CgroupID: 100, Start: clk, End: clk}, Grid: [3]uint32{1, 1, 1}})
	d.reconcileExits()
	if n := d.exitsReconciled.Load(); n != 0 || d.meteredStarts[pid] != classify.PIDStart(int(pid)) {
		t.Fatalf("first pass: %d ended, start %d recorded; want none ended, the start recorded", n, d.meteredStarts[pid])
	}
	d.reconcileExits()
	if n := d.exitsReconciled.Load(); n != 0 {
		t.Fatalf("the same process ended (%d)", n)
	}
	d.meteredStarts[pid]++ // as if the pid had been another process's at the last pass
	d.reconcileExits()
	if n := d.exitsReconciled.Load(); n != 1 {
		t.Errorf("a reused pid: %d ended, want 1", n)
	}
	_, ctxs := d.meter.Contexts(time.Second)
	if len(ctxs) != 1 || !ctxs[0].Exited {
		t.Errorf("contexts %+v, want the old process's ended", ctxs)
	}
}
