package e2e

import (
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
	// Registered at start with the pod's policy, under the container's
	// cgroup (cgroupfs: the pod's parent, then the container's id).
	weighted, plain := waitTenant(t, d, "weighted", true), waitTenant(t, d, plainID, true)
	if weighted.Weight != 300 || weighted.Cgroup != parent.Rel+"/"+weightedID || plain.Weight != 100 || plain.Cgroup != parent.Rel+"/"+plainID {
		t.Errorf("registered as %+v and %+v", *weighted, *plain)
	}

	// 100:300 of the GPU, from the simulator's truth.
	cgs := map[string]*testutil.Cgroup{"weighted": {Rel: weighted.Cgroup}, "plain": {Rel: plain.Cgroup}}
	ws := trueShares(t, gpu, cgs, 3*time.Second, 6)
	w, p := col(ws, func(m map[string]float64) float64 { return m["weighted"] }), col(ws, func(m map[string]float64) float64 { return m["plain"] })
	t.Logf("true shares: weighted (300) %s, plain (100) %s (unarbitrated 50/50)", pcts(w), pcts(p))
	logStatus(t, d)
	if median(w) < 0.72 || median(w) > 0.78 || median(p) < 0.22 || median(p) > 0.28 {
		t.Errorf("weights 300:100 through NRI gave %.1f%% and %.1f%%, want 75/25 ± 3 pp", 100*median(w), 100*median(p))
	}

	// A container that ends by itself is detached (StopContainer).
	_, shortID, err := ctrd.RunPod(t, testutil.Pod{Name: "short", CgroupParent: parent.Rel, Args: []string{"/bin/sleep", "2"}})
	if err != nil {
		t.Fatal(err)
	}
	waitTenant(t, d, shortID, true)
	waitTenant(t, d, shortID, false)

	// A bad annotation refuses the container, with the reason where the
	// operator sees it (the runtime's answer: kubectl describe, crictl).
	_, _, err = ctrd.RunPod(t, testutil.Pod{Name: "bad", CgroupParent: parent.Rel, Args: []string{"/bin/sleep", "30"},
		Annotations: map[string]string{ocihook.AnnotationWeight: "banana"}})
	if err == nil || !strings.Contains(err.Error(), "annotation gpuarb.io/weight=") || !strings.Contains(err.Error(), "banana") {
		t.Errorf("a pod annotated gpuarb.io/weight=banana: %v, want its creation refused naming the annotation", err)
	}

	// The daemon down: a pod started meanwhile is registered, and one
	// stopped meanwhile detached, once it is back.
	d.Proc.Stop()
	_, lateID, err := ctrd.RunPod(t, testutil.Pod{Name: "latecomer", CgroupParent: parent.Rel, Args: []string{"/bin/sleep", "60"},
		Annotations: map[string]string{ocihook.AnnotationWeight: "500"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctrd.Crictl("stop", plainID); err != nil {
		t.Fatal(err)
	}
	d = startDaemonIn(t, gpu, dir, args...)
	began := time.Now() // it answers from here
	late := waitTenant(t, d, lateID, true)
	t.Logf("a pod started while the daemon was down registered %v after the new daemon answered", time.Since(began).Round(time.Millisecond))
	if late.Weight != 500 {
		t.Errorf("latecomer registered as %+v, want weight 500", *late)
	}
	waitTenant(t, d, plainID, false)
	if st := waitNRI(t, d); st.Registered == 0 {
		t.Errorf("NRI status %+v: want the registrations counted", st)
	}
}

// waitNRI waits up to 10 s for the daemon's NRI plugin to be connected
// and returns its status.
func waitNRI(t *testing.T, d runningDaemon) api.NRIStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if st.NRI != nil && st.NRI.Connected {
			return *st.NRI
		}
		if time.Now().After(deadline) {
			t.Fatalf("NRI plugin not connected within 10 s: %+v", st.NRI)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitTenant waits up to 10 s for the daemon's policy to have (or, with
// present false, no longer have) a tenant of that name.
func waitTenant(t *testing.T, d runningDaemon, name string, present bool) *api.Tenant {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		tn := tenantByName(st, name)
		if (tn != nil) == present {
			return tn
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenant %s: present=%v after 10 s, want %v; tenants %+v", name, tn != nil, present, st.Tenants)
		}
		time.Sleep(100 * time.Millisecond)
	}
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
	cgs := map[string]*testutil.Cgroup{"duo": {Rel: duoT.Cgroup}, "solo": {Rel: soloT.Cgroup}}
	ws := trueShares(t, gpu, cgs, 3*time.Second, 6)
	a, b := col(ws, func(m map[string]float64) float64 { return m["duo"] }), col(ws, func(m map[string]float64) float64 { return m["solo"] })
	t.Logf("true shares: duo (2 processes, 300) %s, solo (1 process, 100) %s (unarbitrated 67/33)", pcts(a), pcts(b))
	logStatus(t, d)
	if median(a) < 0.72 || median(a) > 0.78 || median(b) < 0.22 || median(b) > 0.28 {
		t.Errorf("pods at 300:100 got %.1f%% and %.1f%%, want 75/25 ± 3 pp", 100*median(a), 100*median(b))
	}
	if _, err := ctrd.Crictl("stopp", soloID); err != nil {
		t.Fatal(err)
	}
	waitTenant(t, d, "solo", false)
}
