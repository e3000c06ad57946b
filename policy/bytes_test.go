package policy

import (
	"encoding/json"
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
		if tn.MemoryLimit != (MemoryLimit{Bytes: 1 << 30}) {
			t.Errorf("%s: memory_limit %s, want 1 GiB", tn.Name, tn.MemoryLimit)
		}
	}
	for _, bad := range []string{"memory_limit: 1MiB", "memory_limit: 0%", "memory_limit: 101%", "memory_limit: lots",
		`memory_limit: "40% up to 1MiB"`, "memory_limit: NaN%", `memory_limit: "up to 1GiB"`} {
		if _, err := Parse([]byte("tenants:\n  - {name: a, cgroup: /a, " + bad + "}\n")); err == nil || !strings.Contains(err.Error(), "memory") {
			t.Errorf("%s: %v, want an error naming the memory limit", bad, err)
		}
	}
	r, err := RulesFromStrings(map[string]string{KeyMemoryLimit: "2GiB"})
	if err != nil || r.MemoryLimit != (MemoryLimit{Bytes: 2 << 30}) {
		t.Errorf("memory-limit=2GiB: %+v, %v", r, err)
	}
	if _, err := RulesFromStrings(map[string]string{KeyMemoryLimit: "1KiB"}); err == nil {
		t.Error("memory-limit=1KiB was accepted: below the smallest limit")
	}
}

func TestAdmitBoundsMemoryLimits(t *testing.T) {
	requireAdmittedUnder(t, "8GiB", []admitted{
		{MemoryLimit{}, MemoryLimit{Bytes: 8 << 30}, true},
		{MemoryLimit{Bytes: 16 << 30}, MemoryLimit{Bytes: 8 << 30}, true},
		{MemoryLimit{Bytes: 4 << 30}, MemoryLimit{Bytes: 4 << 30}, false},
		// A share keeps its share under the bound: the lower holds per GPU.
		{MemoryLimit{Share: 0.5}, MemoryLimit{Share: 0.5, Bytes: 8 << 30}, true},
		{MemoryLimit{Share: 0.5, Bytes: 2 << 30}, MemoryLimit{Share: 0.5, Bytes: 2 << 30}, false},
	})
	if _, err := Parse([]byte("admission:\n  - {cgroup_prefix: /, max_memory_limit: 1KiB}\n")); err == nil {
		t.Error("max_memory_limit 1KiB accepted")
	}
	// A bound given as a share of each GPU's memory.
	requireAdmittedUnder(t, "50%", []admitted{
		{MemoryLimit{}, MemoryLimit{Share: 0.5}, true},
		{MemoryLimit{Share: 0.75}, MemoryLimit{Share: 0.5}, true},
		{MemoryLimit{Share: 0.25}, MemoryLimit{Share: 0.25}, false},
		// An amount keeps its amount under a share: the lower holds per GPU.
		{MemoryLimit{Bytes: 16 << 30}, MemoryLimit{Bytes: 16 << 30, Share: 0.5}, true},
	})
	if _, err := Parse([]byte("admission:\n  - {cgroup_prefix: /, max_memory_limit: 150%}\n")); err == nil {
		t.Error("max_memory_limit 150% accepted")
	}
}

// admitted is a requested memory limit, what admission makes of it, and
// whether it says it changed it.
type admitted struct {
	in, want MemoryLimit
	changed  bool
}

// requireAdmittedUnder admits each case's request under an admission rule
// of max_memory_limit bound.
func requireAdmittedUnder(t *testing.T, bound string, cases []admitted) {
	t.Helper()
	c, err := Parse([]byte("admission:\n  - {cgroup_prefix: /, max_weight: 1000, max_memory_limit: " + bound + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		r := Rules{Weight: 100, MemoryLimit: tc.in}
		ch := c.Admit("/k/pod", &r)
		if r.MemoryLimit != tc.want || (len(ch) == 1) != tc.changed {
			t.Errorf("requested %s under %s: admitted %s (%q), want %s", tc.in, bound, r.MemoryLimit, ch, tc.want)
		}
	}
}

func TestMemoryLimitAsAShareOfEachGPU(t *testing.T) {
	for in, want := range map[string]MemoryLimit{
		"50%": {Share: 0.5}, " 12.5 % ": {Share: 0.125}, "100%": {Share: 1},
		"25% up to 16GiB": {Share: 0.25, Bytes: 16 << 30}, "16GiB": {Bytes: 16 << 30},
	} {
		got, err := ParseMemoryLimit(in)
		if err != nil || got != want {
			t.Errorf("ParseMemoryLimit(%q) = %+v, %v; want %+v", in, got, err, want)
			continue
		}
		if back, err := ParseMemoryLimit(got.String()); err != nil || back != got {
			t.Errorf("%q reads back from %q as %+v, %v", in, got.String(), back, err)
		}
	}
	const gpu = 80 << 30
	for _, tc := range []struct {
		m        MemoryLimit
		gpuBytes uint64
		want     uint64
	}{
		{MemoryLimit{Share: 0.5}, gpu, 40 << 30},
		{MemoryLimit{Share: 0.5}, 0, 0}, // size unknown: the share holds nothing yet
		{MemoryLimit{Share: 0.5, Bytes: 16 << 30}, gpu, 16 << 30},
		{MemoryLimit{Share: 0.1, Bytes: 16 << 30}, gpu, 8 << 30},
		{MemoryLimit{Share: 0.5, Bytes: 16 << 30}, 0, 16 << 30},
		{MemoryLimit{Bytes: 16 << 30}, gpu, 16 << 30},
	} {
		if got := tc.m.On(tc.gpuBytes); got != tc.want {
			t.Errorf("%s on a GPU of %d B: %d, want %d", tc.m, tc.gpuBytes, got, tc.want)
		}
	}
	c, err := Parse([]byte("defaults: {memory_limit: 40%}\ntenants:\n  - {name: a, cgroup: /a, memory_limit: \"30% up to 8GiB\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Defaults.MemoryLimit != (MemoryLimit{Share: 0.4}) || c.Tenants[0].MemoryLimit != (MemoryLimit{Share: 0.3, Bytes: 8 << 30}) {
		t.Errorf("parsed %+v and %+v", c.Defaults.MemoryLimit, c.Tenants[0].MemoryLimit)
	}
	r, err := RulesFromStrings(map[string]string{KeyMemoryLimit: "50%"})
	if err != nil || r.MemoryLimit != (MemoryLimit{Share: 0.5}) {
		t.Errorf("memory-limit=50%%: %+v, %v", r, err)
	}
	// JSON (the attach API): an amount alone stays a number, as older
	// clients send and read it; a share is a string.
	for _, m := range []MemoryLimit{{Bytes: 1 << 30}, {Share: 0.5}, {Share: 0.25, Bytes: 16 << 30}} {
		b, err := json.Marshal(Rules{MemoryLimit: m})
		var back Rules
		if err == nil {
			err = json.Unmarshal(b, &back)
		}
		if err != nil || back.MemoryLimit != m {
			t.Errorf("%+v through JSON %s: %+v, %v", m, b, back.MemoryLimit, err)
		}
	}
	if b, _ := json.Marshal(Rules{MemoryLimit: MemoryLimit{Bytes: 1 << 30}}); !strings.Contains(string(b), `"memory_limit":1073741824`) {
		t.Errorf("an amount alone marshals as %s, want a number", b)
	}
	if b, _ := json.Marshal(Rules{}); strings.Contains(string(b), "memory_limit") {
		t.Errorf("no limit marshals as %s", b)
	}
}
