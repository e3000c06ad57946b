package policy

import (
	"strings"
	"testing"
)

func TestAdmit(t *testing.T) {
	c, err := Parse([]byte(`
admission:
  - {cgroup_prefix: /, max_weight: 1000}
  - {cgroup_prefix: /kubepods/guaranteed, max_weight: 5000, allow_latency: true}
  - {cgroup_prefix: /kubepods/besteffort, max_weight: 50}
`))
	if err != nil {
		t.Fatal(err)
	}
	latency := Rules{Weight: 9000, Priority: Latency, SLO: SLO{P99SyncMS: 1}}
	for _, tc := range []struct {
		cgroup  string
		in      Rules
		want    Rules
		changes []string // a word of each change, in order
	}{
		// Under no narrower rule: the "/" rule.
		{"/system.slice/a", latency, Rules{Weight: 1000}, []string{"weight 9000 lowered to 1000 by the admission rule for /", "admitted with priority normal"}},
		{"/kubepods/guaranteed/pod1/c", latency, Rules{Weight: 5000, Priority: Latency, SLO: SLO{P99SyncMS: 1}}, []string{"lowered to 5000"}},
		{"/kubepods/guaranteed", Rules{Weight: 300}, Rules{Weight: 300}, nil},
		// A prefix matches whole path components only.
		{"/kubepods/guaranteed-not/c", Rules{Weight: 3000}, Rules{Weight: 1000}, []string{"rule for /"}},
		{"/kubepods/besteffort/p/c", Rules{Weight: 100, Limit: 0.3}, Rules{Weight: 50, Limit: 0.3}, []string{"lowered to 50"}},
		// An SLO alone is a latency request too.
		{"/a", Rules{SLO: SLO{FPS: 60}}, Rules{}, []string{"not admitted"}},
	} {
		got := tc.in
		changes := c.Admit(tc.cgroup, &got)
		if got != tc.want {
			t.Errorf("%s: %+v admitted as %+v, want %+v", tc.cgroup, tc.in, got, tc.want)
		}
		if len(changes) != len(tc.changes) {
			t.Errorf("%s: changes %q, want %d", tc.cgroup, changes, len(tc.changes))
			continue
		}
		for i, w := range tc.changes {
			if !strings.Contains(changes[i], w) {
				t.Errorf("%s: change %q, want it to say %q", tc.cgroup, changes[i], w)
			}
		}
	}

	// Issue 56, item 5: no admission rules, the default's: weight capped at
	// 1000, latency refused. The policy's YAML says so.
	r := latency
	if ch := Default().Admit("/a", &r); len(ch) != 2 || r != (Rules{Weight: 1000}) {
		t.Errorf("without admission rules %+v became %+v (%q), want weight 1000 and no latency", latency, r, ch)
	}
	if out, err := Default().YAML(); err != nil || !strings.Contains(string(out), "# admission: none given, so the default") {
		t.Errorf("the YAML of a policy without admission rules does not say the default applies: %v\n%s", err, out)
	}
	// Rules of the operator's own lift it.
	open, err := Parse([]byte("admission: [{cgroup_prefix: /, max_weight: 10000, allow_latency: true}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	r = latency
	if ch := open.Admit("/a", &r); ch != nil || r != latency {
		t.Errorf("with admission rules that allow it %+v became %+v (%q)", latency, r, ch)
	}
	// Defaults of priority latency never make a refused request latency.
	d, err := Parse([]byte("defaults: {priority: latency}\nadmission: [{cgroup_prefix: /}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	r = Rules{Priority: Latency}
	d.Admit("/a", &r)
	if r.Priority != Normal {
		t.Errorf("with latency defaults a refused latency request got priority %q, want normal", r.Priority)
	}
}
