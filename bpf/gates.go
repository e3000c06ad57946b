package bpf

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
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

// GateSlots is the number of launch gates the probes hold.
const GateSlots = 4096

// ErrNoGateSlot is returned when every gate slot is in use.
var ErrNoGateSlot = errors.New("no free launch gate slot")

// Pinned names of the held-process table and the gate member table.
const (
	heldMap     = "gpuarb_held"
	gateKeysMap = "gpuarb_gate_keys"
)

// HeldProcess is a process a launch gate stopped.
type HeldProcess struct {
	PID   int
	Since uint64 // CLOCK_MONOTONIC ns when it was stopped
	// StartTicks is the process's start time in clock ticks since boot,
	// as /proc/PID/stat field 22 shows it, against pid reuse.
	StartTicks uint64
	Gate       uint32 // the slot of the gate that holds it
}

// clockTicksPerSecond is USER_HZ, the unit of /proc/PID/stat start times
// (100 on every Linux architecture gpuarb builds for).
const clockTicksPerSecond = 100

func heldOf(pid uint32, h gpuarbHeldProc) HeldProcess {
	return HeldProcess{PID: int(pid), Since: h.SinceNs, StartTicks: h.StartNs / (1e9 / clockTicksPerSecond), Gate: h.Gate}
}

// gateTable allocates slots and counts members across gates.
type gateTable struct {
	mu      sync.Mutex
	used    [GateSlots]bool
	members int
}

// LaunchGate is one gate slot. Its methods are safe for concurrent use
// with the probes; one goroutine owns a gate.
type LaunchGate struct {
	p       *Probes
	slot    uint32
	members map[gpuarbGateKey]bool
}

// NewLaunchGate takes a free slot and opens it fully (no member yet).
func (p *Probes) NewLaunchGate() (*LaunchGate, error) {
	t := &p.gates
	t.mu.Lock()
	defer t.mu.Unlock()
	i := slices.Index(t.used[:], false)
	if i < 0 {
		return nil, ErrNoGateSlot
	}
	g := &LaunchGate{p: p, slot: uint32(i), members: map[gpuarbGateKey]bool{}}
	if err := p.objs.GpuarbGates.Put(g.slot, gpuarbGate{}); err != nil {
		return nil, fmt.Errorf("launch gate %d: reset: %w", i, err)
	}
	if err := g.Allow(math.MaxUint64); err != nil {
		return nil, err
	}
	t.used[i] = true
	return g, nil
}

// Slot is the gate's index in gpuarb_gates.
func (g *LaunchGate) Slot() uint32 { return g.slot }

// SetMembers makes exactly these cgroups (with everything below them) and
// processes the gate's members.
func (g *LaunchGate) SetMembers(cgroups []uint64, pids []int) error {
	want := map[gpuarbGateKey]bool{}
	for _, id := range cgroups {
		want[gpuarbGateKey{Id: id, Kind: gateCgroup}] = true
	}
	for _, pid := range pids {
		want[gpuarbGateKey{Id: uint64(pid), Kind: gateProcess}] = true
	}
	var errs []error
	for k := range g.members {
		if !want[k] {
			errs = append(errs, g.removeMember(k))
		}
	}
	for k := range want {
		if g.members[k] {
			continue
		}
		if err := g.p.objs.GpuarbGateKeys.Put(k, g.slot); err != nil {
			errs = append(errs, fmt.Errorf("launch gate %d: add member %d: %w", g.slot, k.Id, err))
			continue
		}
		g.members[k] = true
		g.p.countMembers(1)
	}
	return errors.Join(errs...)
}

func (g *LaunchGate) removeMember(k gpuarbGateKey) error {
	delete(g.members, k)
	g.p.countMembers(-1)
	if err := g.p.objs.GpuarbGateKeys.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("launch gate %d: remove member %d: %w", g.slot, k.Id, err)
	}
	return nil
}

// countMembers keeps the probes' member count, which lets launches skip
// the gate lookups while no gate has members.
func (p *Probes) countMembers(delta int) {
	t := &p.gates
	t.mu.Lock()
	defer t.mu.Unlock()
	t.members += delta
	// Best effort: with the count wrong the probes only look up more.
	_ = p.objs.GateMembers.Set(uint32(max(t.members, 0)))
}

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
	if g == nil || g.members == nil {
		return nil
	}
	var errs []error
	for k := range g.members {
		errs = append(errs, g.removeMember(k))
	}
	errs = append(errs, g.Allow(math.MaxUint64))
	t := &g.p.gates
	t.mu.Lock()
	t.used[g.slot] = false
	t.mu.Unlock()
	g.members = nil
	return errors.Join(errs...)
}

func readHeld(m *ebpf.Map) ([]HeldProcess, error) {
	var (
		pid uint32
		h   gpuarbHeldProc
		out []HeldProcess
	)
	it := m.Iterate()
	for it.Next(&pid, &h) {
		out = append(out, heldOf(pid, h))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read held processes: %w", err)
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
	var cur gpuarbHeldProc
	err := m.Lookup(uint32(h.PID), &cur)
	if errors.Is(err, ebpf.ErrKeyNotExist) || (err == nil && cur.SinceNs != h.Since) {
		return false, nil
	}
	if err == nil {
		err = m.Delete(uint32(h.PID))
	}
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("forget held pid %d: %w", h.PID, err)
	}
	return true, nil
}

// ReleasePinnedHeld opens every launch gate pinned under pinPath (so that
// probes still attached hold nobody again), hands every process held in
// the pinned table to release (which continues it) and forgets it: the
// cleanup after a daemon that is gone. Without pins nothing is held.
func ReleasePinnedHeld(pinPath string, release func(HeldProcess) error) ([]HeldProcess, error) {
	errOpen := openPinnedGates(pinPath)
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, heldMap), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errOpen
	}
	if err != nil {
		return nil, errors.Join(errOpen, fmt.Errorf("open held processes: %w", err))
	}
	defer m.Close()
	held, err := readHeld(m)
	if err != nil {
		return nil, errors.Join(errOpen, err)
	}
	errs := []error{errOpen}
	for _, h := range held {
		// Continued whether or not the hold was still there: nothing may
		// stay stopped after the daemon.
		if _, err := forgetHeld(m, h); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, release(h))
	}
	return held, errors.Join(errs...)
}

// openPinnedGates removes every member of the pinned launch gates.
func openPinnedGates(pinPath string) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, gateKeysMap), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open launch gate members: %w", err)
	}
	defer m.Close()
	return clearMembers(m)
}

// clearGateMembers drops members left in reused pins by an earlier daemon:
// their slots mean nothing to this one.
func (p *Probes) clearGateMembers() error { return clearMembers(p.objs.GpuarbGateKeys) }

func clearMembers(m *ebpf.Map) error {
	var (
		k    gpuarbGateKey
		slot uint32
		keys []gpuarbGateKey
	)
	it := m.Iterate()
	for it.Next(&k, &slot) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read launch gate members: %w", err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clear launch gate members: %w", err)
		}
	}
	return nil
}
