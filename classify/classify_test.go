package classify

import (
	"os"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/policy"
)

// tenant is a tenant as Reshaped is asked about it.
type tenant struct{ name, cgroup string }

// A default tenant is labelled by its container's short id, its systemd
// unit, or its path.
func TestLabel(t *testing.T) {
	id := "4f3c2b1a0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a"
	for in, want := range map[string]string{
		"/docker/" + id:                         "4f3c2b1a0d9e",
		"/system.slice/docker-" + id + ".scope": "4f3c2b1a0d9e",
		"/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + id + ".scope": "4f3c2b1a0d9e",
		"/machine.slice/libpod-" + id + ".scope":                              "4f3c2b1a0d9e",
		"/kubepods/besteffort/pod1/" + id:                                     "4f3c2b1a0d9e",
		"/user.slice/user-1000.slice/session-2.scope":                         "session-2.scope",
		"/gpuarb-test/a": "/gpuarb-test/a",
		"/":              "/",
		"":               "?",
	} {
		if got := Label(in); got != want {
			t.Errorf("Label(%q) = %q, want %q", in, got, want)
		}
	}
}

// Pod cgroups are those under the kubelet's kubepods, in either driver's
// form.
func TestPodCgroup(t *testing.T) {
	for in, want := range map[string]bool{
		"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope": true,
		"/kubepods/burstable/pod1/abc":                true,
		"/kubepods/pod1/abc":                          true,
		"/system.slice/docker-abc.scope":              false,
		"/gpuarb-test/kubepods-like/x":                false,
		"/user.slice/user-1000.slice/session-2.scope": false,
	} {
		if got := PodCgroup(in); got != want {
			t.Errorf("PodCgroup(%q) = %v, want %v", in, got, want)
		}
	}
}

// A default tenant is re-gated only by an entry, new or changed, that may
// take its processes, or by a change of what applies to every tenant.
func TestReshapedTouchesDefaultsOnlyWhenSelected(t *testing.T) {
	base := &policy.Config{Period: 100 * time.Millisecond, Tenants: []policy.Tenant{{Name: "x", Selector: policy.Selector{Cgroup: "/ctr/x"}}}}
	with := func(ts ...policy.Tenant) *policy.Config {
		c := *base
		c.Tenants = append(append([]policy.Tenant(nil), base.Tenants...), ts...)
		return &c
	}
	found := tenant{name: "/pods/a/found", cgroup: "/pods/a/found"}
	byID := tenant{name: "cgroup id 7", cgroup: "cgroup:7"}
	self, _ := cgroup.ProcessPath(os.Getpid())
	for _, c := range []struct {
		what     string
		old, cfg *policy.Config
		t        tenant
		want     bool
	}{
		{"another cgroup attached", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), found, false},
		{"another cgroup detached", with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), base, found, false},
		{"a sibling's prefix", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/pods/a/fou"}}), found, false},
		{"its own cgroup attached", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/pods/a/found"}}), found, true},
		{"a parent attached", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/pods"}}), found, true},
		{"a container id in its path", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{ContainerID: "a/fo"}}), found, true},
		{"an entry changed to select it", with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/pods/a"}}), found, true},
		{"a pid tenant in its cgroup", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{PID: os.Getpid()}}), tenant{name: self, cgroup: self}, true},
		{"a pid tenant elsewhere", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{PID: os.Getpid()}}), found, self == "/"},
		{"a cgroup known by id only", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), byID, true},
		{"the defaults changed", base, &policy.Config{Period: 100 * time.Millisecond, Tenants: base.Tenants, Defaults: policy.Rules{Weight: 5}}, found, true},
		{"its own entry changed", with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}, Rules: policy.Rules{Weight: 3}}), tenant{name: "y", cgroup: "/ctr/y"}, true},
		{"another's entry changed", with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}, Rules: policy.Rules{Weight: 3}}), tenant{name: "x", cgroup: "/ctr/x"}, false},
	} {
		if got := Reshaped(c.old, c.cfg, c.t.name, c.t.cgroup, "", ReadPIDTenants(c.cfg).Cgroups); got != c.want {
			t.Errorf("%s: Reshaped(%s) = %v, want %v", c.what, c.t.name, got, c.want)
		}
	}
}
