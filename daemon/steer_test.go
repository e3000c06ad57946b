package daemon

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
		if fresh, gpu := r.note(0, pid); !fresh || gpu {
			t.Fatalf("pid %d refused beside accepted controls: fresh %v, GPU refused %v; want fresh, GPU still steered", pid, fresh, gpu)
		}
	}
	if fresh, _ := r.note(0, 3); fresh {
		t.Error("a second refusal of pid 3 reads as news (it would be logged every step)")
	}
	for pid := uint32(100); pid < 100+gpuRefusalQuorum-1; pid++ {
		if _, gpu := r.note(1, pid); gpu {
			t.Fatalf("GPU 1 refused after %d processes, want %d", pid-99, gpuRefusalQuorum)
		}
	}
	if _, gpu := r.note(1, 200); !gpu {
		t.Errorf("GPU 1 still steered after %d refused processes and no accepted control", gpuRefusalQuorum)
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
