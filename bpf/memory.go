package bpf

import (
	"errors"
	"fmt"
	"math"

	"github.com/cilium/ebpf"
)

// GPU memory limits hold a tenant's device memory at the driver boundary:
// the probes charge each device memory allocation its processes make
// (RM_ALLOC of a video memory class, RM_VID_HEAP_CONTROL) to the tenant's
// slot, per GPU, by the size the driver wrote back, and an allocation that
// would take a GPU's charge past the limit kills its process (SIGKILL at
// the ioctl's syscall exit, before it returns to user space: the cgroup
// OOM killer's semantics). An RM_FREE uncharges the allocation; a process's
// exit uncharges all it held. Tenants without a limit have no slot: their
// allocations pay one counter test (mem_members).

// MemorySlots is the number of memory limits the probes hold (MEM_SLOTS).
const MemorySlots = int(gpuarbGpuarbSizesMEM_SLOTS)

// MemoryGPUs is the number of GPUs a slot charges apart; an allocation on
// a device id at or past MemoryGPUs-1, or under a device the probes did not
// see made, is charged to GPU MemoryGPUs-1 (MEM_GPUS).
const MemoryGPUs = int(gpuarbGpuarbSizesMEM_GPUS)

// ErrNoMemorySlot is returned when every memory limit slot is in use.
var ErrNoMemorySlot = errors.New("no free GPU memory limit slot")

// Pinned names of the memory limit tables: members, limits (bytes, and
// shares of a GPU), charges, and
// the default limit's charges by cgroup.
const (
	memKeysMap    = "gpuarb_mem_keys"
	memLimitMap   = "gpuarb_mem_limit"
	memShareMap   = "gpuarb_mem_share"
	memUsageMap   = "gpuarb_mem_usage"
	memCgroupsMap = "gpuarb_mem_cgroups"
)

// MemoryLimit is one tenant's memory limit slot. Its methods are safe for
// concurrent use with the probes; one goroutine owns a limit.
type MemoryLimit struct {
	p *Probes
	memberSet
}

// MemoryUsage is what a memory limit slot has charged.
type MemoryUsage struct {
	// Charged is the device memory its tenant's processes hold, by GPU
	// (the device id; see MemoryGPUs).
	Charged map[int]uint64
	// Kills counts the processes killed at an allocation past the limit,
	// by GPU.
	Kills map[int]uint64
}

// NewMemoryLimit takes a free slot with no member and no limit, its charges
// zeroed.
func (p *Probes) NewMemoryLimit() (*MemoryLimit, error) {
	l := &MemoryLimit{p: p}
	err := p.memory.take(ErrNoMemorySlot, func(slot uint32) error {
		l.memberSet = newMemberSet(p.objs.GpuarbMemKeys, &p.memory, slot, "memory limit")
		// A new generation: what processes of the slot's last tenant
		// still hold is never uncharged from this one.
		var u gpuarbMemUsage
		if err := p.objs.GpuarbMemUsage.Lookup(slot, &u); err != nil {
			return fmt.Errorf("memory limit %d: read: %w", slot, err)
		}
		if err := p.objs.GpuarbMemUsage.Put(slot, gpuarbMemUsage{Gen: u.Gen + 1}); err != nil {
			return fmt.Errorf("memory limit %d: reset: %w", slot, err)
		}
		return l.SetLimit(0, 0)
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Slot is the limit's index in gpuarb_mem_limit and gpuarb_mem_usage.
func (l *MemoryLimit) Slot() uint32 { return l.slot }

// SetLimit holds each GPU's charge to bytes and to share of the GPU's
// memory (SetGPUMemorySize), the lower of those set where both are; 0 and
// 0: no limit, charges only. A share holds nothing on a GPU whose size is
// not set.
func (l *MemoryLimit) SetLimit(bytes uint64, share float64) error {
	ppm, err := sharePPM(share)
	if err != nil {
		return fmt.Errorf("memory limit %d: %w", l.slot, err)
	}
	// The share first: a limit lowered from bytes to a share never passes
	// through none.
	if err := l.p.objs.GpuarbMemShare.Put(l.slot, ppm); err != nil {
		return fmt.Errorf("memory limit %d: set share: %w", l.slot, err)
	}
	if err := l.p.objs.GpuarbMemLimit.Put(l.slot, bytes); err != nil {
		return fmt.Errorf("memory limit %d: set: %w", l.slot, err)
	}
	return nil
}

// sharePPM turns a share of a GPU's memory, in [0, 1], into the probes'
// parts per million.
func sharePPM(share float64) (uint32, error) {
	// !(in range), not (out of range): NaN fails every comparison.
	if !(share >= 0 && share <= 1) {
		return 0, fmt.Errorf("share %v of GPU memory out of [0, 1]", share)
	}
	return uint32(math.Round(share * 1e6)), nil
}

// SetGPUMemorySize tells the probes gpu's memory in bytes (device id; one
// at or past MemoryGPUs-1 sets the last), against which every limit given
// as a share holds there. It must come from the driver through the
// daemon's own call, never from a tenant's replies.
func (p *Probes) SetGPUMemorySize(gpu int, bytes uint64) error {
	if gpu < 0 {
		return fmt.Errorf("GPU memory size: gpu %d", gpu)
	}
	gpu = min(gpu, MemoryGPUs-1)
	p.memory.mu.Lock()
	defer p.memory.mu.Unlock()
	p.gpuMemory[gpu] = bytes
	if err := p.objs.MemGpuBytes.Set(p.gpuMemory); err != nil {
		return fmt.Errorf("GPU memory size of gpu %d: %w", gpu, err)
	}
	return nil
}

// SetMembers makes exactly these cgroups (with everything below them) and
// processes the limit's members.
func (l *MemoryLimit) SetMembers(cgroups []uint64, pids []int) error { return l.set(cgroups, pids) }

// Usage reads what the slot has charged.
func (l *MemoryLimit) Usage() (MemoryUsage, error) {
	var u gpuarbMemUsage
	if err := l.p.objs.GpuarbMemUsage.Lookup(l.slot, &u); err != nil {
		return MemoryUsage{}, fmt.Errorf("memory limit %d: read: %w", l.slot, err)
	}
	return usageOf(u), nil
}

// Close removes the limit's members and frees its slot. Processes it
// killed stay dead; nothing it charged is held by anyone.
func (l *MemoryLimit) Close() error {
	if l == nil || l.closed() {
		return nil
	}
	err := errors.Join(l.clear(), l.SetLimit(0, 0))
	l.p.memory.give(l.slot)
	return err
}

// SetDefaultMemoryLimit holds every process that no memory limit slot
// holds to bytes and share on each GPU (as MemoryLimit.SetLimit), charged
// by its own cgroup (the default tenant of that cgroup); 0 and 0 lift it.
// A limit set where there was none
// starts every cgroup's charges afresh (what was charged while no limit
// was in force was not uncharged as it was freed), unless an earlier
// daemon's limit left them in the pins.
func (p *Probes) SetDefaultMemoryLimit(bytes uint64, share float64) error {
	ppm, err := sharePPM(share)
	if err != nil {
		return fmt.Errorf("default GPU memory limit: %w", err)
	}
	p.memory.mu.Lock()
	defer p.memory.mu.Unlock()
	carried := p.defaultMemoryCarried
	p.defaultMemoryCarried = false
	was, now := p.defaultMemoryLimit != 0 || p.defaultMemoryShare != 0, bytes != 0 || ppm != 0
	if !was && now && !carried {
		var gen uint64
		if err := p.objs.MemCgroupGen.Get(&gen); err != nil {
			return fmt.Errorf("default GPU memory limit: %w", err)
		}
		if err := p.objs.MemCgroupGen.Set(gen + 1); err != nil {
			return fmt.Errorf("default GPU memory limit: %w", err)
		}
		if err := clearCgroupUsage(p.objs.GpuarbMemCgroups, func(uint64) bool { return true }); err != nil {
			return fmt.Errorf("default GPU memory limit: %w", err)
		}
	}
	if err := p.objs.MemDefaultShare.Set(ppm); err != nil {
		return fmt.Errorf("default GPU memory limit: %w", err)
	}
	if err := p.objs.MemDefaultLimit.Set(bytes); err != nil {
		return fmt.Errorf("default GPU memory limit: %w", err)
	}
	p.defaultMemoryLimit, p.defaultMemoryShare = bytes, ppm
	return nil
}

// DefaultMemoryUsage reads what the default limit has charged, by cgroup
// id.
func (p *Probes) DefaultMemoryUsage() (map[uint64]MemoryUsage, error) {
	var (
		id  uint64
		u   gpuarbMemUsage
		out = map[uint64]MemoryUsage{}
	)
	it := p.objs.GpuarbMemCgroups.Iterate()
	for it.Next(&id, &u) {
		out[id] = usageOf(u)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("default GPU memory limit: read: %w", err)
	}
	return out, nil
}

// ForgetMemoryCgroups drops the default limit's charges of the cgroups
// gone says are gone (no process of theirs can allocate again).
func (p *Probes) ForgetMemoryCgroups(gone func(id uint64) bool) error {
	if err := clearCgroupUsage(p.objs.GpuarbMemCgroups, gone); err != nil {
		return fmt.Errorf("default GPU memory limit: %w", err)
	}
	return nil
}

func clearCgroupUsage(m *ebpf.Map, drop func(id uint64) bool) error {
	var (
		id   uint64
		u    gpuarbMemUsage
		keys []uint64
	)
	it := m.Iterate()
	for it.Next(&id, &u) {
		if drop(id) {
			keys = append(keys, id)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read cgroup charges: %w", err)
	}
	for _, id := range keys {
		if err := m.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("drop cgroup %d's charges: %w", id, err)
		}
	}
	return nil
}

// usageOf reads a slot's or a cgroup's charges.
func usageOf(u gpuarbMemUsage) MemoryUsage {
	out := MemoryUsage{Charged: map[int]uint64{}, Kills: map[int]uint64{}}
	for gpu, n := range u.Kills {
		if n != 0 {
			out.Kills[gpu] = n
		}
	}
	for gpu, b := range u.Charged {
		// A free racing a charge of another thread can leave a transient
		// wrap below zero; it reads as nothing held.
		if b != 0 && b < 1<<63 {
			out.Charged[gpu] = b
		}
	}
	return out
}
