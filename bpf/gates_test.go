package bpf

import (
	"syscall"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

// leased renews the gates' lease for the test's length, as a running
// daemon does, and ends it at cleanup.
func leased(t *testing.T, p *Probes) {
	t.Helper()
	if err := p.RenewLease(time.Hour); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.EndLease() })
}

// gatedCgroup makes a launch gate over a new cgroup with the given
// allowance.
func gatedCgroup(t *testing.T, p *Probes, name string, allow uint64) (*LaunchGate, *testutil.Cgroup) {
	t.Helper()
	if _, err := p.AttachLibcuda(testutil.Bin(t, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	g, err := p.NewLaunchGate()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	cg := testutil.NewCgroup(t, name)
	if err := g.SetMembers([]uint64{cg.ID}, nil); err != nil {
		t.Fatal(err)
	}
	if err := g.Allow(allow); err != nil {
		t.Fatal(err)
	}
	return g, cg
}

// heldWithin waits up to 15 s (a workload on a loaded host) for the gate
// to hold a process that is stopped, and returns the hold; failing, it
// says what the gate counted.
func heldWithin(t *testing.T, g *LaunchGate) HeldProcess {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(time.Millisecond) {
		held, err := g.Held()
		if err != nil {
			t.Fatal(err)
		}
		if len(held) == 1 && cgroup.Stopped(held[0].PID) {
			return held[0]
		}
		if time.Now().After(deadline) {
			admitted, holds, escapes, err := g.Counts()
			t.Fatalf("no process held and stopped within 15 s: %+v (admitted %d, holds %d, escapes %d, %v)", held, admitted, holds, escapes, err)
		}
	}
}

// Issue 62: a gate stops nobody while its lease has lapsed (the daemon
// that renews it is gone): beyond the allowance the launches run,
// counted; once the lease is renewed the gate holds again, and once it is
// ended again the next launch beyond the allowance runs.
func TestLaunchGateStopsNobodyWithoutALease(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	p := loadForTest(t, Options{})
	g, cg := gatedCgroup(t, p, "unleased", 2)
	w := testutil.Start(t, cg, gpu.Workload(t, "hog", "--kernel-ms", "1", "--depth", "2", "--duration", "0.3"))
	if err := w.Wait(t, 15*time.Second); err != nil {
		t.Fatalf("the workload beside a gate without a lease: %v", err)
	}
	if n, holds, _, err := g.Counts(); err != nil || holds != 0 || n <= 2 {
		t.Errorf("admitted %d, holds %d (%v): want every launch through, none held", n, holds, err)
	}
	leased(t, p)
	w = testutil.Start(t, cg, gpu.Workload(t, "hog", "--kernel-ms", "1", "--depth", "2", "--duration", "2"))
	h := heldWithin(t, g)
	if h.PID != w.Cmd.Process.Pid || h.Stopping {
		t.Fatalf("held %+v, want pid %d with its stop out", h, w.Cmd.Process.Pid)
	}
	if err := p.EndLease(); err != nil {
		t.Fatal(err)
	}
	if ok, err := g.Release(h, func(h HeldProcess) error { return syscall.Kill(h.PID, syscall.SIGCONT) }); !ok || err != nil {
		t.Fatalf("release: %v, %v", ok, err)
	}
	if err := w.Wait(t, 15*time.Second); err != nil {
		t.Fatalf("the workload after its release, the lease ended: %v", err)
	}
	if _, holds, _, _ := g.Counts(); holds != 1 {
		t.Errorf("holds %d after the lease ended, want the one", holds)
	}
}

// Issue 62: a process whose threads launch at once (a context per thread)
// is held as one: the threads that launch while a sibling's stop is on its
// way wait with it (counted in the hold), none is taken for an escape (a
// process continued by someone else), and a release lets them all run.
// Taking them for escapes left a process stopped with no hold recorded.
func TestLaunchGateHoldsAProcessOfThreadsAsOne(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	p := loadForTest(t, Options{})
	leased(t, p)
	g, cg := gatedCgroup(t, p, "threads", 0)
	// It runs long enough for the 50 holds on a loaded host (about 3 s
	// here alone), then ends by itself once let through.
	w := testutil.Start(t, cg, gpu.Workload(t, "loop", "--threads", "4", "--kernels-ms", "1", "--sync-every", "4", "--duration", "10"))
	cont := func(h HeldProcess) error { return syscall.Kill(h.PID, syscall.SIGCONT) }
	waiting := uint32(0)
	var n uint64
	for i := 0; i < 50; i++ {
		h := heldWithin(t, g)
		waiting += h.Waiting
		// Four more launches each time: the threads contend at every hold.
		n += 4
		if err := g.Allow(n); err != nil {
			t.Fatal(err)
		}
		if ok, err := g.Release(h, cont); !ok || err != nil {
			t.Fatalf("release %d: %v, %v", i, ok, err)
		}
	}
	_, holds, escapes, err := g.Counts()
	if err != nil || escapes != 0 || holds < 50 {
		t.Errorf("holds %d, escapes %d (%v): want ≥ 50 holds and no escape", holds, escapes, err)
	}
	t.Logf("50 releases: %d holds, %d launches waited with a sibling's hold", holds, waiting)
	if err := g.Allow(^uint64(0)); err != nil {
		t.Fatal(err)
	}
	if held, err := g.Held(); err == nil && len(held) == 1 {
		if _, err := g.Release(held[0], cont); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Wait(t, 15*time.Second); err != nil {
		t.Fatalf("the threads after their release: %v", err)
	}
}

// Issue 62: a daemon killed while it releases a process (the hold
// forgotten, the process not continued yet) leaves it noted in the pinned
// table of holds being released, and whoever cleans up after it
// (ReleasePinnedHeld: the guardian, a new daemon, thaw --all) continues
// it; the lease it ends stops nobody more.
func TestReleasePinnedHeldFinishesAnInterruptedRelease(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	dir := pinPathForTest(t)
	p := loadForTest(t, Options{PinPath: dir})
	leased(t, p)
	g, cg := gatedCgroup(t, p, "interrupted", 0)
	w := testutil.Start(t, cg, gpu.Workload(t, "hog", "--kernel-ms", "1", "--depth", "2", "--duration", "0.5"))
	h := heldWithin(t, g)
	// What a daemon killed between forgetting the hold and its SIGCONT
	// leaves: the note, not marked continued, and no hold.
	note := gpuarbReleaseNote{SinceNs: h.Since, StartNs: h.StartTicks * (1e9 / clockTicksPerSecond), Gate: h.Gate}
	if err := p.objs.GpuarbReleasing.Put(uint32(h.PID), note); err != nil {
		t.Fatal(err)
	}
	if forgot, err := g.Forget(h); !forgot || err != nil {
		t.Fatalf("forget: %v, %v", forgot, err)
	}
	if held, _ := g.Held(); len(held) != 0 || !cgroup.Stopped(h.PID) {
		t.Fatalf("held %+v, stopped %v: want the hold forgotten and the process still stopped", held, cgroup.Stopped(h.PID))
	}
	start := time.Now()
	released, err := ReleasePinnedHeld(dir, func(h HeldProcess) error { return cgroup.ContinueProcess(h.PID, h.StartTicks) })
	if err != nil || len(released) != 1 || released[0].PID != h.PID {
		t.Fatalf("released %+v (%v), want pid %d", released, err, h.PID)
	}
	t.Logf("released in %v", time.Since(start))
	if err := w.Wait(t, 15*time.Second); err != nil {
		t.Fatalf("the workload after the cleanup: %v", err)
	}
	if _, holds, _, _ := g.Counts(); holds != 1 {
		t.Errorf("holds %d: the lapsed lease still let the gate stop it", holds)
	}
}
