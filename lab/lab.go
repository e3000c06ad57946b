// Package lab runs gpuarb on the simulated GPU the way the demo, the
// benchmarks and the end-to-end tests need it: the simulated GPU
// (fakegpud), the daemon, tenants as processes in their own cgroups or
// as runc containers attached by the OCI hook, and the ground truth they
// are measured against. Everything it starts is ended by PID and every
// cgroup it makes is removed, in reverse order, by Cleanups.Run; it never
// signals anything it did not start.
package lab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
)

// ErrTimeout is returned when a process or service does not reach the
// awaited state in time.
var ErrTimeout = errors.New("timed out")

// Cleanups is a stack of undo steps, run newest first.
type Cleanups struct {
	mu  sync.Mutex
	fns []func()
}

// Add pushes an undo step.
func (c *Cleanups) Add(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fns = append(c.fns, fn)
}

// Run runs the undo steps, newest first, and forgets them.
func (c *Cleanups) Run() {
	c.mu.Lock()
	fns := c.fns
	c.fns = nil
	c.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// Proc is a process the lab started. Stdout and Stderr may be read once
// it has exited; Output reads them while it runs.
type Proc struct {
	Cmd    *exec.Cmd
	Stdout *bytes.Buffer
	Stderr *bytes.Buffer
	mu     sync.Mutex // guards the buffers while the process writes
	done   chan struct{}
	err    error
}

// Start starts cmd, in the cgroup directory cg when it is not empty
// (CLONE_INTO_CGROUP: the process never runs outside it). Output not
// redirected by the caller is kept in Stdout and Stderr.
func Start(cmd *exec.Cmd, cg string) (*Proc, error) {
	p := &Proc{Cmd: cmd, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, done: make(chan struct{})}
	if cmd.Stdout == nil {
		cmd.Stdout = &lockedWriter{mu: &p.mu, buf: p.Stdout}
	}
	if cmd.Stderr == nil {
		cmd.Stderr = &lockedWriter{mu: &p.mu, buf: p.Stderr}
	}
	if cg != "" {
		fd, err := syscall.Open(cg, syscall.O_DIRECTORY|syscall.O_RDONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("open cgroup %s: %w", cg, err)
		}
		defer syscall.Close(fd)
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// lockedWriter lets a buffer be read while the process writes to it.
type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(b)
}

// Output returns what the process has written so far.
func (p *Proc) Output() (stdout, stderr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.Stdout.String(), p.Stderr.String()
}

// Wait waits up to timeout for the process to exit and returns its error,
// or ErrTimeout.
func (p *Proc) Wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		return fmt.Errorf("%s did not exit within %v: %w", p.Cmd.Path, timeout, ErrTimeout)
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

// Stop ends the process by its PID (SIGKILL) unless it has exited, and
// waits for it.
func (p *Proc) Stop() {
	if !p.Done() {
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Interrupt asks the process to stop (SIGINT) and waits up to timeout,
// then ends it.
func (p *Proc) Interrupt(timeout time.Duration) {
	if !p.Done() {
		_ = p.Cmd.Process.Signal(os.Interrupt)
	}
	if p.Wait(timeout) != nil && !p.Done() {
		p.Stop()
	}
}

// Cgroup is a cgroup v2 directory the lab created.
type Cgroup struct {
	Path string // absolute path under the v2 mount
	Rel  string // path as in /proc/PID/cgroup
	ID   uint64
}

// NewCgroup creates a cgroup with a unique name starting with name under
// parent (a path as in /proc/PID/cgroup, created when missing).
func NewCgroup(parent, name string) (*Cgroup, error) {
	root, err := cgroup.UnifiedMount()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, parent)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", dir, err)
	}
	path, err := os.MkdirTemp(dir, name+"-")
	if err != nil {
		return nil, fmt.Errorf("create cgroup under %s: %w", dir, err)
	}
	return cgroupAt(root, path)
}

// Sub creates the cgroup rel (one or more levels) below c.
func (c *Cgroup) Sub(rel string) (*Cgroup, error) {
	path := filepath.Join(c.Path, rel)
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", path, err)
	}
	return cgroupAt(strings.TrimSuffix(c.Path, c.Rel), path)
}

func cgroupAt(root, path string) (*Cgroup, error) {
	id, err := cgroup.ID(path)
	if err != nil {
		return nil, err
	}
	return &Cgroup{Path: path, Rel: strings.TrimPrefix(path, root), ID: id}, nil
}

// RemoveCgroup removes a cgroup directory, retrying while its processes
// end (they do so asynchronously after SIGKILL); a missing one is fine.
func RemoveCgroup(dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := os.Remove(dir)
		if err == nil || os.IsNotExist(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RemoveTree removes a cgroup and every cgroup below it (a runtime may
// have made some), deepest first, and the same path in the v1 hierarchies
// of a hybrid host, where runc makes a container's cgroup (and the parents
// it needs) in every one.
func RemoveTree(dir string) error {
	err := removeTree(dir)
	if root, rerr := cgroup.UnifiedMount(); rerr == nil && strings.HasPrefix(dir, root+"/") {
		err = errors.Join(err, RemoveV1Mirrors(strings.TrimPrefix(dir, root)))
	}
	return err
}

// RemoveV1Mirrors removes the cgroup rel (as in /proc/PID/cgroup) and the
// cgroups below it from every cgroup v1 hierarchy mounted at its root, and
// rel's parent where that is left empty. Missing ones are fine.
func RemoveV1Mirrors(rel string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("cgroup v1 hierarchies: %w", err)
	}
	var errs []error
	for _, line := range strings.Split(string(data), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 || g[0] != "cgroup" || f[3] != "/" {
			continue
		}
		dir := filepath.Join(f[4], rel)
		errs = append(errs, removeTree(dir))
		_ = os.Remove(filepath.Dir(dir)) // the shared parent, once empty
	}
	return errors.Join(errs...)
}

func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			errs = append(errs, removeTree(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(append(errs, RemoveCgroup(dir))...)
}

// RemoveBelow removes dir and the cgroups below c.Path down to dir (for a
// cgroup made with Sub), deepest first.
func (c *Cgroup) RemoveBelow(dir string) error {
	var errs []error
	for d := dir; strings.HasPrefix(d, c.Path+"/"); d = filepath.Dir(d) {
		errs = append(errs, RemoveCgroup(d))
	}
	return errors.Join(errs...)
}

// CPUTime returns the user and system CPU time process pid has used, all
// its threads together.
func CPUTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu time of %d: %w", pid, err)
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("cpu time of %d: short stat %q", pid, data)
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("cpu time of %d: %w", pid, err)
	}
	return time.Duration((u + st) * uint64(time.Second) / 100), nil // USER_HZ ticks
}
