// Package testutil holds what gpuarb's privileged and end-to-end tests share:
// the root gate (skip locally, fail under CI=true), test cgroups under a
// dedicated parent, the built binaries, and processes started in a cgroup
// that are ended by PID when the test ends.
package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
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
type Cgroup struct {
	Path string // absolute path under the v2 mount
	Rel  string // path as in /proc/PID/cgroup
	ID   uint64
}

// NewCgroup creates a cgroup under the test parent, removed at cleanup
// (after the test's processes have been ended).
func NewCgroup(t testing.TB, name string) *Cgroup {
	t.Helper()
	Privileged(t)
	root, err := cgroup.UnifiedMount()
	if err != nil {
		t.Fatal(err)
	}
	parent := filepath.Join(root, TestParent)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(parent, name+"-")
	if err != nil {
		t.Fatal(err)
	}
	id, err := cgroup.ID(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		removeCgroup(t, dir)
		_ = os.Remove(parent) // fails while other tests use it, which is fine
	})
	return &Cgroup{Path: dir, Rel: strings.TrimPrefix(dir, root), ID: id}
}

// removeCgroup removes a test cgroup, retrying while its processes end
// (they do so asynchronously after SIGKILL).
func removeCgroup(t testing.TB, dir string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := os.Remove(dir)
		if err == nil || os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("remove test cgroup %s: %v", dir, err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Sub creates the cgroup rel (one or more levels) below c, removed at
// cleanup before c.
func (c *Cgroup) Sub(t testing.TB, rel string) *Cgroup {
	t.Helper()
	dir := filepath.Join(c.Path, rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	id, err := cgroup.ID(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for d := dir; d != c.Path; d = filepath.Dir(d) {
			removeCgroup(t, d)
		}
	})
	return &Cgroup{Path: dir, Rel: filepath.Join(c.Rel, rel), ID: id}
}

// Proc is a process a test started; it is ended by PID at cleanup.
type Proc struct {
	Cmd    *exec.Cmd
	Stdout *bytes.Buffer
	Stderr *bytes.Buffer
	done   chan struct{}
	err    error
}

// Start starts cmd (in cg when not nil: CLONE_INTO_CGROUP) and registers
// its end at cleanup.
func Start(t testing.TB, cg *Cgroup, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{Cmd: cmd, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, done: make(chan struct{})}
	if cmd.Stdout == nil {
		cmd.Stdout = p.Stdout
	}
	if cmd.Stderr == nil {
		cmd.Stderr = p.Stderr
	}
	if cg != nil {
		fd, err := syscall.Open(cg.Path, syscall.O_DIRECTORY|syscall.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Wait waits up to timeout for the process to exit and returns its error.
func (p *Proc) Wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s; stderr: %s", p.Cmd.Path, timeout, p.Stderr)
		return nil
	}
}

// Done reports whether the process has exited.
func (p *Proc) Done() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
