package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/lab"
	ocihook "github.com/gpuarb/gpuarb/oci-hook"
)

// Pods run by a real containerd 2.x, on its defaults (NRI on, no
// pod_annotations, no base spec, no hook), reach the daemon through its
// NRI plugin: registered with their annotations' policy and arbitrated
// by it, detached when they end by themselves, refused for a bad
// annotation with the reason, and registered once the daemon is back
// when they started while it was down; in both actuator modes.
func TestPodsRegisteredThroughNRI(t *testing.T) {
	ctrd := testutil.StartContainerd(t)
	t.Logf("%s, NRI socket %s", ctrd.Version, ctrd.NRISocket)
	t.Run("steered", func(t *testing.T) { podsRegisteredThroughNRI(t, ctrd) })
	t.Run("launch gate", func(t *testing.T) { podsRegisteredThroughNRI(t, ctrd, "--gpu-scheduler", "off") })
}

func podsRegisteredThroughNRI(t *testing.T, ctrd *testutil.Containerd, mode ...string) {
	gpu := testutil.StartFakeGPU(t)
	dir := t.TempDir()
	args := append([]string{"--nri-socket", ctrd.NRISocket}, mode...)
	d := startDaemonIn(t, gpu, dir, args...)
	parent := testutil.NewCgroup(t, "nri")
	st := waitNRI(t, d)
	if !strings.HasPrefix(st.Runtime, "containerd") {
		t.Errorf("NRI status %+v: want containerd connected", st)
	}

	weighted, plain := weightedAndPlainPods(t, ctrd, gpu, d, parent)
	holds300to100(t, gpu, d, weighted, plain, "50/50")

	// A container that ends by itself is detached (StopContainer).
	selfExitingPodDetached(t, ctrd, d, parent)

	// A bad annotation refuses the container, with the reason where the
	// operator sees it (the runtime's answer: kubectl describe, crictl).
	_, _, err := ctrd.RunPod(t, testutil.Pod{Name: "bad", CgroupParent: parent.Rel, Args: []string{"/bin/sleep", "30"},
		Annotations: map[string]string{ocihook.AnnotationWeight: "banana"}})
	if err == nil || !strings.Contains(err.Error(), "annotation gpuarb.io/weight=") || !strings.Contains(err.Error(), "banana") {
		t.Errorf("a pod annotated gpuarb.io/weight=banana: %v, want its creation refused naming the annotation", err)
	}

	// The runtime restarted (an upgrade): the plugin connects again by
	// itself, a running pod stays registered, and one started after is
	// registered.
	_, steadyID, err := ctrd.RunPod(t, testutil.Pod{Name: "steady", CgroupParent: parent.Rel, Args: []string{"/bin/sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	waitTenant(t, d, steadyID, true)
	before := waitNRI(t, d).Since
	restarted := time.Now()
	ctrd.Restart(t)
	waitStatus(t, d, 20*time.Second, "NRI connected again after containerd's restart", func(st api.Status) bool {
		return st.NRI != nil && st.NRI.Connected && st.NRI.Since.After(before)
	})
	t.Logf("connected again %v after containerd's restart began", time.Since(restarted).Round(time.Millisecond))
	waitTenant(t, d, steadyID, true)
	_, afterID, err := ctrd.RunPod(t, testutil.Pod{Name: "after-restart", CgroupParent: parent.Rel, Args: []string{"/bin/sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	waitTenant(t, d, afterID, true)

	// The daemon down: a pod started meanwhile is registered, and one
	// stopped meanwhile detached, once it is back.
	d.Proc.Stop()
	_, lateID, err := ctrd.RunPod(t, testutil.Pod{Name: "latecomer", CgroupParent: parent.Rel, Args: []string{"/bin/sleep", "60"},
		Annotations: map[string]string{ocihook.AnnotationWeight: "500"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctrd.Crictl("stop", plain.Name); err != nil {
		t.Fatal(err)
	}
	d = startDaemonIn(t, gpu, dir, args...)
	began := time.Now() // it answers from here
	late := waitTenant(t, d, lateID, true)
	t.Logf("a pod started while the daemon was down registered %v after the new daemon answered", time.Since(began).Round(time.Millisecond))
	if late.Weight != 500 {
		t.Errorf("latecomer registered as %+v, want weight 500", *late)
	}
	waitTenant(t, d, plain.Name, false)
	if st := waitNRI(t, d); st.Registered == 0 {
		t.Errorf("NRI status %+v: want the registrations counted", st)
	}
}

// waitStatus polls the daemon's status until cond holds, failing after
// within with what was awaited.
func waitStatus(t *testing.T, d runningDaemon, within time.Duration, what string, cond func(api.Status) bool) api.Status {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; NRI %+v, tenants %+v", what, within, st.NRI, st.Tenants)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitNRI waits up to 10 s for the daemon's NRI plugin to be connected
// and returns its status.
func waitNRI(t *testing.T, d runningDaemon) api.NRIStatus {
	t.Helper()
	st := waitStatus(t, d, 10*time.Second, "NRI plugin connected", func(st api.Status) bool { return st.NRI != nil && st.NRI.Connected })
	return *st.NRI
}

// waitTenant waits up to 10 s for the daemon's policy to have (or, with
// present false, no longer have) a tenant of that name.
func waitTenant(t *testing.T, d runningDaemon, name string, present bool) *api.Tenant {
	t.Helper()
	st := waitStatus(t, d, 10*time.Second, fmt.Sprintf("tenant %s present=%v", name, present),
		func(st api.Status) bool { return (tenantByName(st, name) != nil) == present })
	return tenantByName(st, name)
}

// Per-pod tenancy (--nri-tenancy pod): a pod of two GPU containers is one
// tenant (its cgroup, its name the annotation's or NAMESPACE:POD) held to
// the pod's weight against a pod of one, in both actuator modes, and
// removed when the pod stops.
func TestPodTenancyThroughNRI(t *testing.T) {
	ctrd := testutil.StartContainerd(t)
	t.Run("steered", func(t *testing.T) { podTenancyThroughNRI(t, ctrd) })
	t.Run("launch gate", func(t *testing.T) { podTenancyThroughNRI(t, ctrd, "--gpu-scheduler", "off") })
}

func podTenancyThroughNRI(t *testing.T, ctrd *testutil.Containerd, mode ...string) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu, append([]string{"--nri-socket", ctrd.NRISocket, "--nri-tenancy", "pod"}, mode...)...)
	parent := testutil.NewCgroup(t, "nripod")
	t.Cleanup(func() {
		// The pods' own cgroups, which runc made below it (after the pods
		// are gone: cleanups run last first).
		for _, pod := range []string{"duo", "solo"} {
			if err := lab.RemoveTree(filepath.Join(parent.Path, pod)); err != nil {
				t.Error(err)
			}
		}
	})
	waitNRI(t, d)
	work := []string{"/gpuarb-bin/gpuwork", "hog", "--duration", "14"}
	duo := testutil.Pod{Name: "duo", CgroupParent: parent.Rel + "/duo", Args: work, GPU: gpu,
		Annotations: map[string]string{ocihook.AnnotationWeight: "300"}}
	duoID, _, err := ctrd.RunPod(t, duo)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctrd.AddContainer(t, duo, duoID, "second", work); err != nil {
		t.Fatal(err)
	}
	soloID, _, err := ctrd.RunPod(t, testutil.Pod{Name: "solo", CgroupParent: parent.Rel + "/solo", Args: work, GPU: gpu,
		Annotations: map[string]string{ocihook.AnnotationName: "solo"}})
	if err != nil {
		t.Fatal(err)
	}
	duoT, soloT := waitTenant(t, d, "gpuarb-e2e:duo", true), waitTenant(t, d, "solo", true)
	if duoT.Cgroup != parent.Rel+"/duo" || duoT.Weight != 300 || soloT.Cgroup != parent.Rel+"/solo" || soloT.Weight != 100 {
		t.Errorf("pods registered as %+v and %+v", *duoT, *soloT)
	}
	holds300to100(t, gpu, d, duoT, soloT, "67/33: 2 processes against 1")
	if _, err := ctrd.Crictl("stopp", soloID); err != nil {
		t.Fatal(err)
	}
	waitTenant(t, d, "solo", false)
}

// weightedAndPlainPods runs two pods of a GPU hog for 14 s, one annotated
// weight 300 and name "weighted", one not, and returns their tenants once
// registered with that policy, under their containers' cgroups (cgroupfs:
// the pod's parent, then the container's id).
func weightedAndPlainPods(t *testing.T, ctrd *testutil.Containerd, gpu *testutil.FakeGPU, d runningDaemon, parent *testutil.Cgroup) (weighted, plain *api.Tenant) {
	t.Helper()
	work := []string{"/gpuarb-bin/gpuwork", "hog", "--duration", "14"}
	_, weightedID, err := ctrd.RunPod(t, testutil.Pod{Name: "weighted", CgroupParent: parent.Rel, Args: work, GPU: gpu,
		Annotations: map[string]string{ocihook.AnnotationWeight: "300", ocihook.AnnotationName: "weighted"}})
	if err != nil {
		t.Fatal(err)
	}
	_, plainID, err := ctrd.RunPod(t, testutil.Pod{Name: "plain", CgroupParent: parent.Rel, Args: work, GPU: gpu})
	if err != nil {
		t.Fatal(err)
	}
	weighted, plain = waitTenant(t, d, "weighted", true), waitTenant(t, d, plainID, true)
	if weighted.Weight != 300 || weighted.Cgroup != parent.Rel+"/"+weightedID || plain.Weight != 100 || plain.Cgroup != parent.Rel+"/"+plainID {
		t.Errorf("registered as %+v and %+v", *weighted, *plain)
	}
	return weighted, plain
}

// holds300to100 checks from the simulator's truth that tenants heavy
// (weight 300) and light (100) get 75/25 ± 3 pp of the GPU: medians of 1 s
// windows, with what they would get unarbitrated beside them.
func holds300to100(t *testing.T, gpu *testutil.FakeGPU, d runningDaemon, heavy, light *api.Tenant, unarbitrated string) {
	t.Helper()
	cgs := map[string]*testutil.Cgroup{"heavy": {Rel: heavy.Cgroup}, "light": {Rel: light.Cgroup}}
	ws := trueShares(t, gpu, cgs, 3*time.Second, 6)
	h, l := col(ws, func(m map[string]float64) float64 { return m["heavy"] }), col(ws, func(m map[string]float64) float64 { return m["light"] })
	t.Logf("true shares: %s (300) %s, %s (100) %s (unarbitrated %s)", heavy.Name, pcts(h), light.Name, pcts(l), unarbitrated)
	logStatus(t, d)
	if median(h) < 0.72 || median(h) > 0.78 || median(l) < 0.22 || median(l) > 0.28 {
		t.Errorf("weights 300:100 gave %.1f%% and %.1f%%, want 75/25 ± 3 pp", 100*median(h), 100*median(l))
	}
}

// selfExitingPodDetached runs a pod whose container ends by itself after
// 2 s, and waits for its tenant to come and go.
func selfExitingPodDetached(t *testing.T, ctrd *testutil.Containerd, d runningDaemon, parent *testutil.Cgroup) {
	t.Helper()
	_, id, err := ctrd.RunPod(t, testutil.Pod{Name: "short", CgroupParent: parent.Rel, Args: []string{"/bin/sleep", "2"}})
	if err != nil {
		t.Fatal(err)
	}
	waitTenant(t, d, id, true)
	waitTenant(t, d, id, false)
}
