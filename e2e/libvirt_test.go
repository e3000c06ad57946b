package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/internal/testutil"
	libvirthook "github.com/gpuarb/gpuarb/libvirt-hook"
)

// A real QEMU (TCG) started as libvirt would, in a VM cgroup with
// libvirt's inner layout (SCOPE/libvirt/emulator), is registered by the
// installed libvirt hook fed a recorded domain XML, throttled to the
// limit of its <gpuarb:policy> against another tenant, and unregistered
// (and left running, thawed) when the hook reports it stopped.
//
// The VM's GPU work is done on the host in its cgroup, as a virtio-gpu
// renderer does: a gpuwork hog started beside QEMU.
func TestLibvirtHookVM(t *testing.T) {
	measureTwice(t, libvirtHookVM)
}

func libvirtHookVM(t *testing.T, miss missFunc) {
	qemu := testutil.Require(t, "qemu-system-x86_64", "apt-get install qemu-system-x86")
	xmlDoc, err := os.ReadFile("testdata/libvirt-domain.xml")
	if err != nil {
		t.Fatal(err)
	}
	dom, err := libvirthook.ReadDomain(bytes.NewReader(xmlDoc))
	if err != nil {
		t.Fatal(err)
	}
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)

	// The hook as 'gpuarb hooks install --runtime libvirt' writes it.
	hooksDir := filepath.Join(t.TempDir(), "qemu.d")
	out, err := exec.Command(testutil.Bin(t, "gpuarb"), "hooks", "install", "--runtime", "libvirt", "--dir", hooksDir,
		"--socket", d.Socket, "--binary", testutil.Bin(t, "gpuarb")).CombinedOutput()
	if err != nil {
		t.Fatalf("hooks install: %v %s", err, out)
	}
	hook := filepath.Join(hooksDir, "gpuarb")
	callHook := func(op, sub string) string {
		t.Helper()
		cmd := exec.Command(hook, dom.Name, op, sub, "-")
		cmd.Stdin = bytes.NewReader(xmlDoc)
		start := time.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("hook %s: %v %s", op, err, out)
		}
		t.Logf("hook %s took %v", op, time.Since(start).Round(time.Millisecond))
		return string(out)
	}

	vm := testutil.NewCgroup(t, "machine-qemu")
	emulator := testutil.Sub(t, vm, "libvirt/emulator")
	other := testutil.NewCgroup(t, "other")
	q := testutil.Start(t, emulator, exec.Command(qemu, "-name", "guest="+dom.Name+",debug-threads=on", "-uuid", dom.UUID,
		"-machine", "pc,accel=tcg", "-m", "64", "-nodefaults", "-no-user-config", "-display", "none",
		"-serial", "none", "-monitor", "none", "-no-reboot"))
	time.Sleep(300 * time.Millisecond)
	if q.Done() {
		t.Fatalf("qemu exited: %s", q.Stderr)
	}
	renderer := testutil.Start(t, emulator, gpu.Workload(t, "hog", "--duration", "14")).Cmd.Process.Pid
	testutil.Start(t, other, gpu.Workload(t, "hog", "--duration", "14"))

	// prepare and start come before QEMU exists: nothing to do.
	callHook("prepare", "begin")
	if msg := callHook("started", "begin"); msg != "" {
		t.Errorf("started printed %q", msg)
	}
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	pol, err := d.Policy(t.Context())
	if err != nil || !strings.Contains(string(pol), "name: vm-"+dom.Name) || !strings.Contains(string(pol), "cgroup: "+vm.Rel+"\n") ||
		!strings.Contains(string(pol), "limit: 0.25") {
		t.Fatalf("the VM is not in the policy with its scope and limit: %v\n%s", err, pol)
	}

	// QEMU (its vCPU threads) never stops, nor does the renderer: the
	// GPU's own scheduler pauses the renderer's channel group instead.
	stopped, qemuStopped := false, false
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		stopped = stopped || cgroup.Stopped(renderer)
		qemuStopped = qemuStopped || cgroup.Stopped(q.Cmd.Process.Pid)
	}
	if stopped || qemuStopped {
		t.Errorf("renderer stopped at times: %v; QEMU stopped at times: %v (want neither)", stopped, qemuStopped)
	}
	cgs := map[string]*testutil.Cgroup{"vm": vm, "other": other}
	ws := trueShares(t, gpu, cgs, 1*time.Second, 5)
	a, b := col(ws, func(w map[string]float64) float64 { return w["vm"] }), col(ws, func(w map[string]float64) float64 { return w["other"] })
	t.Logf("true shares: vm %s, other %s (unarbitrated 50/50, limit 25%%)", pcts(a), pcts(b))
	logStatus(t, d)
	requireThrottled(t, d, vm.Rel)
	if median(a) > 0.26 || median(b) < 0.70 {
		miss("the VM got %.1f%% (limit 25%%), the other tenant %.1f%%", 100*median(a), 100*median(b))
	}
	if tn := tenantByName(st, "vm-"+dom.Name); tn != nil && tn.Priority != "batch" {
		t.Errorf("status: %+v", *tn)
	}

	// stopped: unregistered; the VM (still running here) is thawed.
	callHook("stopped", "end")
	callHook("release", "end")
	pol, _ = d.Policy(t.Context())
	if strings.Contains(string(pol), dom.Name) {
		t.Errorf("still in the policy after stopped:\n%s", pol)
	}
	time.Sleep(300 * time.Millisecond)
	ev, _ := os.ReadFile(filepath.Join(vm.Path, "cgroup.events"))
	if !bytes.Contains(ev, []byte("frozen 0")) || q.Done() {
		t.Errorf("after stopped: %s, qemu done %v", ev, q.Done())
	}
	// Unregistered, the VM's cgroup is a tenant like any other with GPU
	// work (default rules), so its renderer may still be held at times;
	// it must not be left held, and QEMU is never stopped.
	rendererRan, qemuStopped := false, false
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		rendererRan = rendererRan || !cgroup.Stopped(renderer)
		qemuStopped = qemuStopped || cgroup.Stopped(q.Cmd.Process.Pid)
	}
	if !rendererRan || qemuStopped {
		t.Errorf("after stopped: the renderer ran %v (want true), QEMU stopped at times %v (want false)", rendererRan, qemuStopped)
	}
}
