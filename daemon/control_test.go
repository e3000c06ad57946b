package daemon

import (
	"os"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/policy"
)

// The control window is three periods, at least minControlWindow and at
// most the meter's window.
func TestControlWindowSpansThreePeriods(t *testing.T) {
	for _, tc := range []struct{ period, meter, want time.Duration }{
		{100 * time.Millisecond, time.Second, 300 * time.Millisecond},
		{10 * time.Millisecond, time.Second, minControlWindow},
		{200 * time.Millisecond, time.Second, 600 * time.Millisecond},
		{500 * time.Millisecond, time.Second, time.Second},
	} {
		d := &Daemon{cfg: Config{Window: tc.meter}, policy: &policy.Config{Period: tc.period}}
		if got := d.controlWindow(); got != tc.want {
			t.Errorf("period %v, meter window %v: control window %v, want %v", tc.period, tc.meter, got, tc.want)
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
	found := &tenant{name: "/pods/a/found", cgroup: "/pods/a/found"}
	byID := &tenant{name: "cgroup id 7", cgroup: "cgroup:7"}
	self, _ := cgroup.ProcessPath(os.Getpid())
	for _, c := range []struct {
		what     string
		old, cfg *policy.Config
		t        *tenant
		want     bool
	}{
		{"another cgroup attached", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), found, false},
		{"another cgroup detached", with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), base, found, false},
		{"a sibling's prefix", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/pods/a/fou"}}), found, false},
		{"its own cgroup attached", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/pods/a/found"}}), found, true},
		{"a parent attached", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/pods"}}), found, true},
		{"a container id in its path", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{ContainerID: "a/fo"}}), found, true},
		{"an entry changed to select it", with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/pods/a"}}), found, true},
		{"a pid tenant in its cgroup", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{PID: os.Getpid()}}), &tenant{name: self, cgroup: self}, true},
		{"a pid tenant elsewhere", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{PID: os.Getpid()}}), found, self == "/"},
		{"a cgroup known by id only", base, with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), byID, true},
		{"the defaults changed", base, &policy.Config{Period: 100 * time.Millisecond, Tenants: base.Tenants, Defaults: policy.Rules{Weight: 5}}, found, true},
		{"its own entry changed", with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}, Rules: policy.Rules{Weight: 3}}), &tenant{name: "y", cgroup: "/ctr/y"}, true},
		{"another's entry changed", with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}}), with(policy.Tenant{Name: "y", Selector: policy.Selector{Cgroup: "/ctr/y"}, Rules: policy.Rules{Weight: 3}}), &tenant{name: "x", cgroup: "/ctr/x"}, false},
	} {
		if got := reshaped(c.old, c.cfg, c.t, "", readPIDTenants(c.cfg).cgroups); got != c.want {
			t.Errorf("%s: reshaped(%s) = %v, want %v", c.what, c.t.name, got, c.want)
		}
	}
}
