package enforce

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/cgroup"
)

// Guardian keeps the thaw guardian running: a process outside the daemon's
// session that holds the read end of a pipe and resumes everything the
// daemon may have left stopped (ThawLeftovers) when the pipe closes, that
// is when the daemon exits in any way. One that dies while the daemon runs
// (killed, out of memory) is started again, at most once a second; status
// shows its pid and restarts.
//
// It runs in a cgroup of its own where it can (cgroupDir, made if missing):
// what kills the daemon's whole cgroup — systemd's KillMode=control-group
// after a stop timeout, a container's OOM kill or restart, cgroup.kill —
// does not kill it, and it resumes the tenants then too.
type Guardian struct {
	argv      []string
	log       *slog.Logger
	cgroupDir string // "": the daemon's cgroup

	mu       sync.Mutex
	pipe     *os.File // the write end: closing it ends the guardian
	pid      int
	restarts uint64
	stopped  bool
	exited   chan struct{} // closed when supervision ends after stop
}

// NewGuardian returns the guardian that runs argv (the daemon's own
// binary, in its guard mode) in the cgroup at cgroupDir ("": the daemon's).
func NewGuardian(argv []string, cgroupDir string, log *slog.Logger) *Guardian {
	return &Guardian{argv: argv, cgroupDir: cgroupDir, log: log}
}

// guardianRestartDelay spaces restarts of a guardian that keeps dying.
const guardianRestartDelay = time.Second

// Start starts the guardian and its supervision.
func (g *Guardian) Start() error {
	g.exited = make(chan struct{})
	cmd, err := g.spawn()
	if err != nil {
		return err
	}
	g.log.Info("thaw guardian started", "pid", cmd.Process.Pid, "cgroup", g.where())
	go g.supervise(cmd)
	return nil
}

// where names the guardian's cgroup for logs and status ("" for the
// daemon's).
func (g *Guardian) where() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cgroupDir
}

// spawn starts one guardian process, in its own cgroup where it can, and
// records its pipe and pid.
func (g *Guardian) spawn() (*exec.Cmd, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("guardian pipe: %w", err)
	}
	cmd := g.command(r)
	err = g.startIn(cmd)
	if err != nil && g.where() != "" {
		g.log.Warn("thaw guardian cannot run in its own cgroup: it runs in the daemon's, and dies with it if that cgroup is killed",
			"cgroup", g.where(), "err", err)
		g.mu.Lock()
		g.cgroupDir = ""
		g.mu.Unlock()
		cmd = g.command(r)
		err = cmd.Start()
	}
	if err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start guardian: %w", err)
	}
	r.Close()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped { // stopped while it started: it finds nothing to do and exits
		w.Close()
		return cmd, nil
	}
	g.pipe, g.pid = w, cmd.Process.Pid
	return cmd, nil
}

// command is the guardian's command line, in a session of its own, with
// the pipe's read end r as fd 3.
func (g *Guardian) command(r *os.File) *exec.Cmd {
	cmd := exec.Command(g.argv[0], g.argv[1:]...)
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// startIn starts cmd in the guardian's cgroup (CLONE_INTO_CGROUP), made
// if missing; without one, where the daemon runs.
func (g *Guardian) startIn(cmd *exec.Cmd) error {
	dir := g.where()
	if dir == "" {
		return cmd.Start()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("guardian cgroup: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("guardian cgroup: %w", err)
	}
	defer unix.Close(fd)
	cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	return cmd.Start()
}

// supervise waits for the guardian and starts another while the daemon
// runs.
func (g *Guardian) supervise(cmd *exec.Cmd) {
	defer close(g.exited)
	for {
		err := cmd.Wait()
		g.mu.Lock()
		stopped := g.stopped
		if !stopped {
			_ = g.pipe.Close()
			g.pipe, g.pid = nil, 0
		}
		g.mu.Unlock()
		if stopped {
			return
		}
		g.log.Warn("thaw guardian died; starting another", "pid", cmd.Process.Pid, "err", err)
		time.Sleep(guardianRestartDelay)
		g.mu.Lock()
		stopped = g.stopped
		g.mu.Unlock()
		if stopped {
			return
		}
		next, err := g.spawn()
		if err != nil {
			g.log.Error("thaw guardian not restarted: nothing resumes the tenants if the daemon dies", "err", err)
			return
		}
		g.mu.Lock()
		g.restarts++
		g.mu.Unlock()
		g.log.Info("thaw guardian started", "pid", next.Process.Pid)
		cmd = next
	}
}

// Stop ends the guardian: it finds nothing left to thaw and exits. Its
// own cgroup is removed once it has (waiting at most a second).
func (g *Guardian) Stop() {
	g.mu.Lock()
	g.stopped = true
	if g.pipe != nil {
		_ = g.pipe.Close()
		g.pipe = nil
	}
	dir := g.cgroupDir
	g.mu.Unlock()
	select {
	case <-g.exited:
	case <-time.After(time.Second):
		return
	}
	if dir != "" {
		_ = os.Remove(dir) // fails while another daemon's guardian uses it
	}
}

// State returns the running guardian's pid (0: none), its restarts and
// its cgroup ("" for the daemon's).
func (g *Guardian) State() (pid int, restarts uint64, cgroupDir string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pid, g.restarts, g.cgroupDir
}

// Guard is the thaw guardian's body: it waits until the daemon is gone —
// fd (its pipe) closes, or the daemon process (pid, started at start)
// has exited — and resumes everything it may have left stopped
// (ThawLeftovers). The pid is watched because an exiting process releases
// its files last-in-first-out after every probe link is torn down (each
// uprobe waits for a grace period): the pipe closes up to a second after
// the daemon died, while ThawLeftovers first opens every launch gate, so
// probes still attached hold nobody.
func Guard(fd *os.File, pid int, start uint64, ledger, pinPath string) ([]string, error) {
	closed := make(chan struct{})
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := fd.Read(buf); err != nil {
				close(closed)
				return
			}
		}
	}()
	tick := time.NewTicker(guardPoll)
	defer tick.Stop()
	for !cgroup.Exited(pid, start) {
		select {
		case <-closed:
			return ThawLeftovers(ledger, pinPath)
		case <-tick.C:
		}
	}
	return ThawLeftovers(ledger, pinPath)
}

// guardPoll is how often the guardian looks at the daemon's process.
const guardPoll = 10 * time.Millisecond
