package ioctlspy_test

import (
	"math"
	"syscall"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/ioctlspy"
)

// leased renews the gates' lease for the test's length, as a running
// daemon does: without it no gate stops anyone.
func leased(t *testing.T, p *bpf.Probes) {
	t.Helper()
	if err := p.RenewLease(time.Hour); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.EndLease() })
}

// waitHeld polls the gate until it holds n processes.
func waitHeld(t *testing.T, g *bpf.LaunchGate, n int) []bpf.HeldProcess {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		held, err := g.Held()
		if err != nil {
			t.Fatal(err)
		}
		if len(held) == n {
			return held
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("the gate never held %d processes", n)
	return nil
}

// A cgroup gate stops a workload in a cgroup below it at the first launch
// beyond its allowance, before that launch reaches the GPU, and lets it
// finish once released; a process in another cgroup is never held.
func TestLaunchGateHoldsAtTheLaunch(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	probes, c := startSpy(t, nil, 0)
	leased(t, probes)
	if _, err := probes.AttachLibcuda(testutil.Bin(t, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	cg := testutil.NewCgroup(t, "gated")
	sub := testutil.Sub(t, cg, "pod/ctr")
	other := testutil.NewCgroup(t, "free")
	g, err := probes.NewLaunchGate()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.SetMembers([]uint64{cg.ID}, nil); err != nil {
		t.Fatal(err)
	}
	const allowed = 5
	if err := g.Allow(allowed); err != nil {
		t.Fatal(err)
	}
	free := testutil.Start(t, other, gpu.Workload(t, "hog", "--kernel-ms", "1", "--depth", "4", "--duration", "0.3"))
	cmd := gpu.Workload(t, "hog", "--kernel-ms", "1", "--depth", "4", "--duration", "0.3")
	p := testutil.Start(t, sub, cmd)
	pid := cmd.Process.Pid

	held := waitHeld(t, g, 1)
	if held[0].PID != pid || held[0].Gate != g.Slot() || held[0].Since == 0 {
		t.Fatalf("held %+v, want pid %d at gate %d", held[0], pid, g.Slot())
	}
	// The hold is recorded before the stop signal is delivered (on the
	// thread's way back to user space): on a loaded host the stop can
	// follow the record by a scheduling delay.
	for deadline := time.Now().Add(time.Second); !cgroup.Stopped(pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d held but not stopped within 1s", pid)
		}
	}
	if !cgroup.SignalGateOf(pid, held[0].StartTicks).Alive() {
		t.Errorf("held start time %d does not match /proc/%d/stat", held[0].StartTicks, pid)
	}
	// It stays held: nothing more is admitted.
	time.Sleep(200 * time.Millisecond)
	if n, holds, _, err := g.Counts(); err != nil || n != allowed || holds != 1 {
		t.Errorf("admitted %d, holds %d (%v), want %d and 1", n, holds, err, allowed)
	}
	if err := free.Wait(t, 10*time.Second); err != nil {
		t.Errorf("the workload outside the gate: %v", err)
	}

	if err := g.Allow(math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	if forgot, err := g.Forget(held[0]); err != nil || !forgot {
		t.Fatalf("forget the hold: %v, %v", forgot, err)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("released workload: %v: %s", err, p.Stderr)
	}
	launches := byType[*ioctlspy.Launch](c.waitExit(t, pid))
	var flagged []int
	for i, l := range launches {
		if l.Held {
			flagged = append(flagged, i)
		}
	}
	// The held launch is the sixth, and it ran after the release.
	if len(flagged) != 1 || flagged[0] != allowed {
		t.Errorf("held launches at %v of %d, want only index %d", flagged, len(launches), allowed)
	}
	// The held launch is not counted as admitted: whoever releases the
	// process charges it.
	if n, _, _, _ := g.Counts(); n != uint64(len(launches)-1) {
		t.Errorf("admitted %d, launches %d (one held)", n, len(launches))
	}
	for _, l := range byType[*ioctlspy.Launch](c.waitExit(t, free.Cmd.Process.Pid)) {
		if l.Held {
			t.Fatalf("a launch outside the gate was held: %+v", l)
		}
	}
}

// A process gate holds that process wherever its cgroup is; a held process
// that dies leaves the held table.
func TestLaunchGateProcessMemberAndExit(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	probes, _ := startSpy(t, nil, 0)
	leased(t, probes)
	if _, err := probes.AttachLibcuda(testutil.Bin(t, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	g, err := probes.NewLaunchGate()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Allow(0); err != nil {
		t.Fatal(err)
	}
	cmd := gpu.Workload(t, "hog", "--kernel-ms", "1", "--duration", "5")
	// Stop it before its first launch by making it a member at once: it
	// spends milliseconds in setup before launching.
	p := testutil.Start(t, nil, cmd)
	if err := g.SetMembers(nil, []int{cmd.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	held := waitHeld(t, g, 1)
	if held[0].PID != cmd.Process.Pid {
		t.Fatalf("held %+v", held)
	}
	if n, _, _, _ := g.Counts(); n != 0 {
		t.Errorf("admitted %d with an allowance of 0", n)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.Wait(t, 5*time.Second)
	waitHeld(t, g, 0) // the exit tracepoint removed the hold
}

// Issue 18, item 3: a held process that someone else continues (a
// sibling's SIGCONT) runs its held launch; when it next passes the gate,
// the gate charges that launch and counts the escape, and holds it again
// beyond the allowance. The escaped hold is gone: releasing it continues
// nothing.
func TestLaunchGateChargesAnEscapedHold(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	probes, _ := startSpy(t, nil, 0)
	leased(t, probes)
	if _, err := probes.AttachLibcuda(testutil.Bin(t, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	cg := testutil.NewCgroup(t, "escaping")
	g, err := probes.NewLaunchGate()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.SetMembers([]uint64{cg.ID}, nil); err != nil {
		t.Fatal(err)
	}
	const allowed = 3
	if err := g.Allow(allowed); err != nil {
		t.Fatal(err)
	}
	cmd := gpu.Workload(t, "hog", "--kernel-ms", "1", "--depth", "4", "--duration", "2")
	p := testutil.Start(t, cg, cmd)
	pid := cmd.Process.Pid
	first := waitHeld(t, g, 1)[0]
	for !cgroup.Stopped(pid) {
		time.Sleep(time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil { // the sibling
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		held, err := g.Held()
		if err != nil {
			t.Fatal(err)
		}
		if len(held) == 1 && held[0].Since != first.Since {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never held again after the escape: %+v", held)
		}
		time.Sleep(time.Millisecond)
	}
	n, holds, escapes, err := g.Counts()
	if err != nil || n != allowed+1 || holds != 2 || escapes != 1 {
		t.Errorf("admitted %d, holds %d, escapes %d (%v); want %d (the escaped launch charged), 2, 1", n, holds, escapes, err, allowed+1)
	}
	if forgot, err := g.Forget(first); forgot || err != nil {
		t.Errorf("forgetting the escaped hold: %v, %v; want nothing to forget (it would continue the new hold)", forgot, err)
	}
	if err := g.Allow(math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	held := waitHeld(t, g, 1)
	if forgot, err := g.Forget(held[0]); !forgot || err != nil {
		t.Fatalf("forget the current hold: %v, %v", forgot, err)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("released workload: %v: %s", err, p.Stderr)
	}
}
