package e2e

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/lab"
	ocihook "github.com/gpuarb/gpuarb/oci-hook"
)

// hooksFor returns the hooks 'gpuarb hooks install --runtime runc' adds,
// for the daemon at socket.
func hooksFor(t *testing.T, socket string, failClosed bool) *specs.Hooks {
	t.Helper()
	h := ocihook.HookCommand{Binary: testutil.Bin(t, "gpuarb"), Socket: socket, FailClosed: failClosed}
	return &specs.Hooks{Prestart: []specs.Hook{h.Hook(ocihook.RegisterStage)}, Poststop: []specs.Hook{h.Hook(ocihook.Poststop)}}
}

func tenantByName(st api.Status, name string) *api.Tenant {
	for i := range st.Tenants {
		if st.Tenants[i].Name == name {
			return &st.Tenants[i]
		}
	}
	return nil
}

// A runc container whose config.json names the hook is registered with the
// policy of its annotations, throttled against a second container, and
// unregistered when it exits.
func TestContainerAttachedByHook(t *testing.T) {
	measureTwice(t, containerAttachedByHook)
}

func containerAttachedByHook(t *testing.T, miss missFunc) {
	r := testutil.NewRunc(t)
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	parent := testutil.NewCgroup(t, "runc")
	work := []string{"/gpuarb-bin/gpuwork", "hog", "--duration", "12"}
	capped := r.Bundle(t, lab.ContainerSpec{
		ID: "gpuarb-e2e-capped", Args: work, GPU: gpu.FakeGPU, CgroupsPath: parent.Rel + "/capped",
		Annotations: map[string]string{ocihook.AnnotationLimit: "25%", ocihook.AnnotationName: "capped"},
		Hooks:       hooksFor(t, d.Socket, false),
	})
	other := r.Bundle(t, lab.ContainerSpec{
		ID: "gpuarb-e2e-other", Args: work, GPU: gpu.FakeGPU, CgroupsPath: parent.Rel + "/other",
		Hooks: hooksFor(t, d.Socket, false),
	})
	pc := r.Run(t, "gpuarb-e2e-capped", capped)
	po := r.Run(t, "gpuarb-e2e-other", other)

	// Registered with the annotations' policy, under the container's cgroup.
	var cappedTenant, otherTenant *api.Tenant
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && (cappedTenant == nil || otherTenant == nil) {
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		cappedTenant, otherTenant = tenantByName(st, "capped"), tenantByName(st, "gpuarb-e2e-other")
		time.Sleep(100 * time.Millisecond)
	}
	if cappedTenant == nil || otherTenant == nil {
		t.Fatalf("containers not registered: runc stderr %s / %s", pc.Stderr, po.Stderr)
	}
	if cappedTenant.Cgroup != parent.Rel+"/capped" || cappedTenant.Limit != 0.25 || otherTenant.Weight != 100 {
		t.Errorf("registered as %+v and %+v", *cappedTenant, *otherTenant)
	}
	pol, err := d.Policy(t.Context())
	if err != nil || !strings.Contains(string(pol), "name: capped") || !strings.Contains(string(pol), "limit: 0.25") {
		t.Errorf("policy after the hooks: %v\n%s", err, pol)
	}

	// Throttled against the other container (truth from the simulator).
	cgs := map[string]*testutil.Cgroup{"a": {Rel: parent.Rel + "/capped"}, "b": {Rel: parent.Rel + "/other"}}
	ws := trueShares(t, gpu, cgs, 3*time.Second, 4)
	a, b := col(ws, func(w map[string]float64) float64 { return w["a"] }), col(ws, func(w map[string]float64) float64 { return w["b"] })
	t.Logf("true shares: capped %s, other %s (unarbitrated 50/50)", pcts(a), pcts(b))
	logStatus(t, d)
	requireThrottled(t, d, parent.Rel+"/capped")
	if median(a) > 0.26 || median(b) < 0.70 {
		miss("the capped container got %.1f%% (limit 25%%), the other %.1f%%", 100*median(a), 100*median(b))
	}

	// Unregistered at exit: poststop removed both from the policy.
	for _, p := range []*testutil.Proc{pc, po} {
		if err := p.Wait(t, 20*time.Second); err != nil {
			t.Errorf("container: %v %s", err, p.Stderr)
		}
	}
	pol, err = d.Policy(t.Context())
	if err != nil || strings.Contains(string(pol), "capped") || strings.Contains(string(pol), "gpuarb-e2e-other") {
		t.Errorf("still in the policy after exit: %v\n%s", err, pol)
	}
}

// The systemd cgroup form: a process in the scope systemd would make for
// "slice:prefix:name" is registered under that scope.
func TestHookSystemdCgroupForm(t *testing.T) {
	d := startDaemon(t, testutil.StartFakeGPU(t))
	root, err := cgroup.UnifiedMount()
	if err != nil {
		t.Fatal(err)
	}
	// A slice of the tests' own, created and removed here.
	scope := filepath.Join(root, "gpuarbtest.slice", "gpuarb-ctr9.scope")
	if err := os.MkdirAll(scope, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, dir := range []string{scope, filepath.Dir(scope)} {
			for i := 0; i < 250; i++ {
				if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	})
	cg := &testutil.Cgroup{Path: scope, Rel: "/gpuarbtest.slice/gpuarb-ctr9.scope"}
	p := testutil.Start(t, cg, exec.Command("sleep", "30"))
	bundle := t.TempDir()
	cfg := `{"ociVersion":"1.0.2","annotations":{"gpuarb.io/weight":"700"},"linux":{"cgroupsPath":"gpuarbtest.slice:gpuarb:ctr9"}}`
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	state := `{"ociVersion":"1.0.2","id":"ctr9","status":"created","pid":` + strconv.Itoa(p.Cmd.Process.Pid) + `,"bundle":"` + bundle + `"}`
	out, err := runHook(t, d.Socket, "createRuntime", state)
	if err != nil || len(out) != 0 {
		t.Fatalf("hook: %v %s", err, out)
	}
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := d.Policy(t.Context())
	if !strings.Contains(string(pol), "cgroup: /gpuarbtest.slice/gpuarb-ctr9.scope") || !strings.Contains(string(pol), "weight: 700") {
		t.Errorf("policy: %s (status %+v)", pol, st.Tenants)
	}
	if out, err := runHook(t, d.Socket, "poststop", state); err != nil || len(out) != 0 {
		t.Errorf("poststop: %v %s", err, out)
	}
	if pol, _ := d.Policy(t.Context()); strings.Contains(string(pol), "ctr9") {
		t.Errorf("still registered after poststop: %s", pol)
	}
}

func runHook(t *testing.T, socket, stage, state string, extra ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(testutil.Bin(t, "gpuarb"), append(append([]string{"oci-hook", "--socket", socket}, extra...), stage)...)
	cmd.Stdin = strings.NewReader(state)
	return cmd.CombinedOutput()
}

// With the daemon hung, a container with the hook still starts and the
// hook costs at most 1 s (fail-open); fail-closed refuses it. Malformed
// state and bad annotations are clear errors.
func TestHookDaemonDown(t *testing.T) {
	r := testutil.NewRunc(t)
	gpu := testutil.StartFakeGPU(t) // only for the bind mounts
	hung := filepath.Join(t.TempDir(), "hung.sock")
	l, err := net.Listen("unix", hung)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never answered
		}
	}()
	parent := testutil.NewCgroup(t, "runc")
	run := func(id string, hooks *specs.Hooks) (time.Duration, error, string) {
		b := r.Bundle(t, lab.ContainerSpec{ID: id, Args: []string{"true"}, GPU: gpu.FakeGPU, CgroupsPath: parent.Rel + "/" + id, Hooks: hooks})
		start := time.Now()
		p := r.Run(t, id, b)
		err := p.Wait(t, 20*time.Second)
		return time.Since(start), err, p.Stderr.String()
	}
	base, err, stderr := run("gpuarb-e2e-nohook", nil)
	if err != nil {
		t.Fatalf("plain container: %v %s", err, stderr)
	}
	open, err, stderr := run("gpuarb-e2e-open", hooksFor(t, hung, false))
	if err != nil {
		t.Fatalf("fail-open container refused: %v %s", err, stderr)
	}
	t.Logf("container run: %v without the hook, %v with the hook and a hung daemon", base, open)
	// Two hook calls (prestart, poststop), each bounded by 1 s.
	if open-base > 2*time.Second {
		t.Errorf("the hook held the container %v with a hung daemon", open-base)
	}
	_, err, stderr = run("gpuarb-e2e-closed", hooksFor(t, hung, true))
	if err == nil || !strings.Contains(stderr, "did not answer") {
		t.Errorf("fail-closed container started: %v %s", err, stderr)
	}

	// Input errors name what is wrong.
	bundle := t.TempDir()
	cfg := `{"ociVersion":"1.0.2","annotations":{"gpuarb.io/limit":"150%"},"linux":{"cgroupsPath":"/x"}}`
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ stage, state, want string }{
		{"prestart", "{not json", "malformed OCI state"},
		{"prestart", `{"id":"x","bundle":"` + bundle + `"}`, "gpuarb.io/limit"},
		{"launch", `{}`, "unknown hook stage"},
	} {
		out, err := runHook(t, hung, tc.stage, tc.state)
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s %q: %v %s, want %q", tc.stage, tc.state, err, out, tc.want)
		}
	}
}

// A container started while the daemon is down is arbitrated with its
// annotations' policy once the daemon starts: the hook spools its
// registration and the daemon makes it at start. One that ended meanwhile
// is not registered: its poststop took it out of the spool.
func TestContainerStartedWhileDaemonDownIsAttachedLater(t *testing.T) {
	measureTwice(t, containerStartedWhileDaemonDown)
}

func containerStartedWhileDaemonDown(t *testing.T, miss missFunc) {
	r := testutil.NewRunc(t)
	gpu := testutil.StartFakeGPU(t)
	dir := t.TempDir()
	socket := filepath.Join(dir, "gpuarb.sock") // where the daemon started below listens
	parent := testutil.NewCgroup(t, "runc")
	ended := r.Bundle(t, lab.ContainerSpec{
		ID: "gpuarb-e2e-ended", Args: []string{"true"}, GPU: gpu.FakeGPU, CgroupsPath: parent.Rel + "/ended",
		Annotations: map[string]string{ocihook.AnnotationName: "ended"}, Hooks: hooksFor(t, socket, false),
	})
	late := r.Bundle(t, lab.ContainerSpec{
		ID: "gpuarb-e2e-late", Args: []string{"/gpuarb-bin/gpuwork", "hog", "--duration", "14"}, GPU: gpu.FakeGPU,
		CgroupsPath: parent.Rel + "/late",
		Annotations: map[string]string{ocihook.AnnotationLimit: "25%", ocihook.AnnotationName: "late"},
		Hooks:       hooksFor(t, socket, false),
	})
	pe := r.Run(t, "gpuarb-e2e-ended", ended)
	if err := pe.Wait(t, 20*time.Second); err != nil {
		t.Fatalf("container with the daemon down: %v %s", err, pe.Stderr)
	}
	pl := r.Run(t, "gpuarb-e2e-late", late)
	var spooled []string
	for deadline := time.Now().Add(5 * time.Second); len(spooled) == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		spooled, _ = filepath.Glob(filepath.Join(api.SpoolBeside(socket), "*.json"))
	}
	if len(spooled) != 1 {
		t.Fatalf("spooled %v, want the running container's registration alone; runc stderr %s / %s", spooled, pe.Stderr, pl.Stderr)
	}

	d := startDaemonIn(t, gpu, dir)
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tn := tenantByName(st, "late")
	if tn == nil || tn.Cgroup != parent.Rel+"/late" || tn.Limit != 0.25 {
		t.Fatalf("the container started while the daemon was down is registered as %+v, want limit 25%% on its cgroup", tn)
	}
	if tenantByName(st, "ended") != nil {
		t.Error("the container that ended while the daemon was down is registered")
	}
	if left, _ := filepath.Glob(filepath.Join(api.SpoolBeside(socket), "*.json")); len(left) != 0 {
		t.Errorf("the spool keeps %v after the daemon made its registrations", left)
	}
	ws := trueShares(t, gpu, map[string]*testutil.Cgroup{"late": {Rel: parent.Rel + "/late"}}, 3*time.Second, 4)
	late25 := col(ws, func(w map[string]float64) float64 { return w["late"] })
	t.Logf("true share of the container limited to 25%%: %s (alone: 100%% unarbitrated)", pcts(late25))
	if median(late25) > 0.27 {
		miss("the container started while the daemon was down got %.1f%%, limit 25%%", 100*median(late25))
	}
	if err := pl.Wait(t, 20*time.Second); err != nil {
		t.Errorf("container: %v %s", err, pl.Stderr)
	}
	if pol, _ := d.Policy(t.Context()); strings.Contains(string(pol), "name: late") {
		t.Errorf("still registered after poststop: %s", pol)
	}
}
