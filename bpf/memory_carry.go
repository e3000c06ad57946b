package bpf

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/gpuarb/gpuarb/cgroup"
)

// GPU memory charges outlive a daemon: the charge tables (what each slot and
// each default-limited cgroup holds, and what each process holds under
// which device and allocation) are pinned, and a daemon that stops while
// limited processes hold memory leaves them pinned. The next daemon's load
// finds the slots that had members there held over: their members and
// limits stay in force, and the first tenant whose processes are among a
// slot's members adopts it with its charges (AdoptMemoryLimit); the slots
// nobody adopts are released (ReleaseHeldOverMemoryLimits). At the load,
// every charge is set to what live processes hold: what processes that
// exited while no daemon ran held is uncharged. Bounds: an
// allocation or free made while no probes were attached is not seen (the
// first is not charged, the second stays charged until its process exits),
// and a pid member whose pid a new process took meanwhile is held by the
// old slot's limit until the slot is adopted or released.

// Pinned names of the per-process charge tables.
const (
	memProcsMap = "gpuarb_mem_procs"
	memObjsMap  = "gpuarb_mem_objs"
	memDevsMap  = "gpuarb_mem_devs"
)

// memoryPins are the pins a stopping daemon keeps while limited processes
// hold memory.
var memoryPins = []string{memKeysMap, memLimitMap, memShareMap, memUsageMap, memCgroupsMap, memProcsMap, memObjsMap, memDevsMap}

// holdOverMemoryLimits takes up the memory limit tables a reused pin path
// holds: every slot with members is held over (used, its members counted
// for the probes) until adopted or released. Called by Load before the
// probes attach.
func (p *Probes) holdOverMemoryLimits() error {
	var (
		k     gpuarbGateKey
		slot  uint32
		stray []gpuarbGateKey
	)
	held := map[uint32][]gpuarbGateKey{}
	it := p.objs.GpuarbMemKeys.Iterate()
	for it.Next(&k, &slot) {
		if int(slot) >= MemorySlots {
			stray = append(stray, k)
			continue
		}
		held[slot] = append(held[slot], k)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("memory limits: read members: %w", err)
	}
	for _, k := range stray {
		if err := p.objs.GpuarbMemKeys.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("memory limits: drop a member of no slot: %w", err)
		}
	}
	p.memory.mu.Lock()
	for slot, members := range held {
		p.memory.used[slot] = true
		p.memory.members += len(members)
	}
	err := p.memory.count.Set(uint32(p.memory.members))
	p.memHeldOver = held
	p.memory.mu.Unlock()
	if err != nil {
		return fmt.Errorf("memory limits: count members: %w", err)
	}
	return nil
}

// continueMemoryGenerations sets mem_dev_seq and mem_cgroup_gen (which a
// load starts at zero) past every generation the pinned tables hold
// (cgroupGen: the default limit's, which reconcileMemoryCharges read), so
// that no new device or default-limit table is taken for an earlier one.
// carried tells that a default-limit table with entries was in force: the
// next SetDefaultMemoryLimit keeps its charges.
func (p *Probes) continueMemoryGenerations(cgroupGen uint64, carried bool) error {
	var (
		devSeq         uint64
		objKey, devKey gpuarbMemObjKey
		obj            gpuarbMemObj
		dev            gpuarbMemDev
	)
	objs := p.objs.GpuarbMemObjs.Iterate()
	for objs.Next(&objKey, &obj) {
		devSeq = max(devSeq, obj.DevGen)
	}
	devs := p.objs.GpuarbMemDevs.Iterate()
	for devs.Next(&devKey, &dev) {
		devSeq = max(devSeq, dev.Gen)
	}
	if err := errors.Join(objs.Err(), devs.Err()); err != nil {
		return fmt.Errorf("memory limits: read pinned charges: %w", err)
	}
	if err := errors.Join(p.objs.MemDevSeq.Set(devSeq), p.objs.MemCgroupGen.Set(cgroupGen)); err != nil {
		return fmt.Errorf("memory limits: continue generations: %w", err)
	}
	p.memory.mu.Lock()
	p.defaultMemoryCarried = carried
	p.memory.mu.Unlock()
	return nil
}

// reconcileMemoryCharges drops the entries of processes that exited while
// no probes were attached, and sets every slot's and default-limited
// cgroup's charges to what their live processes hold (the entries of the
// table's generation): what the exited held is uncharged, and charges an
// older gpuarb left without their processes' entries go. Called by Load
// before the probes attach, when nothing else writes the tables; a process
// that exits between this and the exit probe's attaching stays charged
// until its slot's next reconciling (erring high). The device and
// default-limit generations then continue past every one in the tables.
func (p *Probes) reconcileMemoryCharges() error {
	type owner struct {
		slot   uint32
		cgroup uint64 // the default limit's (slot MemorySlots)
		gen    uint64
	}
	var (
		tgid      uint32
		proc      gpuarbMemProc
		gone      []uint32
		held      = map[owner]*[MemoryGPUs]uint64{}
		procs     = p.objs.GpuarbMemProcs
		cgroupGen uint64 // the default limit's newest generation in the tables
	)
	it := procs.Iterate()
	for it.Next(&tgid, &proc) {
		if cgroup.Exited(int(tgid), proc.StartNs/(1e9/clockTicksPerSecond)) {
			gone = append(gone, tgid)
			continue
		}
		o := owner{slot: proc.Slot, gen: proc.Gen}
		if int(proc.Slot) == MemorySlots {
			o.cgroup = proc.Cgroup
			cgroupGen = max(cgroupGen, proc.Gen)
		}
		if held[o] == nil {
			held[o] = new([MemoryGPUs]uint64)
		}
		for gpu, b := range proc.Charged {
			held[o][gpu] += b
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("memory limits: read process charges: %w", err)
	}
	var errs []error
	for _, tgid := range gone {
		if err := procs.Delete(tgid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("memory limits: drop exited process %d: %w", tgid, err))
		}
	}
	charged := func(o owner) [MemoryGPUs]uint64 {
		if h := held[o]; h != nil {
			return *h
		}
		return [MemoryGPUs]uint64{}
	}
	var u gpuarbMemUsage
	for slot := range uint32(MemorySlots) {
		if err := p.objs.GpuarbMemUsage.Lookup(slot, &u); err != nil {
			errs = append(errs, fmt.Errorf("memory limit %d: read: %w", slot, err))
			continue
		}
		if c := charged(owner{slot: slot, gen: u.Gen}); c != u.Charged {
			u.Charged = c
			errs = append(errs, p.objs.GpuarbMemUsage.Put(slot, u))
		}
	}
	var (
		id      uint64
		cgroups = map[uint64]gpuarbMemUsage{}
	)
	all := p.objs.GpuarbMemCgroups.Iterate()
	for all.Next(&id, &u) {
		cgroups[id] = u
		cgroupGen = max(cgroupGen, u.Gen)
	}
	if err := all.Err(); err != nil {
		return errors.Join(append(errs, fmt.Errorf("default GPU memory limit: read: %w", err))...)
	}
	for id, u := range cgroups {
		if c := charged(owner{slot: uint32(MemorySlots), cgroup: id, gen: u.Gen}); c != u.Charged {
			u.Charged = c
			errs = append(errs, p.objs.GpuarbMemCgroups.Put(id, u))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("memory limits: reconcile charges: %w", err)
	}
	return p.continueMemoryGenerations(cgroupGen, len(cgroups) > 0)
}

// AdoptMemoryLimit takes over a held-over slot with any of these members
// (cgroups with everything below them, processes), its limit, members and
// charges as the earlier daemon left them; nil when none has.
func (p *Probes) AdoptMemoryLimit(cgroups []uint64, pids []int) *MemoryLimit {
	want := gateKeys(cgroups, pids)
	p.memory.mu.Lock()
	defer p.memory.mu.Unlock()
	for _, slot := range slices.Sorted(maps.Keys(p.memHeldOver)) {
		members := p.memHeldOver[slot]
		if !slices.ContainsFunc(members, func(k gpuarbGateKey) bool { return want[k] }) {
			continue
		}
		delete(p.memHeldOver, slot)
		return p.heldOverLimit(slot, members)
	}
	return nil
}

// ReleaseHeldOverMemoryLimits frees the held-over slots nobody adopted:
// their members removed, their limits lifted.
func (p *Probes) ReleaseHeldOverMemoryLimits() error {
	p.memory.mu.Lock()
	held := p.memHeldOver
	p.memHeldOver = nil
	p.memory.mu.Unlock()
	var errs []error
	for slot, members := range held {
		errs = append(errs, p.heldOverLimit(slot, members).Close())
	}
	return errors.Join(errs...)
}

// heldOverLimit is the MemoryLimit of a held-over slot with its members.
func (p *Probes) heldOverLimit(slot uint32, members []gpuarbGateKey) *MemoryLimit {
	l := &MemoryLimit{p: p, memberSet: newMemberSet(p.objs.GpuarbMemKeys, &p.memory, slot, "memory limit")}
	for _, k := range members {
		l.members[k] = true
	}
	return l
}

// HoldsMemory reports whether a process of a limited tenant holds charged
// GPU memory: a stopping daemon then leaves its limits in the pins for the
// next, and keeps the memory tables (Unpin).
func (p *Probes) HoldsMemory() bool {
	if p == nil {
		return false
	}
	var (
		tgid uint32
		proc gpuarbMemProc
	)
	it := p.objs.GpuarbMemProcs.Iterate()
	for it.Next(&tgid, &proc) {
		if slices.ContainsFunc(proc.Charged[:], func(b uint64) bool { return b != 0 }) {
			return true
		}
	}
	return false
}
