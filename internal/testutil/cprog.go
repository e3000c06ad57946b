package testutil

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BuildC compiles internal/testutil/testdata/NAME.c, a helper program
// some tests need (a fork storm, an unfreezable process), with cc into a
// temporary directory and returns its path.
func BuildC(t testing.TB, name string) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), name)
	src := filepath.Join(RepoRoot(t), "internal/testutil/testdata", name+".c")
	if out, err := exec.Command("cc", "-O2", "-Wall", "-o", exe, src).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	return exe
}

// StartUnfreezable starts, in cg, a process the cgroup freezer cannot
// freeze (testdata/unfreezable.c: it waits on a userfaultfd fault nobody
// answers) and returns once it is blocked; it is killed by PID at cleanup.
func StartUnfreezable(t testing.TB, cg *Cgroup) *Proc {
	t.Helper()
	cmd := exec.Command(BuildC(t, "unfreezable"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := Start(t, cg, cmd)
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- strings.TrimSpace(line)
	}()
	select {
	case line := <-ready:
		if line != "ready" {
			_, stderr := p.Output()
			t.Fatalf("unfreezable: %q: %s", line, stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("unfreezable: not ready in 10 s")
	}
	time.Sleep(50 * time.Millisecond) // into the read
	return p
}
