package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
)

// guardian keeps the thaw guardian running: a process outside the daemon's
// session that holds the read end of a pipe and resumes everything the
// daemon may have left stopped (ThawLeftovers) when the pipe closes, that
// is when the daemon exits in any way. One that dies while the daemon runs
// (killed, out of memory) is started again, at most once a second; status
// shows its pid and restarts.
type guardian struct {
	argv []string
	log  *slog.Logger

	mu       sync.Mutex
	pipe     *os.File // the write end: closing it ends the guardian
	pid      int
	restarts uint64
	stopped  bool
}

// guardianRestartDelay spaces restarts of a guardian that keeps dying.
const guardianRestartDelay = time.Second

// start starts the guardian and its supervision.
func (g *guardian) start() error {
	cmd, err := g.spawn()
	if err != nil {
		return err
	}
	g.log.Info("thaw guardian started", "pid", cmd.Process.Pid)
	go g.supervise(cmd)
	return nil
}

// spawn starts one guardian process and records its pipe and pid.
func (g *guardian) spawn() (*exec.Cmd, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("guardian pipe: %w", err)
	}
	cmd := exec.Command(g.argv[0], g.argv[1:]...)
	cmd.ExtraFiles = []*os.File{r} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
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

// supervise waits for the guardian and starts another while the daemon
// runs.
func (g *guardian) supervise(cmd *exec.Cmd) {
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

// stop ends the guardian: it finds nothing left to thaw and exits.
func (g *guardian) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped = true
	if g.pipe != nil {
		_ = g.pipe.Close()
		g.pipe = nil
	}
}

// state returns the running guardian's pid (0: none) and its restarts.
func (g *guardian) state() (pid int, restarts uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pid, g.restarts
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
