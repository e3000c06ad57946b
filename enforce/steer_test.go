package enforce

import (
	"testing"
	"time"
)

// A refused process is that process's trouble while the driver accepts
// others' on its GPU; the GPU itself is refused only when the driver has
// refused a quorum of processes there and accepted none.
func TestRefusalsNeedAQuorumToRefuseTheGPU(t *testing.T) {
	var r refusals
	r.accept(0)
	for pid := uint32(1); pid <= 10; pid++ {
		if fresh, gpu := r.note(0, pid, true); !fresh || gpu {
			t.Fatalf("pid %d refused beside accepted controls: fresh %v, GPU refused %v; want fresh, GPU still steered", pid, fresh, gpu)
		}
	}
	if fresh, _ := r.note(0, 3, true); fresh {
		t.Error("a second refusal of pid 3 reads as news (it would be logged every step)")
	}
	for pid := uint32(100); pid < 100+gpuRefusalQuorum-1; pid++ {
		if _, gpu := r.note(1, pid, true); gpu {
			t.Fatalf("GPU 1 refused after %d processes, want %d", pid-99, gpuRefusalQuorum)
		}
	}
	if _, gpu := r.note(1, 200, true); !gpu {
		t.Errorf("GPU 1 still steered after %d refused processes and no accepted control", gpuRefusalQuorum)
	}
	// Processes whose descriptors are no longer their control files are
	// their own trouble: however many, they never refuse the GPU.
	for pid := uint32(300); pid < 300+2*gpuRefusalQuorum; pid++ {
		if _, gpu := r.note(2, pid, false); gpu {
			t.Fatalf("GPU 2 refused after %d processes that are not the driver's refusals", pid-299)
		}
	}
	r.forget(map[uint32]bool{3: true})
	if len(r.pids) != 1 {
		t.Errorf("after the others exited %d refused processes are remembered, want 1 (pid 3)", len(r.pids))
	}
	if _, ok := r.pids[3]; !ok {
		t.Error("pid 3, still live, was forgotten")
	}
}

// A slice within the deadband of the one set is left; beyond it, or a
// group never set, takes the new one.
func TestNearSlice(t *testing.T) {
	for _, tc := range []struct {
		set, want time.Duration
		near      bool
	}{
		{0, time.Millisecond, false},
		{time.Millisecond, time.Millisecond, true},
		{time.Millisecond, 1040 * time.Microsecond, true},
		{time.Millisecond, 960 * time.Microsecond, true},
		{time.Millisecond, 1060 * time.Microsecond, false},
		{time.Millisecond, 900 * time.Microsecond, false},
		{100 * time.Microsecond, 110 * time.Microsecond, false},
	} {
		if got := nearSlice(tc.set, tc.want); got != tc.near {
			t.Errorf("nearSlice(%v, %v) = %v, want %v", tc.set, tc.want, got, tc.near)
		}
	}
}

// A step changes at most its limit of slices: those of the tenants
// entitled to most of the GPU first, then the largest changes; slices
// near the one set are not changes at all.
func TestPickSliceChangesBoundsAStep(t *testing.T) {
	ms := time.Millisecond
	hog1 := groupKey{pid: 1, tsg: 1}
	hog2 := groupKey{pid: 2, tsg: 1}
	cands := []sliceChange{
		{key: hog1, set: ms, want: 1100 * time.Microsecond, target: 0.36},
		{key: hog2, set: ms, want: 1020 * time.Microsecond, target: 0.36}, // within the deadband
	}
	for i := range 300 { // light tenants flipping between burst slices
		cands = append(cands, sliceChange{key: groupKey{pid: uint32(100 + i), tsg: 1}, set: ms, want: 2 * ms, target: 0.001})
	}
	fresh := groupKey{pid: 99, tsg: 1} // never set: its change comes before equals' changes
	cands = append(cands, sliceChange{key: groupKey{pid: 98, tsg: 1}, set: ms, want: 4 * ms, target: 0.001},
		sliceChange{key: fresh, want: ms, target: 0.001})

	got := pickSliceChanges(cands, maxSliceChanges)
	if len(got) != maxSliceChanges {
		t.Fatalf("%d changes, want the limit %d", len(got), maxSliceChanges)
	}
	if got[0].key != hog1 {
		t.Errorf("first change %+v, want the hog's", got[0])
	}
	if got[1].key != fresh || got[2].key.pid != 98 {
		t.Errorf("changes 2 and 3: %+v %+v, want the group never set, then the 4× change", got[1], got[2])
	}
	for _, c := range got {
		if c.key == hog2 {
			t.Error("a slice within the deadband of the one set was changed")
		}
	}
	if n := len(pickSliceChanges(cands[:2], maxSliceChanges)); n != 1 {
		t.Errorf("%d changes of two groups, one within the deadband: want 1", n)
	}
}
