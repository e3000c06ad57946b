// Package testutil holds what gpuarb's privileged and end-to-end tests share:
// the root gate (skip locally, fail under CI=true), test cgroups under a
// dedicated parent, the built binaries, and processes started in a cgroup
// that are ended by PID when the test ends.
package testutil

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/lab"
)

// TestParent is the cgroup under which every test cgroup is created.
const TestParent = "gpuarb-test"

// Privileged skips a test that needs root, or fails it when CI=true: a
// skipped privileged test must never look green in CI.
func Privileged(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("privileged test needs root and CI=true forbids skipping it")
	}
	t.Skip("needs root")
}

// RepoRoot returns the repository root (the directory holding go.mod).
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

var buildOnce sync.Once
var buildErr error

// Bin returns the path of a built binary (gpuarb, fakegpud, gpuwork,
// libcuda.so.1), running `make build` once per test binary so the tests
// always exercise the current sources. GPUARB_BIN names a prebuilt dir.
func Bin(t testing.TB, name string) string {
	t.Helper()
	if dir := os.Getenv("GPUARB_BIN"); dir != "" {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("GPUARB_BIN=%s has no %s: run make build", dir, name)
		}
		return p
	}
	root := RepoRoot(t)
	buildOnce.Do(func() {
		out, err := exec.Command("make", "-C", root, "build").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("make build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(root, "bin", name)
}

// Cgroup is a cgroup v2 directory a test created.
type Cgroup = lab.Cgroup

// NewCgroup creates a cgroup under the test parent, removed at cleanup
// (after the test's processes have been ended).
func NewCgroup(t testing.TB, name string) *Cgroup {
	t.Helper()
	Privileged(t)
	cg, err := lab.NewCgroup(TestParent, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.RemoveCgroup(cg.Path); err != nil {
			t.Error(err)
		}
		_ = os.Remove(filepath.Dir(cg.Path))                // fails while other tests use it, which is fine
		if err := lab.RemoveV1Mirrors(cg.Rel); err != nil { // runc's, on a hybrid host
			t.Error(err)
		}
	})
	return cg
}

// Sub creates the cgroup rel (one or more levels) below c, removed at
// cleanup before c.
func Sub(t testing.TB, c *Cgroup, rel string) *Cgroup {
	t.Helper()
	sub, err := c.Sub(rel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.RemoveBelow(sub.Path); err != nil {
			t.Error(err)
		}
	})
	return sub
}

// Proc is a process a test started; it is ended by PID when the test ends.
type Proc struct{ *lab.Proc }

// Start starts cmd (in cg when not nil: CLONE_INTO_CGROUP) and registers
// its end at cleanup.
func Start(t testing.TB, cg *Cgroup, cmd *exec.Cmd) *Proc {
	t.Helper()
	dir := ""
	if cg != nil {
		dir = cg.Path
	}
	p, err := lab.Start(cmd, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return &Proc{p}
}

// Wait waits up to timeout for the process to exit and returns its error;
// a process still running then fails the test.
func (p *Proc) Wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	err := p.Proc.Wait(timeout)
	if errors.Is(err, lab.ErrTimeout) {
		_, stderr := p.Output()
		t.Fatalf("%v; stderr: %s", err, stderr)
	}
	return err
}

// ReadPIDFile waits up to timeout for a process the test started
// indirectly (a double fork, a daemonized child) to write its pid to path,
// and returns it; none by then fails the test.
func ReadPIDFile(t testing.TB, path string, timeout time.Duration) int {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		data, _ := os.ReadFile(path)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid in %s after %v", path, timeout)
		}
	}
}
