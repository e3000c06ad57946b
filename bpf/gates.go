package bpf

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Launch gates are the arbiter's admission control inside the launch path.
// A gate admits its members' launches (cuLaunchKernel, cuLaunchKernelEx,
// cuLaunchCooperativeKernel, cuGraphLaunch, nouveau submissions) while
// the admitted count is below the allowance the daemon sets; the launch
// beyond it stops its process with SIGSTOP before the launch runs (an
// ioctl submission has already gone through) and records the process in
// gpuarb_held until the daemon continues it. Freezing a cgroup lands
// after a whole batch of launches has been queued; a gate stops the batch
// at the launch it cannot afford.

// Gate member kinds: enum gate_kind in gpuarb.h.
const (
	gateCgroup  = uint32(gpuarbGateKindGATE_CGROUP)
	gateProcess = uint32(gpuarbGateKindGATE_PROCESS)
)

// GateSlots is the number of launch gates the probes hold (GATE_SLOTS).
const GateSlots = int(gpuarbGpuarbSizesGATE_SLOTS)

// ErrNoGateSlot is returned when every gate slot is in use.
var ErrNoGateSlot = errors.New("no free launch gate slot")

// Pinned names of the held-process table, the table of holds being
// released, the gate member table and the gates' lease.
const (
	heldMap      = "gpuarb_held"
	releasingMap = "gpuarb_releasing"
	gateKeysMap  = "gpuarb_gate_keys"
	leaseMap     = "gpuarb_gate_lease"
)

// HeldProcess is a process a launch gate stopped.
type HeldProcess struct {
	PID   int
	Since uint64 // CLOCK_MONOTONIC ns when it was stopped
	// StartTicks is the process's start time in clock ticks since boot,
	// as /proc/PID/stat field 22 shows it, against pid reuse.
	StartTicks uint64
	Gate       uint32 // the slot of the gate that holds it
	// Waiting counts the launches of its other threads that wait with the
	// held one (all run at its release).
	Waiting uint32
	// Stopping is set from the hold's record until its SIGSTOP is queued:
	// a release now would come before the stop, which would then stand.
	Stopping bool
}

// clockTicksPerSecond is USER_HZ, the unit of /proc/PID/stat start times
// (100 on every Linux architecture gpuarb builds for).
const clockTicksPerSecond = 100

// heldPrefix is the part of a held_proc record every version of gpuarb
// has written the same way (since, start, gate, flags): what an older
// daemon held can be released whatever its record's size.
const heldPrefix = 24

// decodeHeld reads a held_proc record of any version: its first
// heldPrefix bytes, and the fields of this version where it has them.
func decodeHeld(pid uint32, v []byte) (HeldProcess, error) {
	if len(v) < heldPrefix {
		return HeldProcess{}, fmt.Errorf("held pid %d: a record of %d bytes, want at least %d", pid, len(v), heldPrefix)
	}
	h := HeldProcess{PID: int(pid), Since: binary.NativeEndian.Uint64(v[0:]),
		StartTicks: binary.NativeEndian.Uint64(v[8:]) / (1e9 / clockTicksPerSecond), Gate: binary.NativeEndian.Uint32(v[16:])}
	if len(v) >= 32 {
		h.Waiting = binary.NativeEndian.Uint32(v[24:])
		h.Stopping = binary.NativeEndian.Uint32(v[28:]) != 0
	}
	return h, nil
}

// continuedAt reads a release note's continued_ns (0: the release was cut
// short before its SIGCONT, or a note of a version without the field).
func continuedAt(v []byte) uint64 {
	if len(v) < 32 {
		return 0
	}
	return binary.NativeEndian.Uint64(v[24:])
}

// LaunchGate is one gate slot. Its methods are safe for concurrent use
// with the probes; one goroutine owns a gate.
type LaunchGate struct {
	p *Probes
	memberSet
}

// NewLaunchGate takes a free slot and opens it fully (no member yet).
func (p *Probes) NewLaunchGate() (*LaunchGate, error) {
	g := &LaunchGate{p: p}
	err := p.gates.take(ErrNoGateSlot, func(slot uint32) error {
		g.memberSet = newMemberSet(p.objs.GpuarbGateKeys, &p.gates, slot, "launch gate")
		if err := p.objs.GpuarbGates.Put(slot, gpuarbGate{}); err != nil {
			return fmt.Errorf("launch gate %d: reset: %w", slot, err)
		}
		return g.Allow(math.MaxUint64)
	})
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Slot is the gate's index in gpuarb_gates.
func (g *LaunchGate) Slot() uint32 { return g.slot }

// SetMembers makes exactly these cgroups (with everything below them) and
// processes the gate's members.
func (g *LaunchGate) SetMembers(cgroups []uint64, pids []int) error { return g.set(cgroups, pids) }

// Counts returns how many launches the gate has let through, how many
// times it has held a process, and how many of those holds someone else
// ended (a sibling's SIGCONT: the held launch ran, and was counted in
// admitted when the process next passed the gate).
func (g *LaunchGate) Counts() (admitted, holds, escapes uint64, err error) {
	var v gpuarbGate
	if err := g.p.objs.GpuarbGates.Lookup(g.slot, &v); err != nil {
		return 0, 0, 0, fmt.Errorf("launch gate %d: read: %w", g.slot, err)
	}
	return v.Admitted, v.Holds, v.Escapes, nil
}

// Unrecorded counts the launches beyond the allowance that the gate let
// through because gpuarb_held was full: a process the gate cannot record
// is never stopped, since nothing would continue it.
func (g *LaunchGate) Unrecorded() (uint64, error) {
	var v gpuarbGate
	if err := g.p.objs.GpuarbGates.Lookup(g.slot, &v); err != nil {
		return 0, fmt.Errorf("launch gate %d: read: %w", g.slot, err)
	}
	return v.Unrecorded, nil
}

// UnrecordedLaunches sums Unrecorded over every gate: launches let through
// unstopped because gpuarb_held was full.
func (p *Probes) UnrecordedLaunches() (uint64, error) {
	var (
		slot  uint32
		v     gpuarbGate
		total uint64
	)
	it := p.objs.GpuarbGates.Iterate()
	for it.Next(&slot, &v) {
		total += v.Unrecorded
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("launch gates: read: %w", err)
	}
	return total, nil
}

// Allow lets admitted launches reach n; math.MaxUint64 opens the gate.
func (g *LaunchGate) Allow(n uint64) error {
	if err := g.p.objs.GpuarbGateAllow.Put(g.slot, n); err != nil {
		return fmt.Errorf("launch gate %d: allow: %w", g.slot, err)
	}
	return nil
}

// Held returns the processes this gate holds, oldest first.
func (g *LaunchGate) Held() ([]HeldProcess, error) {
	all, err := readHeld(g.p.objs.GpuarbHeld)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(h HeldProcess) bool { return h.Gate != g.slot }), nil
}

// stuckStopping is how long a hold may read Stopping before a release goes
// ahead anyway: the probe clears it microseconds after the record, unless
// it was preempted in between.
const stuckStopping = 50 * time.Millisecond

// Releasable tells whether h's stop is out, so that continuing the process
// now ends the hold (now: CLOCK_MONOTONIC ns).
func (h HeldProcess) Releasable(now uint64) bool {
	return !h.Stopping || now > h.Since+uint64(stuckStopping)
}

// Release ends the hold h and has cont continue the process: it notes the
// release in the pinned table of releases, forgets the hold (a hold that
// is gone or replaced is not this one to end: it reports false and
// continues nothing), calls cont and marks the note continued. A daemon
// killed anywhere in between leaves the process held or noted and not
// marked, and whoever releases what it left (ReleasePinnedHeld) continues
// it. The marked note tells the probes that a hold a sibling thread made
// just before the continue was ended by it, not by someone else.
func (g *LaunchGate) Release(h HeldProcess, cont func(HeldProcess) error) (bool, error) {
	rel := g.p.objs.GpuarbReleasing
	note := gpuarbReleaseNote{SinceNs: h.Since, StartNs: h.StartTicks * (1e9 / clockTicksPerSecond), Gate: h.Gate}
	if err := rel.Put(uint32(h.PID), note); err != nil {
		return false, fmt.Errorf("release pid %d: note: %w", h.PID, err)
	}
	forgot, err := forgetHeld(g.p.objs.GpuarbHeld, h)
	if !forgot {
		if derr := rel.Delete(uint32(h.PID)); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
			err = errors.Join(err, fmt.Errorf("release pid %d: drop the note: %w", h.PID, derr))
		}
		return false, err
	}
	err = cont(h)
	note.ContinuedNs = monotonicNow()
	if perr := rel.Put(uint32(h.PID), note); perr != nil {
		err = errors.Join(err, fmt.Errorf("release pid %d: mark the note: %w", h.PID, perr))
	}
	return true, err
}

// RenewLease lets the launch gates stop processes for term from now: the
// daemon renews it while it runs, so that once it is gone no gate stops
// anyone (gpuarb_gate_lease).
func (p *Probes) RenewLease(term time.Duration) error {
	return setLease(p.objs.GpuarbGateLease, monotonicNow()+uint64(term))
}

// EndLease ends the gates' lease: no gate stops a process from now on.
func (p *Probes) EndLease() error { return setLease(p.objs.GpuarbGateLease, 0) }

func setLease(m *ebpf.Map, until uint64) error {
	if err := m.Put(uint32(0), gpuarbGateLease{UntilNs: until}); err != nil {
		return fmt.Errorf("launch gates' lease: %w", err)
	}
	return nil
}

// monotonicNow is CLOCK_MONOTONIC in ns, the probes' clock.
func monotonicNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// Forget removes a hold from the held table, before the caller continues
// the process: once continued, the process may be held again under the
// same pid, and that hold must stay. It reports whether the hold was
// still there: gone, someone else continued the process (the gate
// charged the escape) or it exited; replaced, the process was held anew.
// Either way the caller must not continue it.
func (g *LaunchGate) Forget(h HeldProcess) (bool, error) {
	return forgetHeld(g.p.objs.GpuarbHeld, h)
}

// Close removes the gate's members and opens it. Processes it still holds
// stay held: the caller continues them (Held) first.
func (g *LaunchGate) Close() error {
	if g == nil || g.closed() {
		return nil
	}
	err := errors.Join(g.clear(), g.Allow(math.MaxUint64))
	g.p.gates.give(g.slot)
	return err
}

// readHeld lists a table of held_proc records of any version, oldest
// first.
func readHeld(m *ebpf.Map) ([]HeldProcess, error) {
	var (
		pid uint32
		out []HeldProcess
	)
	v := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&pid, &v) {
		h, err := decodeHeld(pid, v)
		if err != nil {
			return out, err
		}
		out = append(out, h)
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("read held processes: %w", err)
	}
	slices.SortFunc(out, func(a, b HeldProcess) int {
		return cmp.Or(cmp.Compare(a.Since, b.Since), cmp.Compare(a.PID, b.PID))
	})
	return out, nil
}

// forgetHeld deletes the hold h if the table still has it (not a later
// hold of the same pid) and reports whether it did. The process is stopped
// while its hold stands, so nothing replaces the entry between the check
// and the delete, unless someone else continues it meanwhile: then the
// delete may race the gate's own, which charges the escape.
func forgetHeld(m *ebpf.Map, h HeldProcess) (bool, error) {
	v := make([]byte, m.ValueSize())
	err := m.Lookup(uint32(h.PID), &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("forget held pid %d: %w", h.PID, err)
	}
	if cur, err := decodeHeld(uint32(h.PID), v); err != nil || cur.Since != h.Since {
		return false, err
	}
	err = m.Delete(uint32(h.PID))
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("forget held pid %d: %w", h.PID, err)
	}
	return true, nil
}

// settlePasses are the moments, from its start, at which ReleasePinnedHeld
// reads the tables again: a probe that passed the lease's check before it
// was ended may record its hold after the first read and queue its stop
// after the first continue; such a probe runs for microseconds, unless
// preempted, and these passes catch it.
var settlePasses = []time.Duration{0, 10 * time.Millisecond, 30 * time.Millisecond, 60 * time.Millisecond,
	100 * time.Millisecond}

// ReleasePinnedHeld ends the cleanup after a daemon that is gone: it ends
// the gates' lease and removes every member of the pinned launch gates
// (probes still attached stop nobody from then on), then hands release
// (which continues a process) every process held or being released in the
// pinned tables under pinPath, forgetting each, and does so again at each
// of settlePasses, also continuing again a process it released that is
// stopped once more (a stop that was on its way). Without pins nothing is
// held.
func ReleasePinnedHeld(pinPath string, release func(HeldProcess) error) ([]HeldProcess, error) {
	var errs []error
	if m, err := loadPinned(pinPath, leaseMap); err != nil {
		errs = append(errs, err)
	} else if m != nil {
		errs = append(errs, setLease(m, 0))
		m.Close()
	}
	errs = append(errs, openPinnedGates(pinPath))
	var tables []*ebpf.Map
	for _, name := range []string{heldMap, releasingMap} {
		m, err := loadPinned(pinPath, name)
		if err != nil {
			errs = append(errs, err)
		}
		if m != nil {
			defer m.Close()
			tables = append(tables, m)
		}
	}
	if len(tables) == 0 {
		return nil, errors.Join(errs...)
	}
	notes := tables[len(tables)-1]
	if notes.ValueSize() < 32 || len(tables) == 1 {
		notes = nil // an older daemon's: every note is a release cut short
	}
	type hold struct {
		pid   int
		since uint64
	}
	done := map[hold]bool{}
	var released []HeldProcess
	start := time.Now()
	for _, at := range settlePasses {
		time.Sleep(time.Until(start.Add(at)))
		for _, h := range released {
			// Continued again only if stopped again: release checks it is
			// still the process that was held.
			if stoppedAgain(h.PID) {
				errs = append(errs, release(h))
			}
		}
		for _, m := range tables {
			held, err := readHeld(m)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, h := range held {
				if m == notes && noteContinued(m, h.PID) {
					errs = append(errs, deleteNote(m, h.PID)) // a release that ended
					continue
				}
				if _, err := forgetHeld(m, h); err != nil {
					errs = append(errs, err)
					continue
				}
				// Continued whether or not the hold was still there: nothing
				// may stay stopped after the daemon.
				errs = append(errs, release(h))
				if k := (hold{h.PID, h.Since}); !done[k] {
					done[k] = true
					released = append(released, h)
				}
			}
		}
	}
	return released, errors.Join(errs...)
}

// noteContinued tells whether pid's release note says its SIGCONT went
// out.
func noteContinued(m *ebpf.Map, pid int) bool {
	v := make([]byte, m.ValueSize())
	return m.Lookup(uint32(pid), &v) == nil && continuedAt(v) != 0
}

func deleteNote(m *ebpf.Map, pid int) error {
	if err := m.Delete(uint32(pid)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("drop the release note of pid %d: %w", pid, err)
	}
	return nil
}

// stoppedAgain tells whether process pid is in the stopped state.
func stoppedAgain(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(data, ')')
	return i >= 0 && i+2 < len(data) && (data[i+2] == 'T' || data[i+2] == 't')
}

// loadPinned opens a pinned map; nil, nil when there is none.
func loadPinned(pinPath, name string) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return m, nil
}

// openPinnedGates removes every member of the pinned launch gates.
func openPinnedGates(pinPath string) error {
	m, err := loadPinned(pinPath, gateKeysMap)
	if m == nil {
		return err
	}
	defer m.Close()
	return clearMembers(m)
}

// clearGateMembers drops members left in reused pins by an earlier daemon:
// their slots mean nothing to this one.
func (p *Probes) clearGateMembers() error {
	if err := clearMembers(p.objs.GpuarbGateKeys); err != nil {
		return fmt.Errorf("launch gates: %w", err)
	}
	return nil
}
