package fakegpu

import (
	"sync/atomic"
	"testing"
	"time"
)

// A GPU sees a doorbell as it is rung: the device runs an entry from its
// client's doorbell time however late its own thread looks, bounded by
// what it had simulated already and by when it looked.
func TestEntriesRunFromTheirDoorbellTime(t *testing.T) {
	cfg := &Config{ContextSwitch: -1}
	cfg.setDefaults()
	g, err := newGPU(0, cfg, newRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c, err := g.addContext(1, 1, "/t", 1, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	us := int64(time.Microsecond)
	base := monotonicNS()
	g.vt = base
	ring := func(entries ...entry) {
		ch := &c.shm.Ch[0]
		for _, e := range entries {
			e.Seq = ch.GPPut
			ch.Ring[ch.GPPut%RingEntries] = e
			atomic.AddUint64(&ch.GPPut, 1)
		}
		atomic.AddUint32(&g.db.Ring, 1)
	}
	// A kernel of 100 µs rung 50 µs after the device last looked, and an
	// event recorded behind it; the device looks 2 ms later.
	ring(entry{Kind: entryKernel, Event: noEvent, CostNS: uint64(100 * us), RungNS: uint64(base + 50*us)},
		entry{Kind: entryMarker, Event: 0, RungNS: uint64(base + 60*us)})
	for monotonicNS() < base+2*int64(time.Millisecond) {
		time.Sleep(100 * time.Microsecond)
	}
	g.mu.Lock()
	g.catchUp()
	g.mu.Unlock()
	if got, want := int64(c.shm.EventTS[0]), base+150*us; got != want {
		t.Errorf("event behind the kernel completed %d µs after the base, want 150 (rung at 50, 100 µs of work)", (got-base)/us)
	}
	if c.busyNS != uint64(100*us) || c.queueNS != 0 {
		t.Errorf("busy %d ns, queued %d ns: want 100 µs busy, no queueing", c.busyNS, c.queueNS)
	}

	// A doorbell time before what the device simulated already runs from
	// there; one in the future (a client's garbage) from when it looked.
	looked := g.vt
	ring(entry{Kind: entryMarker, Event: 1, RungNS: uint64(looked - 500*us)})
	g.mu.Lock()
	g.catchUp()
	g.mu.Unlock()
	if got := int64(c.shm.EventTS[1]); got != looked {
		t.Errorf("an entry rung before the simulated time completed %d µs after it, want at it", (got-looked)/us)
	}
	before := monotonicNS()
	ring(entry{Kind: entryMarker, Event: 2, RungNS: uint64(before + int64(time.Hour))})
	g.mu.Lock()
	now := g.catchUp()
	g.mu.Unlock()
	if got := int64(c.shm.EventTS[2]); got < before || got > now {
		t.Errorf("an entry rung in the future completed at %d, want when the device looked, within [%d, %d]", got, before, now)
	}
}
