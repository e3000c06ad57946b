// Package gpusched steers the GPU's own scheduler from outside the
// application, with no change to the driver or the application: per
// channel group (TSG) the timeslice, pause and resume (work already queued
// included) and preemption, through the driver's RM controls
// (docs/driver.md §3). An RM client is bound to the open file it was
// allocated on, so the controls go through that process's own control
// file, duplicated with pidfd_getfd; privilege comes from the calling
// task (root). The groups' handles come from the RM ioctls the probes
// decode (ioctlspy.Table). Two transports share everything else: the
// nvidia driver (an ioctl on the duplicate) and the simulated GPU (its
// socket, the duplicate attached as proof).
package gpusched

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/nvrm"
)

// Group is one channel group of a process, as the probes name it.
type Group = ioctlspy.Group

// nvidiaMajor is the character major of /dev/nvidiactl and /dev/nvidiaN.
const nvidiaMajor = 195

// ErrGone marks a failure because the process has ended: nothing to steer
// any more, the GPU is not to blame.
var ErrGone = errors.New("the process has ended")

// Change is one group's new scheduling: a timeslice (0: unchanged), and
// pause or resume (nil: unchanged). A pause evicts the group from the GPU
// at once, unless KeepRunning: then the group is only no longer scheduled,
// and what runs of it now finishes its timeslice (bOnlyDisableScheduling),
// so that the driver answers without waiting on a preemption.
type Change struct {
	Group       Group
	Timeslice   time.Duration
	Pause       *bool
	KeepRunning bool
}

// ErrNotItsFile marks a descriptor that is no longer the control file the
// process's RM client was allocated on (the process closed it, or put
// another file under its number): steering through it would act on
// something else, or on nothing at all. It is that process's trouble, not
// its GPU's.
var ErrNotItsFile = errors.New("not the control file its RM client was allocated on")

// Actuator steers channel groups. It is safe for concurrent use.
type Actuator struct {
	// fakeSocket is the simulated GPU's socket, given by the operator:
	// the transport of a control file that is no nvidia node ("": none).
	fakeSocket string
	mu         sync.Mutex
	procs      map[uint32]*proc
}

// proc is a process whose groups the actuator steers: a pidfd (to tell
// when it exits) and duplicates of its control files, each with the
// transport that reaches its driver. The duplicates are never polled:
// that would take the process's own event wake-ups.
type proc struct {
	pidfd int
	files map[int32]*controlFile
}

type controlFile struct {
	file *os.File
	id   ioctlspy.FileID
	via  transport
}

// New returns an actuator. fakeSocket, when set, is the simulated GPU's
// socket (the operator's --fakegpu-socket): the controls of a control
// file that is no nvidia node go there. Nothing a process shows (a socket
// beside its node, a path) ever picks where a control goes.
func New(fakeSocket string) *Actuator {
	return &Actuator{fakeSocket: fakeSocket, procs: map[uint32]*proc{}}
}

// Available tells whether this host lets a daemon steer other processes'
// channel groups, and why not: it needs root (the driver computes
// privilege from the calling task), pidfd_getfd (Linux 5.6) and ptrace
// access to the processes (Yama ptrace_scope below 3).
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("not root: the driver takes scheduling controls from administrators only")
	}
	if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(b)) == "3" {
		return errors.New("Yama ptrace_scope is 3: no process may take another's file descriptors (pidfd_getfd)")
	}
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w (Linux 5.3 or later is needed)", err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, 0, 0)
	if err != nil {
		return fmt.Errorf("pidfd_getfd: %w (Linux 5.6 or later is needed)", err)
	}
	unix.Close(fd)
	return nil
}

// file returns the duplicate of group g's control file, made on first use
// and checked at every use: it must be the very file g's RM client was
// allocated on (g.File, recorded by the probes at the allocation), for a
// process may close its descriptor or put another file under its number
// at any time. Called with a.mu held.
func (a *Actuator) file(g Group) (*controlFile, error) {
	p := a.procs[g.PID]
	if p == nil {
		pidfd, err := unix.PidfdOpen(int(g.PID), 0)
		if err != nil {
			return nil, fmt.Errorf("pid %d: pidfd_open: %w", g.PID, err)
		}
		p = &proc{pidfd: pidfd, files: map[int32]*controlFile{}}
		a.procs[g.PID] = p
	}
	if cf := p.files[g.FD]; cf != nil {
		if cf.id == g.File {
			return cf, nil
		}
		cf.via.close() // the client's file is another now: duplicate afresh
		cf.file.Close()
		delete(p.files, g.FD)
	}
	cf, err := a.duplicate(p.pidfd, g)
	if err != nil {
		return nil, err
	}
	p.files[g.FD] = cf
	return cf, nil
}

// duplicate takes a duplicate of g's control file from the process of
// pidfd, checked to be that file (transportOf).
func (a *Actuator) duplicate(pidfd int, g Group) (*controlFile, error) {
	if g.File.Ino == 0 {
		return nil, fmt.Errorf("pid %d: descriptor %d: %w (none recorded)", g.PID, g.FD, ErrNotItsFile)
	}
	fd, err := unix.PidfdGetfd(pidfd, int(g.FD), 0)
	if err != nil {
		return nil, fmt.Errorf("pid %d: pidfd_getfd of its control file %d: %w", g.PID, g.FD, err)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("pid %d fd %d", g.PID, g.FD))
	via, err := a.transportOf(g, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &controlFile{file: f, id: g.File, via: via}, nil
}

// transportOf checks that a duplicate is g's control file (a character
// device, the file recorded at the client's allocation) and picks the
// driver behind it: the nvidia driver for its character major, else the
// simulated GPU whose socket the operator gave.
func (a *Actuator) transportOf(g Group, f *os.File) (transport, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("pid %d: control file %d: %w", g.PID, g.FD, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Dev != g.File.Dev || st.Ino != g.File.Ino {
		return nil, fmt.Errorf("pid %d: descriptor %d (inode %d on %d:%d): %w (inode %d on %d:%d)", g.PID, g.FD, st.Ino,
			unix.Major(st.Dev), unix.Minor(st.Dev), ErrNotItsFile, g.File.Ino, unix.Major(g.File.Dev), unix.Minor(g.File.Dev))
	}
	if unix.Major(st.Rdev) == nvidiaMajor {
		return nvidia{}, nil
	}
	if a.fakeSocket != "" {
		return &fakeGPU{socket: a.fakeSocket}, nil
	}
	return nil, fmt.Errorf("pid %d: control file %d (%d:%d) is no nvidia node, and no simulated GPU was given (--fakegpu-socket)",
		g.PID, g.FD, unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

// control sends one RM control for group g; a refused one is a StatusError,
// one that failed because the process ended wraps ErrGone.
func (a *Actuator) control(g Group, object, cmd uint32, params []byte) error {
	a.mu.Lock()
	cf, err := a.file(g)
	a.mu.Unlock()
	if err == nil {
		var status uint32
		status, err = cf.via.control(cf.file, g.Client, object, cmd, params)
		switch {
		case err != nil:
			err = fmt.Errorf("pid %d: %w", g.PID, err)
		case status != nvrm.StatusOK:
			err = fmt.Errorf("pid %d: %w", g.PID, &StatusError{Control: cmd, Status: status})
		}
	}
	if err != nil && a.exited(g.PID) {
		return fmt.Errorf("%w: %w", ErrGone, err)
	}
	return err
}

// exited tells whether process pid has ended (its pidfd is readable, or it
// cannot be opened).
func (a *Actuator) exited(pid uint32) bool {
	a.mu.Lock()
	p := a.procs[pid]
	a.mu.Unlock()
	if p == nil {
		fd, err := unix.PidfdOpen(int(pid), 0)
		if err != nil {
			return true
		}
		defer unix.Close(fd)
		return pidfdExited(fd)
	}
	return pidfdExited(p.pidfd)
}

func pidfdExited(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

// Probe tells whether group g can be steered: its control file can be
// duplicated and the driver answers a harmless control (GET_INFO) through
// it. The error says why not.
func (a *Actuator) Probe(g Group) error {
	return a.control(g, g.TSG, nvrm.CtrlTSGGetInfo, make([]byte, 4))
}

// Slices reads the timeslices group g's GPU runs channel groups well at.
// Call it before gpuarb changes the GPU's groups: on the nvidia driver,
// g's own timeslice may lengthen the base.
func (a *Actuator) Slices(g Group) (Slices, error) {
	a.mu.Lock()
	cf, err := a.file(g)
	a.mu.Unlock()
	if err != nil {
		return Slices{}, err
	}
	return cf.via.slices(func(cmd uint32, params []byte) error { return a.control(g, g.TSG, cmd, params) })
}

// Timeslice reads group g's timeslice.
func (a *Actuator) Timeslice(g Group) (time.Duration, error) {
	p := make([]byte, 8)
	if err := a.control(g, g.TSG, nvrm.CtrlTSGGetTimeslice, p); err != nil {
		return 0, err
	}
	return time.Duration(binary.LittleEndian.Uint64(p)) * time.Microsecond, nil
}

// VideoMemory reads, through group g's subdevice, the video memory the
// driver counts for each of pids on g's GPU (GET_PID_INFO,
// VIDEO_MEMORY_USAGE: private plus owned shared memory, the context's own
// buffers included), in calls of at most nvrm.PIDInfoMax. A process the
// driver does not answer for is left out. The duplicate of a process not
// steered is closed again at once.
func (a *Actuator) VideoMemory(g Group, pids []uint32) (map[uint32]uint64, error) {
	control, done, err := a.subdeviceControl(g)
	if err != nil {
		return nil, err
	}
	defer done()
	out := map[uint32]uint64{}
	for len(pids) > 0 {
		batch := pids[:min(len(pids), nvrm.PIDInfoMax)]
		pids = pids[len(batch):]
		p := pidInfoParams(batch)
		if err := control(nvrm.CtrlGPUGetPIDInfo, p); err != nil {
			return nil, err
		}
		for pid, bytes := range pidVideoMemory(p, len(batch)) {
			out[pid] += bytes
		}
	}
	return out, nil
}

// MemorySize reads, through group g's subdevice, the memory of g's GPU in
// bytes as the driver reports it to allocators (FB_GET_INFO_V2 HEAP_SIZE:
// cuMemGetInfo's total), trying each list length the driver has taken.
// The reply is the driver's to the daemon's own call: nothing a tenant
// writes reaches it.
func (a *Actuator) MemorySize(g Group) (uint64, error) {
	control, done, err := a.subdeviceControl(g)
	if err != nil {
		return 0, err
	}
	defer done()
	for _, n := range nvrm.FBInfoMaxLists {
		p := make([]byte, nvrm.FBInfoSize(n))
		binary.LittleEndian.PutUint32(p, 1)
		binary.LittleEndian.PutUint32(p[4:], nvrm.FBInfoHeapSize)
		err = control(nvrm.CtrlFBGetInfoV2, p)
		if se := (*StatusError)(nil); errors.As(err, &se) && se.Status == nvrm.StatusInvalidParamSize {
			continue // another driver's list length
		}
		if err != nil {
			return 0, err
		}
		kib := binary.LittleEndian.Uint32(p[8:])
		if kib == 0 {
			return 0, fmt.Errorf("pid %d: FB_GET_INFO_V2 answered a heap of 0 KiB", g.PID)
		}
		return uint64(kib) << 10, nil
	}
	return 0, fmt.Errorf("pid %d: FB_GET_INFO_V2: %w", g.PID, err)
}

// subdeviceControl makes controls on group g's subdevice: through the
// duplicate steering keeps of its process's file, or, for a process not
// steered, through one made for these controls alone, which done closes
// (a duplicate kept would hold the process's GPU memory past its exit
// until the next Sweep).
func (a *Actuator) subdeviceControl(g Group) (control func(cmd uint32, p []byte) error, done func(), err error) {
	if g.Subdevice == 0 {
		return nil, nil, fmt.Errorf("pid %d: group 0x%x: no subdevice seen to ask the driver through", g.PID, g.TSG)
	}
	a.mu.Lock()
	_, kept := a.procs[g.PID]
	a.mu.Unlock()
	if kept {
		return func(cmd uint32, p []byte) error { return a.control(g, g.Subdevice, cmd, p) }, func() {}, nil
	}
	pidfd, err := unix.PidfdOpen(int(g.PID), 0)
	if err != nil {
		return nil, nil, fmt.Errorf("pid %d: pidfd_open: %w", g.PID, err)
	}
	defer unix.Close(pidfd)
	cf, err := a.duplicate(pidfd, g)
	if err != nil {
		return nil, nil, err
	}
	control = func(cmd uint32, p []byte) error {
		status, err := cf.via.control(cf.file, g.Client, g.Subdevice, cmd, p)
		switch {
		case err != nil:
			return fmt.Errorf("pid %d: %w", g.PID, err)
		case status != nvrm.StatusOK:
			return fmt.Errorf("pid %d: %w", g.PID, &StatusError{Control: cmd, Status: status})
		}
		return nil
	}
	return control, func() { cf.via.close(); cf.file.Close() }, nil
}

// Preempt preempts group g once, waiting for it to finish: it stays
// runnable.
func (a *Actuator) Preempt(g Group) error {
	return a.control(g, g.TSG, nvrm.CtrlTSGPreempt, preemptParams())
}

// Apply makes the changes, then restarts the runlist of every GPU they
// touch once, the commit that makes them take effect. A pause takes the
// group's channels off the GPU: work already queued stays, and runs again
// at its resume. failed[i] is nil where changes[i] took effect (made and
// committed), else why not: one that did not (a group whose channels are
// not allocated yet, a process that ended, a refused control) is for the
// caller to try again, not to record. err joins them all.
func (a *Actuator) Apply(changes []Change) (failed []error, err error) {
	failed = make([]error, len(changes))
	// The changes of different processes go to the driver at once, each
	// process's in turn: a latency hold's pauses of the other tenants wait
	// on the slowest, not on their sum.
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxConcurrentControls)
	for _, idx := range byProcess(changes) {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			for _, i := range idx {
				failed[i] = a.change(changes[i])
			}
		})
	}
	wg.Wait()
	commit := map[uint32][]Group{}
	made := map[uint32][]int{}
	for i, c := range changes {
		if failed[i] == nil {
			commit[c.Group.GPU] = append(commit[c.Group.GPU], c.Group)
			made[c.Group.GPU] = append(made[c.Group.GPU], i)
		}
	}
	gpus := make([]uint32, 0, len(commit))
	for gpu := range commit {
		gpus = append(gpus, gpu)
	}
	sort.Slice(gpus, func(i, j int) bool { return gpus[i] < gpus[j] })
	for _, gpu := range gpus {
		// Through any of the changed groups: one whose process just ended
		// cannot carry it.
		var err error
		for _, g := range commit[gpu] {
			if err = a.control(g, g.Channels[0], nvrm.CtrlRestartRunlist, restartParams()); !errors.Is(err, ErrGone) {
				break
			}
		}
		if err != nil {
			err = fmt.Errorf("restart the runlist of GPU %d: %w", gpu, err)
			for _, i := range made[gpu] {
				failed[i] = err
			}
		}
	}
	var errs []error
	seen := map[error]bool{} // a failed restart is one error, however many changes it undid
	for _, e := range failed {
		if e != nil && !seen[e] {
			seen[e] = true
			errs = append(errs, e)
		}
	}
	return failed, errors.Join(errs...)
}

// maxConcurrentControls bounds the processes Apply changes at once.
const maxConcurrentControls = 8

// byProcess groups the indexes of changes by process, in order.
func byProcess(changes []Change) [][]int {
	at := map[uint32]int{}
	var out [][]int
	for i, c := range changes {
		j, ok := at[c.Group.PID]
		if !ok {
			j = len(out)
			at[c.Group.PID] = j
			out = append(out, nil)
		}
		out[j] = append(out[j], i)
	}
	return out
}

// change makes one change, uncommitted: its timeslice, then its pause.
func (a *Actuator) change(c Change) error {
	g := c.Group
	if len(g.Channels) == 0 {
		return fmt.Errorf("pid %d: group 0x%x has no channel", g.PID, g.TSG)
	}
	if c.Timeslice > 0 {
		if err := a.control(g, g.TSG, nvrm.CtrlTSGSetTimeslice, timesliceParams(c.Timeslice)); err != nil {
			return err
		}
	}
	if c.Pause != nil {
		return a.disable(g, *c.Pause, c.KeepRunning)
	}
	return nil
}

// disable takes group g's channels off the GPU (evicting them unless
// keepRunning), or puts them back.
func (a *Actuator) disable(g Group, off, keepRunning bool) error {
	if g.Subdevice == 0 {
		return fmt.Errorf("pid %d: group 0x%x: no subdevice seen to disable channels through", g.PID, g.TSG)
	}
	var errs []error
	for chunk := g.Channels; len(chunk) > 0; {
		n := min(len(chunk), nvrm.FIFODisableMax)
		p, err := disableParams(off, off && keepRunning, g.Client, chunk[:n])
		if err == nil {
			err = a.control(g, g.Subdevice, nvrm.CtrlFIFODisableChannels, p)
		}
		errs = append(errs, err)
		chunk = chunk[n:]
	}
	return errors.Join(errs...)
}

// Forget closes the duplicates of a process (it exited, or is no longer
// steered): held, they would keep its RM clients and GPU memory alive.
func (a *Actuator) Forget(pid uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forget(pid)
}

func (a *Actuator) forget(pid uint32) {
	p := a.procs[pid]
	if p == nil {
		return
	}
	for _, cf := range p.files {
		cf.via.close()
		cf.file.Close()
	}
	unix.Close(p.pidfd)
	delete(a.procs, pid)
}

// Sweep forgets the processes that have exited (their pidfd is readable).
func (a *Actuator) Sweep() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for pid, p := range a.procs {
		if pidfdExited(p.pidfd) {
			a.forget(pid)
		}
	}
}

// Close forgets every process.
func (a *Actuator) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for pid := range a.procs {
		a.forget(pid)
	}
	return nil
}
