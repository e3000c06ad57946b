package ioctlspy

import (
	"bytes"
	"testing"
)

// A process's managed ranges are what the kernel has mapped of them: an
// munmap takes off what it covers, splitting a range it cuts; a mapping
// over a range replaces it; lengths count in pages; an exit ends them all.
// Held sums them beside the process's device memory, and a saved table
// restores them.
func TestManagedRangesFollowTheMappings(t *testing.T) {
	const mb = 1 << 20
	tab := NewTable()
	apply := func(addr, n uint64, unmap bool) {
		tab.Apply(&ManagedMapped{Header: Header{PID: 42}, Addr: addr, Len: n, Unmap: unmap})
	}
	held := func() uint64 {
		_, _, managed := tab.Held([]uint32{42, 43}, 0)
		return managed
	}
	apply(0x10000000, 6*mb, false)
	apply(0x20000000, 100, false) // a page
	if got := held(); got != 6*mb+4096 {
		t.Fatalf("held %d after two mappings, want 6 MiB and a page", got)
	}
	apply(0x10000000+2*mb, 2*mb, true) // the middle of the first
	if got := held(); got != 4*mb+4096 {
		t.Errorf("held %d after the middle was unmapped, want 4 MiB and a page", got)
	}
	apply(0x10000000+mb, 4*mb, true) // across both halves' inner ends
	if got := held(); got != 2*mb+4096 {
		t.Errorf("held %d after an unmap across both halves, want 2 MiB and a page", got)
	}
	apply(0x10000000, 2*mb, false) // over the first MiB left and the hole after it
	if got := held(); got != 3*mb+4096 {
		t.Errorf("held %d after a mapping over a range and a hole, want 3 MiB and a page", got)
	}
	apply(0x30000000, 8*mb, true) // unmaps nothing managed
	if got := held(); got != 3*mb+4096 {
		t.Errorf("held %d after an unrelated unmap", got)
	}

	var saved bytes.Buffer
	if err := tab.Save(&saved, func(uint32) (uint64, error) { return 7, nil }); err != nil {
		t.Fatal(err)
	}
	restored := NewTable()
	if _, err := restored.Restore(bytes.NewReader(saved.Bytes()), func(uint32) (uint64, error) { return 7, nil }); err != nil {
		t.Fatal(err)
	}
	if _, _, managed := restored.Held([]uint32{42}, 0); managed != 3*mb+4096 {
		t.Errorf("a restored table holds %d managed, want 3 MiB and a page", managed)
	}

	tab.Apply(&ProcessExit{Header: Header{PID: 42}})
	if got := held(); got != 0 {
		t.Errorf("held %d after the process's exit", got)
	}
}
