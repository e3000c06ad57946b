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
// nobody adopts are released (ReleaseHeldOverMemoryLimits). What processes
// that exited while no daemon ran held is uncharged at the load. Bounds: an
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
var memoryPins = []string{memKeysMap, memLimitMap, memUsageMap, memCgroupsMap, memProcsMap, memObjsMap, memDevsMap}

// holdOverMemoryLimits takes up the memory limit tables a reused pin path
// holds: every slot with members is held over (used, its members counted
// for the probes) until adopted or released; the device and default-limit
// generations continue past every one in the tables. Called by Load
// before the probes attach.
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
	return p.continueMemoryGenerations()
}

// continueMemoryGenerations sets mem_dev_seq and mem_cgroup_gen (which a
// load starts at zero) past every generation the pinned tables hold, so
// that no new device or default-limit table is taken for an earlier one.
// A default-limit table with entries was in force: the next
// SetDefaultMemoryLimit keeps its charges.
func (p *Probes) continueMemoryGenerations() error {
	var (
		devSeq, cgroupGen uint64
		objKey, devKey    gpuarbMemObjKey
		obj               gpuarbMemObj
		dev               gpuarbMemDev
		tgid              uint32
		proc              gpuarbMemProc
		id                uint64
		usage             gpuarbMemUsage
	)
	objs := p.objs.GpuarbMemObjs.Iterate()
	for objs.Next(&objKey, &obj) {
		devSeq = max(devSeq, obj.DevGen)
	}
	devs := p.objs.GpuarbMemDevs.Iterate()
	for devs.Next(&devKey, &dev) {
		devSeq = max(devSeq, dev.Gen)
	}
	procs := p.objs.GpuarbMemProcs.Iterate()
	for procs.Next(&tgid, &proc) {
		if int(proc.Slot) == MemorySlots {
			cgroupGen = max(cgroupGen, proc.Gen)
		}
	}
	carried := false
	cgroups := p.objs.GpuarbMemCgroups.Iterate()
	for cgroups.Next(&id, &usage) {
		cgroupGen = max(cgroupGen, usage.Gen)
		carried = true
	}
	if err := errors.Join(objs.Err(), devs.Err(), procs.Err(), cgroups.Err()); err != nil {
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

// unchargeExited uncharges what processes that exited while no probes
// were attached held from their slots or cgroups, and removes their
// entries. Called by Load before the probes attach, when nothing else
// writes the tables; a process that exits between this and the exit
// probe's attaching stays charged until the next load (erring high).
func (p *Probes) unchargeExited() error {
	var (
		tgid  uint32
		proc  gpuarbMemProc
		gone  = map[uint32]gpuarbMemProc{}
		procs = p.objs.GpuarbMemProcs
	)
	it := procs.Iterate()
	for it.Next(&tgid, &proc) {
		if cgroup.Exited(int(tgid), proc.StartNs/(1e9/clockTicksPerSecond)) {
			gone[tgid] = proc
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("memory limits: read process charges: %w", err)
	}
	var errs []error
	for _, tgid := range slices.Sorted(maps.Keys(gone)) {
		proc := gone[tgid]
		if err := procs.Delete(tgid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("memory limits: drop exited process %d: %w", tgid, err))
			continue
		}
		errs = append(errs, p.uncharge(proc))
	}
	return errors.Join(errs...)
}

// uncharge takes what proc held off its slot or its cgroup's default
// usage, where that table is still of proc's generation.
func (p *Probes) uncharge(proc gpuarbMemProc) error {
	var (
		table = p.objs.GpuarbMemUsage
		key   any
		u     gpuarbMemUsage
	)
	if int(proc.Slot) == MemorySlots {
		table, key = p.objs.GpuarbMemCgroups, proc.Cgroup
	} else {
		key = proc.Slot
	}
	// A read-modify-write: the probes are not attached yet.
	if err := table.Lookup(key, &u); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("memory limits: read charges: %w", err)
	}
	if u.Gen != proc.Gen {
		return nil
	}
	for gpu, b := range proc.Charged {
		u.Charged[gpu] -= min(b, u.Charged[gpu])
	}
	if err := table.Update(key, u, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("memory limits: uncharge: %w", err)
	}
	return nil
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
// next, and Unpin keeps the memory tables.
func (p *Probes) HoldsMemory() bool { return p != nil && holdsMemory(p.objs.GpuarbMemProcs) }

func holdsMemory(procs *ebpf.Map) bool {
	var (
		tgid uint32
		proc gpuarbMemProc
	)
	it := procs.Iterate()
	for it.Next(&tgid, &proc) {
		if slices.ContainsFunc(proc.Charged[:], func(b uint64) bool { return b != 0 }) {
			return true
		}
	}
	return false
}
