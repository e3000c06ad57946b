package policy

import (
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]Bytes{
		"1073741824": 1 << 30, "1GiB": 1 << 30, "1Gi": 1 << 30, "512MiB": 512 << 20, " 1.5 GiB ": 3 << 29,
		"80GB": 80e9, "2G": 2e9, "64Mi": 64 << 20, "1TiB": 1 << 40,
	} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "1 gigabyte", "-1GiB", "50%", "1e30", "NaN", "1.2.3G"} {
		if got, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", in, got)
		}
	}
	if s := Bytes(3 << 30).String(); s != "3GiB" {
		t.Errorf("3 GiB reads %q", s)
	}
	if s := Bytes(1500).String(); s != "1500" {
		t.Errorf("1500 B reads %q", s)
	}
}

func TestMemoryLimitRules(t *testing.T) {
	c, err := Parse([]byte(`
tenants:
  - {name: a, cgroup: /a, memory_limit: 1GiB}
  - {name: b, cgroup: /b, memory_limit: 1073741824}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range c.Tenants {
		if tn.MemoryLimit != 1<<30 {
			t.Errorf("%s: memory_limit %d, want 1 GiB", tn.Name, tn.MemoryLimit)
		}
	}
	for _, bad := range []string{"memory_limit: 1MiB", "memory_limit: 40%", "memory_limit: lots"} {
		if _, err := Parse([]byte("tenants:\n  - {name: a, cgroup: /a, " + bad + "}\n")); err == nil || !strings.Contains(err.Error(), "memory") {
			t.Errorf("%s: %v, want an error naming the memory limit", bad, err)
		}
	}
	r, err := RulesFromStrings(map[string]string{KeyMemoryLimit: "2GiB"})
	if err != nil || r.MemoryLimit != 2<<30 {
		t.Errorf("memory-limit=2GiB: %+v, %v", r, err)
	}
	if _, err := RulesFromStrings(map[string]string{KeyMemoryLimit: "1KiB"}); err == nil {
		t.Error("memory-limit=1KiB was accepted: below the smallest limit")
	}
}

func TestAdmitBoundsMemoryLimits(t *testing.T) {
	c, err := Parse([]byte(`
admission:
  - {cgroup_prefix: /, max_weight: 1000, max_memory_limit: 8GiB}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in, want Bytes
		changed  bool
	}{{0, 8 << 30, true}, {16 << 30, 8 << 30, true}, {4 << 30, 4 << 30, false}} {
		r := Rules{Weight: 100, MemoryLimit: tc.in}
		ch := c.Admit("/k/pod", &r)
		if r.MemoryLimit != tc.want || (len(ch) == 1) != tc.changed {
			t.Errorf("requested %s: admitted %s (%q), want %s", tc.in, r.MemoryLimit, ch, tc.want)
		}
	}
	if _, err := Parse([]byte("admission:\n  - {cgroup_prefix: /, max_memory_limit: 1KiB}\n")); err == nil {
		t.Error("max_memory_limit 1KiB accepted")
	}
}
