package cgroup

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// SignalGate stops a bare process and its descendants with SIGSTOP and
// resumes them with SIGCONT, for tenants attached by pid. The process is
// identified by pid and start time, so a reused pid is never signalled.
//
// Processes already stopped when it stops the tree (a shell's Ctrl-Z, a
// debugger) were stopped by someone else: it leaves them stopped at its
// thaw. (One stopped while the gate holds the tree cannot be told from
// its own stop: the thaw resumes it.)
type SignalGate struct {
	pid   int
	start uint64
	mu    sync.Mutex
	// theirs are the processes stopped by someone else at the last
	// Freeze, by pid and start time.
	theirs map[int]uint64
}

// NewSignalGate returns the gate of a process tree, refusing PID 1, gpuarb
// itself and its ancestors.
func NewSignalGate(pid int) (*SignalGate, error) {
	if pid <= 1 {
		return nil, fmt.Errorf("refusing to stop pid %d", pid)
	}
	for p := os.Getpid(); p > 1; {
		if p == pid {
			return nil, fmt.Errorf("refusing to stop pid %d: gpuarb itself or its ancestor", pid)
		}
		st, err := readStat(p)
		if err != nil {
			break
		}
		p = st.ppid
	}
	st, err := readStat(pid)
	if err != nil {
		return nil, err
	}
	return &SignalGate{pid: pid, start: st.start}, nil
}

// SignalGateOf rebuilds a gate from a ledger entry.
func SignalGateOf(pid int, start uint64) *SignalGate { return &SignalGate{pid: pid, start: start} }

// Freeze sends SIGSTOP to the process and every descendant not already
// stopped.
func (g *SignalGate) Freeze() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.theirs = map[int]uint64{}
	return g.signal(syscall.SIGSTOP, func(p int, st procStat) bool {
		if st.state == 'T' || st.state == 't' {
			g.theirs[p] = st.start
			return false
		}
		return true
	})
}

// Thaw sends SIGCONT to the process and every descendant, but those
// someone else had stopped before Freeze.
func (g *SignalGate) Thaw() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	theirs := g.theirs
	g.theirs = nil
	return g.signal(syscall.SIGCONT, func(p int, st procStat) bool {
		start, ok := theirs[p]
		return !ok || start != st.start
	})
}

// ContinueProcess sends SIGCONT to one process (not its descendants) if it
// is still the one that started at start (clock ticks since boot, as in
// /proc/PID/stat): the release of a process gpuarb's launch gate stopped.
// A process that is gone is not an error.
func ContinueProcess(pid int, start uint64) error {
	if pid <= 1 {
		return fmt.Errorf("refusing to signal pid %d", pid)
	}
	if !SignalGateOf(pid, start).Alive() {
		return nil
	}
	if err := unix.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("continue pid %d: %w", pid, err)
	}
	return nil
}

// Target implements Gate.
func (g *SignalGate) Target() Target { return Target{Kind: KindPID, PID: g.pid, Start: g.start} }

// Alive tells whether the process still exists (same pid, same start).
func (g *SignalGate) Alive() bool {
	st, err := readStat(g.pid)
	return err == nil && st.start == g.start
}

// signal sends sig to the tree's processes that pick, given each one's
// stat, chooses.
func (g *SignalGate) signal(sig syscall.Signal, pick func(pid int, st procStat) bool) error {
	if !g.Alive() {
		return fmt.Errorf("pid %d: %w", g.pid, os.ErrProcessDone)
	}
	var errs []error
	self := os.Getpid()
	for _, p := range Descendants(g.pid) {
		if p == self {
			continue
		}
		if st, err := readStat(p); err != nil || !pick(p, st) {
			continue
		}
		if err := unix.Kill(p, sig); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("%v pid %d: %w", sig, p, err))
		}
	}
	return errors.Join(errs...)
}

type procStat struct {
	ppid  int
	state byte
	flags uint64 // the kernel's task flags (PF_*)
	start uint64
}

// pfExiting is PF_EXITING: the task is in do_exit.
const pfExiting = 0x4

// readStat parses /proc/PID/stat (the command may contain spaces and
// parentheses; fields resume after the last ')').
func readStat(pid int) (procStat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("pid %d: malformed stat", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("pid %d: malformed stat", pid)
	}
	ppid, _ := strconv.Atoi(f[1])
	flags, _ := strconv.ParseUint(f[6], 10, 64)
	start, _ := strconv.ParseUint(f[19], 10, 64)
	return procStat{ppid: ppid, state: f[0][0], flags: flags, start: start}, nil
}

// Descendants returns pid and every process below it, parents first.
func Descendants(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readStat(p); err == nil {
			children[st.ppid] = append(children[st.ppid], p)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// Stopped tells whether a process is in the stopped state.
func Stopped(pid int) bool {
	st, err := readStat(pid)
	return err == nil && (st.state == 'T' || st.state == 't')
}

// StartTime returns a process's start time in clock ticks since boot, as
// /proc/PID/stat field 22 gives it.
func StartTime(pid int) (uint64, error) {
	st, err := readStat(pid)
	return st.start, err
}

// Exited reports whether the process that started at start has ended or
// is ending: it is gone, its main thread is exiting (PF_EXITING) or a
// zombie — its threads run no more user code — or its pid now names
// another process.
func Exited(pid int, start uint64) bool {
	st, err := readStat(pid)
	return err != nil || gone(st) || st.start != start
}

// Gone reports whether no process runs under pid: there is none, or it is
// a zombie or exiting.
func Gone(pid int) bool {
	st, err := readStat(pid)
	return err != nil || gone(st)
}

func gone(st procStat) bool { return st.state == 'Z' || st.state == 'X' || st.flags&pfExiting != 0 }
