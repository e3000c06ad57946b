package ioctlspy

import "fmt"

// Managed memory (cudaMallocManaged) has no RM allocation the driver
// makes at the call: its address space is an mmap of a nvidia-uvm file,
// and its pages come and go on faults inside nvidia-uvm, which no syscall
// shows. A process's managed memory is reported as that reserved address
// space (an upper bound of what it can hold on any GPU), as the kernel
// mapped and unmapped it (ManagedMapped).

// ManagedMapped is an mmap of a nvidia-uvm file (a managed range), or,
// Unmap set, an munmap of a process that made one, as the kernel did it.
type ManagedMapped struct {
	Header
	Addr  uint64 `json:"addr"`
	Len   uint64 `json:"bytes"`
	Unmap bool   `json:"unmap,omitempty"`
	FD    int32  `json:"fd,omitempty"` // an mmap's descriptor
}

func (e *ManagedMapped) String() string {
	if e.Unmap {
		return fmt.Sprintf("munmap addr=0x%x bytes=%d", e.Addr, e.Len)
	}
	return fmt.Sprintf("nvidia-uvm mmap fd=%d addr=0x%x bytes=%d", e.FD, e.Addr, e.Len)
}

// maxManagedRanges bounds a process's managed ranges; one past it is not
// kept (its address space goes unreported).
const maxManagedRanges = 4096

// pageSize is what the kernel maps and unmaps in.
const pageSize = 4096

// mapManaged records a managed range of n bytes at addr.
func (p *Process) mapManaged(addr, n uint64) {
	n = (n + pageSize - 1) &^ (pageSize - 1)
	if n == 0 || addr+n < addr {
		return
	}
	// A mapping replaces whatever was mapped where it lands.
	p.unmapManaged(addr, n)
	if len(p.Managed) >= maxManagedRanges {
		return
	}
	if p.Managed == nil {
		p.Managed = map[uint64]uint64{}
	}
	p.Managed[addr] = n
}

// unmapManaged takes [addr, addr+n) off the process's managed ranges: a
// range it covers goes, one it cuts keeps what lies outside.
func (p *Process) unmapManaged(addr, n uint64) {
	n = (n + pageSize - 1) &^ (pageSize - 1)
	end := addr + n
	if n == 0 || end < addr {
		return
	}
	for start, size := range p.Managed {
		stop := start + size
		if stop <= addr || start >= end {
			continue
		}
		delete(p.Managed, start)
		if start < addr {
			p.Managed[start] = addr - start
		}
		if stop > end {
			p.Managed[end] = stop - end
		}
	}
}

// ManagedBytes is the address space the process holds as managed memory.
func (p Process) ManagedBytes() uint64 {
	var sum uint64
	for _, n := range p.Managed {
		sum += n
	}
	return sum
}

// Held sums what processes pids hold: the device memory and, apart, the
// pinned host memory on gpu, and the managed memory's address space, which
// is on no GPU in particular.
func (t *Table) Held(pids []uint32, gpu int) (device, host, managed uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, pid := range pids {
		p := t.procs[pid]
		if p == nil {
			continue
		}
		dev, h := p.MemoryByGPU()
		device, host, managed = device+dev[gpu], host+h[gpu], managed+p.ManagedBytes()
	}
	return device, host, managed
}
