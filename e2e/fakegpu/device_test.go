package fakegpu

import (
	"sync/atomic"
	"testing"
	"time"
)

// newTestGPU is a server with one simulated GPU and no device thread: the
// test drives the GPU through catchUp and the server's controls directly.
func newTestGPU(t *testing.T) (*Server, *gpu) {
	t.Helper()
	cfg := Config{}
	cfg.setDefaults()
	s := &Server{cfg: cfg, reg: newRegistry()}
	g, err := newGPU(0, &s.cfg, s.reg)
	if err != nil {
		t.Fatal(err)
	}
	return s, g
}

// The runlist holds channel groups in the order their clients allocated
// them, as the hardware's, whatever order their requests reached the
// server in; a group of unknown allocation time joins at the end.
func TestRunlistInAllocationOrder(t *testing.T) {
	_, g := newTestGPU(t)
	base := monotonicNS()
	for i, at := range []int64{base - 300, base - 100, base - 200, 0} {
		c, err := g.addContext(uint64(i+1), 100+i, "/", 1, uint32(i+1), 1, at)
		if err != nil {
			t.Fatal(err)
		}
		defer g.removeContext(c)
	}
	var got []int
	for _, c := range g.ctxs {
		got = append(got, c.pid)
	}
	if want := []int{100, 102, 101, 103}; !equal(got, want) {
		t.Errorf("runlist pids %v, want %v (by allocation time)", got, want)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// An entry arrives when its doorbell rang, however late the device thread
// polls: a 1 ms kernel rung 5 ms before the device looks completed
// before it, at the ring plus its cost and the switch to its group.
func TestEntriesArriveWhenTheDoorbellRang(t *testing.T) {
	_, g := newTestGPU(t)
	c, err := g.addContext(1, 100, "/", 1, 1, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.removeContext(c)
	now := monotonicNS()
	rang := now - int64(5*time.Millisecond)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.vt = now - int64(10*time.Millisecond)
	ch := &c.shm.Ch[0]
	ch.Ring[0] = entry{Kind: entryKernel, Event: 3, CostNS: uint64(time.Millisecond)}
	atomic.StoreUint64(&ch.RingAt, uint64(rang))
	atomic.OrUint32(&c.shm.Chans, 1) // the client marks the channel used before its first entry
	atomic.StoreUint64(&ch.GPPut, 1)
	atomic.AddUint32(&g.db.Ring, 1)
	g.catchUp()
	if got := atomic.LoadUint64(&ch.GPGet); got != 1 {
		t.Fatalf("GPGet %d after the device caught up, want 1 (the kernel ran from its doorbell)", got)
	}
	if done, want := int64(c.shm.EventTS[3]), rang+int64(time.Millisecond+g.cfg.ContextSwitch); done != want {
		t.Errorf("the kernel completed %v after its doorbell, want %v", time.Duration(done-rang), time.Millisecond+g.cfg.ContextSwitch)
	}
	if ch.RingAt != 0 {
		t.Errorf("RingAt %d after the poll, want 0 (the next doorbell stamps it again)", ch.RingAt)
	}
}
