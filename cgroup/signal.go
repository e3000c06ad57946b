package cgroup

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// SignalGate stops a bare process's tree with SIGSTOP and resumes it with
// SIGCONT, for tenants attached by pid. The tree is what members lists at
// each freeze (the daemon's: every process forked below the root, however
// a double fork reparented it), else /proc's tree below the root. Every
// process it stops is recorded in the ledger, by pid and start time,
// before the signal, and continued by pidfd after the same check: a
// process that died meanwhile, its pid since reused, is never signalled,
// and one reparented while stopped is still continued (by the gate, the
// guardian or thaw --all).
//
// Processes already stopped when it stops the tree (a shell's Ctrl-Z, a
// debugger) were stopped by someone else: it leaves them stopped at its
// thaw. (One stopped while the gate holds the tree cannot be told from
// its own stop: the thaw resumes it.)
type SignalGate struct {
	pid     int
	start   uint64
	members func() []int
	ledger  *Ledger
	// leftover is an earlier gpuarb's whole-tree entry (SignalGateOf):
	// its thaw continues what /proc shows below the root.
	leftover bool
	mu       sync.Mutex
	// stopped are the processes it stopped at the last Freeze, by pid and
	// start time.
	stopped map[int]uint64
}

// NewSignalGate returns the gate of a process tree, refusing PID 1, gpuarb
// itself and its ancestors. members, when not nil, lists the tree's
// processes at each freeze; ledger, when not nil, records each process
// before it is stopped.
func NewSignalGate(pid int, members func() []int, ledger *Ledger) (*SignalGate, error) {
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
	return &SignalGate{pid: pid, start: st.start, members: members, ledger: ledger}, nil
}

// SignalGateOf rebuilds the gate of a ledger entry of an earlier gpuarb
// (a whole tree, KindPID), to thaw what /proc shows below it.
func SignalGateOf(pid int, start uint64) *SignalGate {
	return &SignalGate{pid: pid, start: start, leftover: true}
}

// Freeze records, then stops with SIGSTOP, the tree's processes not
// already stopped; none is stopped if they cannot be recorded.
func (g *SignalGate) Freeze() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.Alive() {
		return fmt.Errorf("pid %d: %w", g.pid, os.ErrProcessDone)
	}
	pids := Descendants(g.pid)
	if g.members != nil {
		pids = append(g.members(), g.pid)
	}
	self := os.Getpid()
	stop := map[int]uint64{}
	var targets []Target
	for _, p := range pids {
		st, err := readStat(p)
		if p == self || err != nil || gone(st) || st.state == 'T' || st.state == 't' {
			continue // stopped by someone else: left as it is
		}
		if _, dup := stop[p]; !dup {
			stop[p] = st.start
			targets = append(targets, Target{Kind: KindProcess, PID: p, Start: st.start})
		}
	}
	if g.ledger != nil {
		if err := g.ledger.Add(targets...); err != nil {
			return fmt.Errorf("record pid %d's tree before stopping it: %w", g.pid, err)
		}
	}
	var errs []error
	for p, start := range stop {
		if err := signalProcess(p, start, unix.SIGSTOP); err != nil {
			errs = append(errs, err)
		}
	}
	g.stopped = stop
	return errors.Join(errs...)
}

// Thaw continues the processes the last Freeze stopped (but those that
// ended, or whose pid is another process's now) and lets the ledger go of
// them; one that could not be continued stays recorded.
func (g *SignalGate) Thaw() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	var done []Target
	for p, start := range g.stopped {
		if err := signalProcess(p, start, unix.SIGCONT); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, Target{Kind: KindProcess, PID: p, Start: start})
	}
	g.stopped = nil
	if g.ledger != nil {
		errs = append(errs, g.ledger.Remove(done...))
	}
	if g.leftover {
		errs = append(errs, g.thawTree())
	}
	return errors.Join(errs...)
}

// thawTree continues every process /proc shows below the root.
func (g *SignalGate) thawTree() error {
	if !g.Alive() {
		return fmt.Errorf("pid %d: %w", g.pid, os.ErrProcessDone)
	}
	var errs []error
	self := os.Getpid()
	for _, p := range Descendants(g.pid) {
		if st, err := readStat(p); err == nil && p != self {
			errs = append(errs, signalProcess(p, st.start, unix.SIGCONT))
		}
	}
	return errors.Join(errs...)
}

// signalProcess sends sig to process pid if it is still the one that
// started at start, through a pidfd: a pid reused since is never
// signalled. A process that is gone is not an error.
func signalProcess(pid int, start uint64, sig unix.Signal) error {
	if pid <= 1 {
		return fmt.Errorf("refusing to signal pid %d", pid)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%v pid %d: pidfd_open: %w", sig, pid, err)
	}
	defer unix.Close(fd)
	// The pidfd holds the process: the start read now is its own, unless
	// it died and the pid was reused, and then the signal finds nobody.
	if st, err := readStat(pid); err != nil || st.start != start {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("%v pid %d: %w", sig, pid, err)
	}
	return nil
}

// ContinueProcess sends SIGCONT to one process (not its descendants) if it
// is still the one that started at start (clock ticks since boot, as in
// /proc/PID/stat): the release of a process gpuarb's launch gate stopped.
// A process that is gone is not an error.
func ContinueProcess(pid int, start uint64) error { return signalProcess(pid, start, unix.SIGCONT) }

// Target implements Gate: the root process (each process stopped is
// recorded by Freeze as well).
func (g *SignalGate) Target() Target { return Target{Kind: KindProcess, PID: g.pid, Start: g.start} }

// Alive tells whether the process still exists (same pid, same start).
func (g *SignalGate) Alive() bool {
	st, err := readStat(g.pid)
	return err == nil && st.start == g.start
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

// RunningPIDs lists the processes running now.
func RunningPIDs() []uint32 {
	entries, _ := os.ReadDir("/proc")
	var pids []uint32
	for _, e := range entries {
		if pid, err := strconv.ParseUint(e.Name(), 10, 32); err == nil {
			pids = append(pids, uint32(pid))
		}
	}
	return pids
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
