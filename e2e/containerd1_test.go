package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuarb/gpuarb/internal/testutil"
)

// On containerd 1.x (Debian's 1.6: no NRI), pods reach the daemon through
// the OCI hook, set up as docs/deploy.md says: a base runtime spec from
// `ctr oci spec` that `gpuarb hooks install --runtime containerd` edits,
// base_runtime_spec and pod_annotations in the runc handler. Annotated
// pods are registered with their policy and arbitrated by it (both
// actuator modes), a pod that ends by itself is detached, and pods keep
// containerd's own file limit (the base spec's 1024 dropped).
func TestPodsRegisteredThroughTheHookOnContainerd1(t *testing.T) {
	dir := t.TempDir() // the daemons' socket: the base spec names it
	base := filepath.Join(dir, "base-spec.json")
	spec, err := exec.Command("/usr/bin/ctr", "oci", "spec").Output()
	if err != nil {
		testutil.Missing(t, "ctr oci spec (apt-get install containerd): "+err.Error())
	}
	if !strings.Contains(string(spec), "RLIMIT_NOFILE") {
		t.Fatalf("ctr oci spec has no RLIMIT_NOFILE to drop:\n%s", spec)
	}
	if err := os.WriteFile(base, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(testutil.Bin(t, "gpuarb"), "hooks", "install", "--runtime", "containerd", "--base", base,
		"--socket", filepath.Join(dir, "gpuarb.sock")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dropped process.rlimits") {
		t.Fatalf("hooks install: %v\n%s", err, out)
	}
	ctrd := testutil.StartContainerd1(t, base)
	t.Logf("%s", ctrd.Version)
	t.Run("steered", func(t *testing.T) { podsRegisteredThroughTheHook(t, ctrd, dir) })
	t.Run("launch gate", func(t *testing.T) { podsRegisteredThroughTheHook(t, ctrd, dir, "--gpu-scheduler", "off") })
}

func podsRegisteredThroughTheHook(t *testing.T, ctrd *testutil.Containerd, dir string, mode ...string) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemonIn(t, gpu, dir, mode...)
	if d.Socket != filepath.Join(dir, "gpuarb.sock") {
		t.Fatalf("the daemon serves %s, the base spec's hook calls %s", d.Socket, filepath.Join(dir, "gpuarb.sock"))
	}
	parent := testutil.NewCgroup(t, "ctrd1")
	weighted, plain := weightedAndPlainPods(t, ctrd, gpu, d, parent)
	nofile, err := ctrd.Crictl("exec", plain.Name, "/bin/sh", "-c", "ulimit -n")
	if n, _ := strconv.ParseUint(nofile, 10, 64); err != nil || n != ctrd.Nofile {
		t.Errorf("a pod's file limit: %q (%v), want containerd's own %d", nofile, err, ctrd.Nofile)
	}

	holds300to100(t, gpu, d, weighted, plain, "50/50")

	// A container that ends by itself is detached by its poststop hook.
	selfExitingPodDetached(t, ctrd, d, parent)
}
