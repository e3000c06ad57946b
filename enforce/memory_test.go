package enforce

import (
	"errors"
	"os"
	"testing"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/policy"
)

// Limits follow the targets by name: a new tenant takes a slot, a tenant
// gone gives its slot back, Set adds one and leaves the rest, and a slot
// names its tenant (for the kill's log line).
func TestMemoryLimitsFollowTheirTargets(t *testing.T) {
	testutil.Privileged(t)
	if _, err := bpf.EnsureFilesystems(); err != nil {
		t.Fatal(err)
	}
	p, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	m := NewMemoryLimits(p)
	defer m.Close()
	if err := m.Sync(map[string]MemoryTarget{"a": {Limit: policy.MemoryLimit{Bytes: 1 << 30}, Cgroups: []uint64{1}}, "b": {Limit: policy.MemoryLimit{Bytes: 2 << 30}, PIDs: []int{1}}}); err != nil {
		t.Fatal(err)
	}
	owners := map[string]uint32{}
	for slot := uint32(0); slot < 4; slot++ {
		if name := m.Owner(slot); name != "" {
			owners[name] = slot
		}
	}
	if len(owners) != 2 {
		t.Fatalf("slot owners %v, want a and b", owners)
	}
	if err := m.Sync(map[string]MemoryTarget{"b": {Limit: policy.MemoryLimit{Bytes: 3 << 30}, PIDs: []int{1}}}); err != nil {
		t.Fatal(err)
	}
	if name := m.Owner(owners["a"]); name != "" {
		t.Errorf("a's slot still names %q after a went", name)
	}
	if err := m.Set("c", MemoryTarget{Limit: policy.MemoryLimit{Bytes: 4 << 30}, Cgroups: []uint64{2}}); err != nil {
		t.Fatal(err)
	}
	u := m.Usage()
	if len(u) != 2 || u["b"].Limit.Bytes != 3<<30 || u["c"].Limit.Bytes != 4<<30 || len(u["b"].Charged) != 0 {
		t.Errorf("usage %+v, want b at 3 GiB and c at 4 GiB, nothing charged", u)
	}
	if m.Owner(owners["b"]) != "b" {
		t.Errorf("b's slot names %q after Set", m.Owner(owners["b"]))
	}
	if err := NewMemoryLimits(nil).Sync(map[string]MemoryTarget{"a": {Limit: policy.MemoryLimit{Bytes: 1}}}); err == nil {
		t.Error("a limit without probes was accepted")
	}
}

// A daemon's limits left in the pins (Leave) are adopted by the next
// one's tenant of the same members, in the same slot; a slot whose tenant
// is not among the targets holds over until heldOverGrace after the
// start, then is released.
func TestMemoryLimitsAdoptWhatAnEarlierDaemonLeft(t *testing.T) {
	testutil.Privileged(t)
	if _, err := bpf.EnsureFilesystems(); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(bpf.BPFFSPath, "gpuarb-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	first, err := bpf.Load(bpf.Options{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMemoryLimits(first)
	err = m.Sync(map[string]MemoryTarget{"a": {Limit: policy.MemoryLimit{Bytes: 1 << 30}, Cgroups: []uint64{1}}, "b": {Limit: policy.MemoryLimit{Bytes: 2 << 30}, Cgroups: []uint64{2}}})
	owners := map[string]uint32{}
	for slot := uint32(0); slot < 4; slot++ {
		if name := m.Owner(slot); name != "" {
			owners[name] = slot
		}
	}
	m.Leave()
	if err := errors.Join(err, first.Close()); err != nil {
		t.Fatal(err)
	}

	second, err := bpf.Load(bpf.Options{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	m = NewMemoryLimits(second)
	defer m.Close()
	if err := m.Sync(map[string]MemoryTarget{"a2": {Limit: policy.MemoryLimit{Bytes: 3 << 30}, Cgroups: []uint64{1, 3}}}); err != nil {
		t.Fatal(err)
	}
	if m.Owner(owners["a"]) != "a2" {
		t.Errorf("a's slot %d names %q, want a2, the tenant of its cgroup", owners["a"], m.Owner(owners["a"]))
	}
	// b's slot holds over: a new limit takes another.
	fresh, err := second.NewMemoryLimit()
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Slot() == owners["b"] || fresh.Slot() == owners["a"] {
		t.Errorf("a new limit took slot %d within the grace, held by a2 or held over for b", fresh.Slot())
	}
	if err := fresh.Close(); err != nil {
		t.Fatal(err)
	}
	m.start = m.start.Add(-heldOverGrace)
	if err := m.Sync(map[string]MemoryTarget{"a2": {Limit: policy.MemoryLimit{Bytes: 3 << 30}, Cgroups: []uint64{1, 3}}}); err != nil {
		t.Fatal(err)
	}
	if m.Owner(owners["a"]) != "a2" || len(m.Usage()) != 1 || m.Usage()["a2"].Limit.Bytes != 3<<30 {
		t.Errorf("usage %+v after the grace, want a2's 3 GiB in a's slot", m.Usage())
	}
	if got := second.AdoptMemoryLimit([]uint64{2}, nil); got != nil {
		t.Errorf("b's slot %d still held over after the grace", got.Slot())
	}
}
