package cgroup_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

// busy starts a CPU-bound shell loop in cg.
func busy(t *testing.T, cg *testutil.Cgroup, script string) *testutil.Proc {
	t.Helper()
	return testutil.Start(t, cg, exec.Command("sh", "-c", script))
}

// cpuTicks reads a process's utime+stime.
func cpuTicks(t *testing.T, pid int) uint64 {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	u, _ := strconv.ParseUint(f[11], 10, 64)
	s, _ := strconv.ParseUint(f[12], 10, 64)
	return u + s
}

// runs reports whether the process used CPU during d.
func runs(t *testing.T, pid int, d time.Duration) bool {
	before := cpuTicks(t, pid)
	time.Sleep(d)
	return cpuTicks(t, pid) > before
}

func TestV2Gate(t *testing.T) {
	cg := testutil.NewCgroup(t, "freeze")
	p := busy(t, cg, "while :; do :; done")
	mount, _ := cgroup.UnifiedMount()
	g, err := cgroup.NewV2Gate(mount, cg.Rel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Thaw() }) // before the process is killed
	start := time.Now()
	if err := g.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Logf("freeze confirmed in %v", time.Since(start))
	if f, _ := cgroup.V2Frozen(cg.Path); !f {
		t.Fatal("cgroup.events does not say frozen 1")
	}
	if runs(t, p.Cmd.Process.Pid, 300*time.Millisecond) {
		t.Error("a frozen process used CPU")
	}
	if err := g.Thaw(); err != nil {
		t.Fatal(err)
	}
	if f, _ := cgroup.V2Frozen(cg.Path); f {
		t.Error("still frozen after Thaw")
	}
	if !runs(t, p.Cmd.Process.Pid, 300*time.Millisecond) {
		t.Error("a thawed process did not run")
	}
	if tg := g.Target(); tg.Kind != cgroup.KindV2 || tg.Path != cg.Path {
		t.Errorf("target %+v", tg)
	}
}

// Issue 18, item 11: a freeze the kernel never confirms (a task waiting
// where no freeze reaches it, beside a busy one) fails after FreezeTimeout
// with ErrNotFrozen and is undone: the cgroup is thawed and the busy
// process runs on.
func TestV2FreezeNotConfirmedIsUndone(t *testing.T) {
	cg := testutil.NewCgroup(t, "unfreezable")
	p := busy(t, cg, "while :; do :; done")
	testutil.StartUnfreezable(t, cg)
	mount, _ := cgroup.UnifiedMount()
	g, err := cgroup.NewV2Gate(mount, cg.Rel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Thaw() })
	start := time.Now()
	err = g.Freeze()
	took := time.Since(start)
	t.Logf("freeze: %v after %v", err, took)
	if !errors.Is(err, cgroup.ErrNotFrozen) || took < cgroup.FreezeTimeout || took > cgroup.FreezeTimeout+time.Second {
		t.Fatalf("freeze: %v after %v; want ErrNotFrozen after %v", err, took, cgroup.FreezeTimeout)
	}
	if data, _ := os.ReadFile(filepath.Join(cg.Path, "cgroup.freeze")); strings.TrimSpace(string(data)) != "0" {
		t.Errorf("cgroup.freeze %q after the failed freeze, want 0 (undone)", data)
	}
	if !runs(t, p.Cmd.Process.Pid, 300*time.Millisecond) {
		t.Error("the busy process does not run after the failed freeze")
	}
}

func TestV1Gate(t *testing.T) {
	testutil.Privileged(t)
	if !cgroup.DetectMode().V1Freezer {
		testutil.Missing(t, "a v1 freezer hierarchy at "+cgroup.V1FreezerMount)
	}
	parent := filepath.Join(cgroup.V1FreezerMount, testutil.TestParent)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(parent, "v1-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 250 && os.Remove(dir) != nil; i++ {
			time.Sleep(20 * time.Millisecond)
		}
		_ = os.Remove(parent)
	})
	p := busy(t, nil, "while :; do :; done")
	pid := p.Cmd.Process.Pid
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatal(err)
	}
	g, err := cgroup.NewV1Gate(strings.TrimPrefix(dir, cgroup.V1FreezerMount))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Thaw() })
	if err := g.Freeze(); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.ReadFile(filepath.Join(dir, "freezer.state")); strings.TrimSpace(string(st)) != "FROZEN" {
		t.Fatalf("freezer.state %q", st)
	}
	if runs(t, pid, 300*time.Millisecond) {
		t.Error("a frozen process used CPU")
	}
	if err := g.Thaw(); err != nil {
		t.Fatal(err)
	}
	if !runs(t, pid, 300*time.Millisecond) {
		t.Error("a thawed process did not run")
	}
}

func TestSignalGate(t *testing.T) {
	testutil.Privileged(t)
	// A parent loop with a child loop: both must stop.
	p := busy(t, nil, `sh -c 'while :; do :; done' & while :; do :; done`)
	pid := p.Cmd.Process.Pid
	var child int
	for i := 0; i < 100 && child == 0; i++ {
		data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
		if f := strings.Fields(string(data)); len(f) > 0 {
			child, _ = strconv.Atoi(f[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if child == 0 {
		t.Fatal("no child process")
	}
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	g, err := cgroup.NewSignalGate(pid, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Thaw() })
	if err := g.Freeze(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if !cgroup.Stopped(pid) || !cgroup.Stopped(child) {
		t.Fatalf("stopped: parent %v child %v", cgroup.Stopped(pid), cgroup.Stopped(child))
	}
	if err := g.Thaw(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if cgroup.Stopped(pid) || cgroup.Stopped(child) {
		t.Fatal("still stopped after Thaw")
	}
	// A gate rebuilt with another start time (a reused pid) signals nothing.
	tg := g.Target()
	stale := cgroup.SignalGateOf(tg.PID, tg.Start+1)
	if err := stale.Freeze(); err == nil || cgroup.Stopped(pid) {
		t.Errorf("stale gate stopped pid %d (err %v)", pid, err)
	}
}

func TestRefusals(t *testing.T) {
	for _, rel := range []string{"/", "/system.slice", "/init.scope", "/user.slice/"} {
		if err := cgroup.CheckFreezable(rel, ""); err == nil {
			t.Errorf("%s accepted", rel)
		}
	}
	if err := cgroup.CheckFreezable("/a/b", "/a/b/c"); !errors.Is(err, cgroup.ErrHoldsGpuarb) {
		t.Errorf("an ancestor of gpuarb's own cgroup: %v", err)
	}
	if err := cgroup.CheckFreezable("/a/b", "/a/b"); !errors.Is(err, cgroup.ErrHoldsGpuarb) {
		t.Errorf("gpuarb's own cgroup: %v", err)
	}
	if err := cgroup.CheckFreezable("/", ""); errors.Is(err, cgroup.ErrHoldsGpuarb) {
		t.Errorf("the root refused as gpuarb's own: %v", err)
	}
	if err := cgroup.CheckFreezable("/a/bc", "/a/b"); err != nil {
		t.Errorf("a sibling refused: %v", err)
	}
	for _, pid := range []int{0, 1, os.Getpid(), os.Getppid()} {
		if _, err := cgroup.NewSignalGate(pid, nil, nil); err == nil {
			t.Errorf("pid %d accepted", pid)
		}
	}
	if own, err := cgroup.ProcessPath(os.Getpid()); err == nil && own != "/" {
		mount, _ := cgroup.UnifiedMount()
		if _, err := cgroup.NewV2Gate(mount, own); err == nil {
			t.Errorf("own cgroup %s accepted", own)
		}
	}
}

func TestLedgerThawAll(t *testing.T) {
	cg := testutil.NewCgroup(t, "ledger")
	p := busy(t, cg, "while :; do :; done")
	bare := busy(t, nil, "while :; do :; done")
	mount, _ := cgroup.UnifiedMount()
	v2, err := cgroup.NewV2Gate(mount, cg.Rel)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := cgroup.NewSignalGate(bare.Cmd.Process.Pid, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v2.Thaw(); _ = sig.Thaw() })
	path := filepath.Join(t.TempDir(), "gated.json")
	l, err := cgroup.OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	gone := cgroup.Target{Kind: cgroup.KindV2, Path: filepath.Join(mount, testutil.TestParent, "no-such-cgroup")}
	for _, tg := range []cgroup.Target{v2.Target(), sig.Target(), gone} {
		if err := l.Add(tg); err != nil {
			t.Fatal(err)
		}
	}
	if err := v2.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := sig.Freeze(); err != nil {
		t.Fatal(err)
	}
	// Another reader (the guardian, `gpuarb thaw --all`) sees the file.
	l2, err := cgroup.OpenLedger(path)
	if err != nil || len(l2.Targets()) != 3 {
		t.Fatalf("reopened ledger: %v %v", l2.Targets(), err)
	}
	thawed, err := cgroup.ThawAll(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(thawed) != 2 {
		t.Errorf("thawed %v, want the cgroup and the pid", thawed)
	}
	if f, _ := cgroup.V2Frozen(cg.Path); f {
		t.Error("cgroup still frozen")
	}
	time.Sleep(50 * time.Millisecond)
	if cgroup.Stopped(bare.Cmd.Process.Pid) || !runs(t, p.Cmd.Process.Pid, 100*time.Millisecond) {
		t.Error("not running after ThawAll")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ledger kept after every thaw succeeded: %v", err)
	}
	if err := l.Remove(gone); err != nil || len(l.Targets()) != 2 {
		t.Errorf("remove: %v %v", l.Targets(), err)
	}
}

// Issue 18, item 8: the ledger is kept until every thaw succeeded: a
// target that cannot be thawed stays listed for the next try, the others
// leave it.
func TestLedgerKeepsWhatFailedToThaw(t *testing.T) {
	cg := testutil.NewCgroup(t, "ledger")
	mount, _ := cgroup.UnifiedMount()
	v2, err := cgroup.NewV2Gate(mount, cg.Rel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v2.Thaw() })
	if err := v2.Freeze(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "gated.json")
	l, err := cgroup.OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	broken := cgroup.Target{Kind: cgroup.KindV1, Path: "/not/a/freezer/cgroup"} // cannot be thawed
	for _, tg := range []cgroup.Target{v2.Target(), broken} {
		if err := l.Add(tg); err != nil {
			t.Fatal(err)
		}
	}
	thawed, err := cgroup.ThawAll(path)
	if err == nil || len(thawed) != 1 || thawed[0] != v2.Target() {
		t.Fatalf("ThawAll: %v, %v; want the cgroup thawed and an error for the other", thawed, err)
	}
	if f, _ := cgroup.V2Frozen(cg.Path); f {
		t.Error("cgroup still frozen")
	}
	left, err := cgroup.ReadLedger(path)
	if err != nil || len(left) != 1 || left[0] != broken {
		t.Errorf("ledger after a failed thaw lists %v (%v), want only the target that failed", left, err)
	}
}

// ContinueProcess resumes exactly one stopped process, and not a process
// that reuses its pid; Exited sees a process end (zombie, not yet reaped).
func TestContinueProcessAndExited(t *testing.T) {
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	start, err := cgroup.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	if cgroup.Exited(pid, start) {
		t.Fatal("a running process reads as exited")
	}
	if !cgroup.Exited(pid, start+1) {
		t.Error("another start time (a reused pid) reads as the same process")
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for !cgroup.Stopped(pid) {
		time.Sleep(time.Millisecond)
	}
	if err := cgroup.ContinueProcess(pid, start+1); err != nil || !cgroup.Stopped(pid) {
		t.Errorf("continued a process by a stale start time: %v", err)
	}
	if err := cgroup.ContinueProcess(pid, start); err != nil {
		t.Fatal(err)
	}
	if !runs(t, pid, 100*time.Millisecond) {
		t.Error("not running after ContinueProcess")
	}
	if err := cgroup.ContinueProcess(1, 0); err == nil {
		t.Error("ContinueProcess accepted pid 1")
	}
	_ = cmd.Process.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for !cgroup.Exited(pid, start) { // a zombie until Wait reaps it
		if time.Now().After(deadline) {
			t.Fatal("a killed process never reads as exited")
		}
		time.Sleep(time.Millisecond)
	}
}

// A gate never undoes a freeze or stop it did not make (`docker pause`, an
// operator's freeze, Ctrl-Z): it leaves such a tenant as it found it. What
// it froze itself, even twice over, its thaw resumes.
func TestGatesLeaveSomeoneElsesFreeze(t *testing.T) {
	testutil.Privileged(t)
	t.Run("v2", func(t *testing.T) {
		cg := testutil.NewCgroup(t, "theirs")
		pid := busy(t, cg, "while :; do :; done").Cmd.Process.Pid
		mount, _ := cgroup.UnifiedMount()
		g, err := cgroup.NewV2Gate(mount, cg.Rel)
		if err != nil {
			t.Fatal(err)
		}
		freezeFile := filepath.Join(cg.Path, "cgroup.freeze")
		t.Cleanup(func() { _ = os.WriteFile(freezeFile, []byte("0"), 0) })
		if err := os.WriteFile(freezeFile, []byte("1"), 0); err != nil { // docker pause
			t.Fatal(err)
		}
		for i := 0; i < 500; i++ { // the kernel confirms it in cgroup.events
			if f, _ := cgroup.V2Frozen(cg.Path); f {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err := g.Freeze(); err != nil {
			t.Fatal(err)
		}
		if err := g.Thaw(); err != nil {
			t.Fatal(err)
		}
		if f, _ := cgroup.V2Frozen(cg.Path); !f || runs(t, pid, 300*time.Millisecond) {
			t.Error("the gate's thaw undid someone else's freeze")
		}
		if err := os.WriteFile(freezeFile, []byte("0"), 0); err != nil { // docker unpause
			t.Fatal(err)
		}
		for range 2 { // its own freeze, asked twice
			if err := g.Freeze(); err != nil {
				t.Fatal(err)
			}
		}
		if err := g.Thaw(); err != nil {
			t.Fatal(err)
		}
		if f, _ := cgroup.V2Frozen(cg.Path); f || !runs(t, pid, 300*time.Millisecond) {
			t.Error("the gate's thaw did not undo its own freeze")
		}
	})
	t.Run("signal", func(t *testing.T) {
		// A tree of a parent and two children; one child was stopped by
		// someone else before the gate stops the tree.
		p := busy(t, nil, `sh -c 'while :; do :; done' & sh -c 'while :; do :; done' & while :; do :; done`)
		pid := p.Cmd.Process.Pid
		var kids []int
		for i := 0; i < 100 && len(kids) < 2; i++ {
			data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
			kids = kids[:0]
			for _, f := range strings.Fields(string(data)) {
				k, _ := strconv.Atoi(f)
				kids = append(kids, k)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if len(kids) < 2 {
			t.Fatalf("children %v", kids)
		}
		for _, k := range kids {
			t.Cleanup(func() { _ = syscall.Kill(k, syscall.SIGKILL) })
		}
		theirs, other := kids[0], kids[1]
		if err := syscall.Kill(theirs, syscall.SIGSTOP); err != nil { // Ctrl-Z
			t.Fatal(err)
		}
		// The stop lands when the child next runs: the wait guards
		// against a host that does not run it, and is generous for that.
		for deadline := time.Now().Add(10 * time.Second); !cgroup.Stopped(theirs); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d not stopped 10 s after its SIGSTOP", theirs)
			}
		}
		g, err := cgroup.NewSignalGate(pid, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Freeze(); err != nil {
			t.Fatal(err)
		}
		// SIGSTOP takes effect when the child next returns to user space
		// (on a busy VM its vCPU may not run for a while), and the CPU time
		// of its last run is accounted when it is switched out.
		for i := 0; i < 200 && !cgroup.Stopped(other); i++ {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond) // 'T' shows before it is switched out
		if !cgroup.Stopped(other) || runs(t, other, 200*time.Millisecond) {
			t.Error("a process the gate stopped used CPU")
		}
		if err := g.Thaw(); err != nil {
			t.Fatal(err)
		}
		if !runs(t, other, 300*time.Millisecond) || !runs(t, pid, 300*time.Millisecond) {
			t.Error("the gate's thaw did not resume what it stopped")
		}
		if !cgroup.Stopped(theirs) || runs(t, theirs, 200*time.Millisecond) {
			t.Error("the gate's thaw resumed a process someone else had stopped")
		}
	})
}

// Issue 56, item 12: a signal gate stops the tree its members function
// lists (the daemon's: every process forked below the root) and records
// each process in the ledger, by pid and start time, before it stops it.
// A process whose parent is killed while it is stopped (reparented, below
// the root no more) is continued all the same: by the gate's thaw, and by
// a ThawAll of the ledger (the guardian's) had the gate never thawed. A
// walk of /proc below the root missed it, and it stayed stopped.
func TestSignalGateContinuesReparentedProcesses(t *testing.T) {
	for _, byGuardian := range []bool{false, true} {
		pidFile := filepath.Join(t.TempDir(), "child")
		root := busy(t, nil, `sh -c 'sh -c "while :; do :; done" & echo $! > `+pidFile+`; wait' & while :; do sleep 1; done`)
		child := testutil.ReadPIDFile(t, pidFile, 5*time.Second)
		childStart, err := cgroup.StartTime(child)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // by pid and start time: ours, reparented away from the test
			if !cgroup.Exited(child, childStart) {
				_ = syscall.Kill(child, syscall.SIGKILL)
			}
		})
		tree := cgroup.Descendants(root.Cmd.Process.Pid)
		parent := 0
		for _, p := range tree {
			if p != child && p != root.Cmd.Process.Pid {
				data, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/task/" + strconv.Itoa(p) + "/children")
				if strings.Contains(" "+string(data), " "+strconv.Itoa(child)+" ") {
					parent = p
				}
			}
		}
		if parent == 0 {
			t.Fatalf("no parent of %d in %v", child, tree)
		}
		ledgerPath := filepath.Join(t.TempDir(), "gated.json")
		l, err := cgroup.OpenLedger(ledgerPath)
		if err != nil {
			t.Fatal(err)
		}
		g, err := cgroup.NewSignalGate(root.Cmd.Process.Pid, func() []int { return tree }, l)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Freeze(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(time.Second); !cgroup.Stopped(child); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the child was not stopped")
			}
		}
		if err := syscall.Kill(parent, syscall.SIGKILL); err != nil { // ours: the test's shell started it
			t.Fatal(err)
		}
		for deadline := time.Now().Add(time.Second); slices.Contains(cgroup.Descendants(root.Cmd.Process.Pid), child); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the child was not reparented")
			}
		}
		if byGuardian {
			_, err = cgroup.ThawAll(ledgerPath)
		} else {
			err = g.Thaw()
		}
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if cgroup.Stopped(child) {
			t.Errorf("guardian %v: the reparented child is still stopped", byGuardian)
		}
		if left, err := cgroup.ReadLedger(ledgerPath); err != nil || len(left) != 0 {
			t.Errorf("guardian %v: the ledger still lists %v (%v)", byGuardian, left, err)
		}
		_ = g.Thaw()
	}
}
