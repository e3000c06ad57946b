package policy

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	c, err := Parse([]byte(`
period: 200ms
defaults: {weight: 50, priority: batch}
gpus:
  - {index: 1, mode: windows}
  - {index: 2, preemptive: false, timeslice: 4ms}
tenants:
  - name: train
    cgroup: /kubepods/pod1/ctr
    weight: 300
    limit: 50%
  - name: infer
    container_id: abc123
    priority: latency
    slo: {p99_sync_ms: 20}
  - name: bare
    pid: 4242
    limit: 0.25
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Period != 200*time.Millisecond || c.ModeOf(1) != ModeWindows || c.ModeOf(0) != ModeShare {
		t.Errorf("period %v modes %v %v", c.Period, c.ModeOf(0), c.ModeOf(1))
	}
	for gpu, want := range map[int]struct {
		slice time.Duration
		pre   bool
	}{0: {DefaultTimeslice, true}, 1: {DefaultTimeslice, true}, 2: {4 * time.Millisecond, false}} {
		if slice, pre := c.Scheduling(gpu); slice != want.slice || pre != want.pre || c.ModeOf(2) != ModeShare {
			t.Errorf("GPU %d: timeslice %v preemptive %v mode %v, want %v %v share", gpu, slice, pre, c.ModeOf(2), want.slice, want.pre)
		}
	}
	train, _ := c.Tenant("train")
	if train.Weight != 300 || train.Limit != 0.5 || train.Priority != Batch || train.Cgroup != "/kubepods/pod1/ctr" {
		t.Errorf("train %+v", train)
	}
	infer, _ := c.Tenant("infer")
	if infer.Weight != 50 || infer.Priority != Latency || infer.SLO.P99SyncMS != 20 || infer.ContainerID != "abc123" {
		t.Errorf("infer %+v", infer)
	}
	bare, _ := c.Tenant("bare")
	if bare.PID != 4242 || bare.Limit != 0.25 {
		t.Errorf("bare %+v", bare)
	}
	// Round trip.
	out, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Parse(out)
	if err != nil {
		t.Fatalf("re-parse %s: %v", out, err)
	}
	if b, _ := c2.Tenant("train"); b != train {
		t.Errorf("round trip %+v != %+v", b, train)
	}
}

func TestDefaults(t *testing.T) {
	for _, in := range []string{"", "tenants: []\n"} {
		c, err := Parse([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		if c.Period != DefaultPeriod || c.Defaults.Weight != 100 || c.Defaults.Priority != Normal || c.Defaults.Limit != 0 {
			t.Errorf("%q: %+v", in, c)
		}
	}
	c, ok, err := Load(filepath.Join(t.TempDir(), "missing.yaml"))
	if err != nil || ok || c.Defaults.Weight != DefaultWeight {
		t.Errorf("missing file: %+v %v %v", c, ok, err)
	}
}

// An equal-FPS group is named per tenant, or by the defaults for every
// tenant that names none.
func TestEqualFPSGroup(t *testing.T) {
	c, err := Parse([]byte("defaults: {equal_fps: games}\ntenants: [{name: a, cgroup: /a}, {name: b, cgroup: /b, equal_fps: films}]"))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := c.Tenants[0].EqualFPS, c.Tenants[1].EqualFPS; a != "games" || b != "films" {
		t.Errorf("groups %q and %q, want games (the defaults') and films", a, b)
	}
}

func TestRejects(t *testing.T) {
	for _, tc := range []struct{ yaml, field string }{
		{"tenants: [{name: a, cgroup: /a, weight: 0}]", "line 1: weight"},
		{"tenants: [{name: a, cgroup: /a, weight: 10001}]", "tenants[0].weight"},
		{"tenants: [{name: a, cgroup: /a, limit: 1.5}]", "tenants[0].limit"},
		{"tenants: [{name: a, cgroup: /a, limit: 130%}]", "tenants[0].limit"},
		{"tenants: [{name: a, cgroup: /a, priority: urgent}]", "tenants[0].priority"},
		{"tenants: [{name: a, cgroup: /a, slo: {fps: 30}}]", "tenants[0].slo"},
		{"tenants: [{name: a, cgroup: /a, priority: latency, slo: {fps: 30, p99_sync_ms: 5}}]", "tenants[0].slo"},
		{"tenants: [{name: a, cgroup: /a, priority: latency, slo: {p99_sync_ms: -1}}]", "tenants[0].slo.p99_sync_ms"},
		{"tenants: [{name: a}]", "tenants[0]"},
		{"tenants: [{name: a, cgroup: /a, pid: 7}]", "tenants[0]"},
		{"tenants: [{name: a, pid: 1}]", "tenants[0].pid"},
		{"tenants: [{name: 'a b', cgroup: /a}]", "tenants[0].name"},
		{`tenants: [{name: "top\e[2J", cgroup: /a}]`, "tenants[0].name"}, // a terminal escape
		{`tenants: [{name: "a\u202eb", cgroup: /a}]`, "tenants[0].name"}, // a bidi override
		{`tenants: [{name: "a\x7fb", cgroup: /a}]`, "tenants[0].name"},   // DEL
		{"tenants: [{name: a, cgroup: /a}, {name: a, cgroup: /b}]", "tenants[1].name"},
		{"gpus: [{index: 0, mode: fifo}]", "gpus[0].mode"},
		{"gpus: [{index: 0, timeslice: 10us}]", "gpus[0].timeslice"},
		{"period: 1ms", "period"},
		{"defaults: {weight: -3}", "defaults.weight"},
		{"tenants: [{name: a, cgroup: /a, limit: NaN}]", "tenants[0].limit"},
		{"tenants: [{name: a, cgroup: /a, priority: latency, slo: {p99_sync_ms: .inf}}]", "tenants[0].slo.p99_sync_ms"},
		{"tenants: [{name: a, cgroup: /a, priority: latency, slo: {fps: .nan}}]", "tenants[0].slo.fps"},
		{"tenants: [{name: a, cgroup: /a, priority: latency, equal_fps: games}]", "tenants[0].equal_fps"},
		{"tenants: [{name: a, cgroup: /a, equal_fps: 'two games'}]", "tenants[0].equal_fps"},
		{"admission: [{cgroup_prefix: kubepods}]", "admission[0].cgroup_prefix"},
		{"admission: [{cgroup_prefix: /kubepods/}]", "admission[0].cgroup_prefix"},
		{"admission: [{max_weight: 1000}]", "admission[0].cgroup_prefix"},
		{"admission: [{cgroup_prefix: /, max_weight: 20000}]", "admission[0].max_weight"},
		{"admission: [{cgroup_prefix: /, max_weight: 0}]", "line 1: weight"},
	} {
		_, err := Parse([]byte(tc.yaml))
		var fe *FieldError
		switch {
		case strings.HasPrefix(tc.field, "line "): // a value that does not decode
			if err == nil || !strings.Contains(err.Error(), tc.field+":") {
				t.Errorf("%s: got %v, want an error on %s", tc.yaml, err, tc.field)
			}
		case !errors.As(err, &fe) || fe.Field != tc.field:
			t.Errorf("%s: got %v, want an error on %s", tc.yaml, err, tc.field)
		}
	}
	if _, err := Parse([]byte("tenants: [{name: a, cgroup: /a, wieght: 3}]")); err == nil || !strings.Contains(err.Error(), "wieght") {
		t.Errorf("unknown field: %v", err)
	}
	if _, err := Parse([]byte("tenants: [{name: a, cgroup: /a, limit: lots}]")); err == nil {
		t.Error("limit 'lots' accepted")
	}
}

func TestLoadAndEdit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte("tenants: [{name: a, cgroup: /a}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, ok, err := Load(path)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	c2, err := c.With(Tenant{Name: "b", Selector: Selector{PID: 99}, Rules: Rules{Weight: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := c2.Tenant("b"); !ok || b.Priority != Normal || b.Weight != 3 {
		t.Errorf("b %+v", b)
	}
	if _, ok := c.Tenant("b"); ok {
		t.Error("With changed the original")
	}
	if _, err := c2.With(Tenant{Name: "c", Selector: Selector{PID: 99}, Rules: Rules{Weight: 20000}}); err == nil {
		t.Error("weight 20000 accepted")
	}
	c3, ok := c2.Without("a")
	if !ok || len(c3.Tenants) != 1 || len(c2.Tenants) != 2 {
		t.Errorf("Without: %v %+v", ok, c3.Tenants)
	}
	if err := os.WriteFile(path, []byte("tenants: [{name: a, cgroup: /a, weight: 0}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Load(path); err == nil || !strings.Contains(err.Error(), "weight: 0 out of range 1–10000") || !strings.Contains(err.Error(), path) {
		t.Errorf("bad file: %v", err)
	}
}

func TestParseShare(t *testing.T) {
	for in, want := range map[string]Share{"0.3": 0.3, "30%": 0.3, " 5 % ": 0.05, "1": 1} {
		if got, err := ParseShare(in); err != nil || got != want {
			t.Errorf("%q: %v %v", in, got, err)
		}
	}
	if _, err := ParseShare("x%"); err == nil {
		t.Error("x% accepted")
	}
}

// A file with several errors reports each, with its line and field, and no
// Go type names.
func TestReportsEveryError(t *testing.T) {
	_, err := Parse([]byte(`tenants:
  - {name: a, cgroup: /x, weight: 0}
  - {name: b, cgroup: /y, limit: 150%}
  - {name: c, cgroup: /z, priority: urgent, bogus: 1}
period: 1ms
`))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"line 2: weight: 0 out of range 1–10000", "line 3: tenants[1].limit", "line 4: tenants[2].priority",
		"line 4: field bogus not found in a tenant", "period: 1ms out of range"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "policy.") {
		t.Errorf("error names Go types:\n%v", err)
	}
}

// The policy file and `policy apply` bodies are untrusted bytes: Parse
// never panics, what it accepts validates, and its YAML reads back to the
// same policy, admission included.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"", "period: 100ms\n", "defaults: {weight: 100, priority: normal}\n",
		"tenants: [{name: a, cgroup: /a, weight: 300, limit: 30%}]\n",
		"tenants: [{name: i, container_id: 3f2a, priority: latency, slo: {p99_sync_ms: 20}}]\n",
		"gpus: [{index: 1, mode: timeslice}, {index: 2, preemptive: false, timeslice: 4ms}]\n",
		"admission: [{cgroup_prefix: /, max_weight: 1000}, {cgroup_prefix: /k, allow_latency: true}]\n",
		"tenants: [{name: a, cgroup: /a, limit: .nan}]\n", "weight: &a [*a]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a policy that does not validate: %v", err)
		}
		out, err := c.YAML()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("its own YAML does not parse: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(normalized(c), normalized(back)) {
			t.Fatalf("round trip changed the policy:\n%+v\n%+v", c, back)
		}
		r := Rules{Weight: MaxWeight, Priority: Latency}
		c.Admit("/a/b", &r)
		r.fillFrom(c.Defaults)
		if err := r.Validate("admitted"); err != nil {
			t.Fatalf("admitted rules do not validate: %v", err)
		}
	})
}

// normalized makes empty and nil lists alike for comparison.
func normalized(c *Config) Config {
	n := *c
	if len(n.GPUs) == 0 {
		n.GPUs = nil
	}
	if len(n.Tenants) == 0 {
		n.Tenants = nil
	}
	if len(n.Admission) == 0 {
		n.Admission = nil
	}
	return n
}

// KeepCopy copies a policy file whole, and a missing one is nothing to
// keep; FileSum tells two contents apart and reads a missing file as zero.
func TestKeepCopyAndFileSum(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "last-good.yaml")
	if err := KeepCopy(src, dst); err != nil {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a copy of a missing file: %v", err)
	}
	if FileSum(src) != [32]byte{} {
		t.Error("a missing file sums to non-zero")
	}
	if err := os.WriteFile(src, []byte("period: 100ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := FileSum(src)
	if err := KeepCopy(src, dst); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst); string(got) != "period: 100ms\n" {
		t.Errorf("copy holds %q", got)
	}
	if err := os.WriteFile(src, []byte("period: 200ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if FileSum(src) == before {
		t.Error("two contents sum the same")
	}
}

// The freeze-window mode's former name, "timeslice" (which the GPU's own
// timeslice field also names), still loads as "windows"; any other mode
// is refused naming both.
func TestFormerWindowsModeNameStillLoads(t *testing.T) {
	c, err := Parse([]byte("gpus:\n  - {index: 0, mode: timeslice, timeslice: 4ms}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.ModeOf(0) != ModeWindows {
		t.Errorf("mode %q, want %q", c.ModeOf(0), ModeWindows)
	}
	if slice, _ := c.Scheduling(0); slice != 4*time.Millisecond {
		t.Errorf("the GPU's timeslice %v, want 4ms", slice)
	}
	if _, err := Parse([]byte("gpus:\n  - {index: 0, mode: slices}\n")); err == nil || !strings.Contains(err.Error(), "share or windows") {
		t.Errorf("an unknown mode: %v", err)
	}
}
