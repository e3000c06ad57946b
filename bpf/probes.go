package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// DefaultPinPath is where the daemon pins gpuarb's maps.
const DefaultPinPath = "/sys/fs/bpf/gpuarb"

// DefaultRingSize is the event ring buffer size in bytes.
const DefaultRingSize = 4 << 20

// pinnedMaps are the maps a pinned load exposes under the pin path.
var pinnedMaps = []string{"gpuarb_devices", "gpuarb_cgroups", "gpuarb_ctxs", "gpuarb_procs", "gpuarb_events", "gpuarb_lost",
	"gpuarb_gates", "gpuarb_gate_allow", gateKeysMap, heldMap}

// wakeupBytes is the backlog at which a submit wakes the reader: an eighth
// of the ring, at most 64 KiB.
func wakeupBytes(ring uint32) uint32 { return min(ring/8, 64<<10) }

// PollInterval is how often a reader must look at the ring buffer: records
// are submitted without waking the reader until a backlog builds up.
const PollInterval = 5 * time.Millisecond

// Options configure Load.
type Options struct {
	// PinPath pins the public maps there when set; empty loads unpinned.
	PinPath string
	// RingSize is the ring buffer size in bytes (a power of two, a
	// multiple of the page size); 0 means DefaultRingSize.
	RingSize uint32
	// Devices seed the device table.
	Devices []Device
}

// Probes owns gpuarb's BPF objects and links. Close releases them and
// leaves pins; Unpin removes the pins.
type Probes struct {
	objs    gpuarbObjects
	pinPath string

	mu       sync.Mutex
	links    []link.Link
	libcudas map[fileID]*libcudaProbe

	gates gateTable
}

type fileID struct{ dev, ino uint64 }

type libcudaProbe struct {
	path  string
	links []link.Link
}

// Load loads the programs, seeds the device table and attaches the
// tracepoints. Uprobes are attached per libcuda copy with AttachLibcuda.
func Load(opts Options) (_ *Probes, err error) {
	spec, err := loadGpuarb()
	if err != nil {
		return nil, fmt.Errorf("load bpf spec: %w", err)
	}
	ring := opts.RingSize
	if ring == 0 {
		ring = DefaultRingSize
	}
	spec.Maps["gpuarb_events"].MaxEntries = ring
	if err := spec.Variables["wakeup_bytes"].Set(uint64(wakeupBytes(ring))); err != nil {
		return nil, fmt.Errorf("set wakeup threshold: %w", err)
	}

	var collOpts ebpf.CollectionOptions
	if opts.PinPath != "" {
		if strings.Contains(filepath.Base(opts.PinPath), ".") {
			return nil, fmt.Errorf("pin path %s: bpffs does not allow '.' in names", opts.PinPath)
		}
		if err := os.MkdirAll(opts.PinPath, 0o700); err != nil {
			return nil, fmt.Errorf("create pin path: %w", err)
		}
		for _, name := range pinnedMaps {
			spec.Maps[name].Pinning = ebpf.PinByName
		}
		collOpts.Maps.PinPath = opts.PinPath
	}

	p := &Probes{pinPath: opts.PinPath, libcudas: map[fileID]*libcudaProbe{}}
	if err := spec.LoadAndAssign(&p.objs, &collOpts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load bpf objects: %+v", verr)
		}
		return nil, fmt.Errorf("load bpf objects: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
		}
	}()

	if err := p.clearGateMembers(); err != nil {
		return nil, err
	}
	for _, d := range opts.Devices {
		if err := p.SetDevice(d); err != nil {
			return nil, err
		}
	}
	tps := []struct {
		group, name string
		prog        *ebpf.Program
	}{
		{"syscalls", "sys_enter_ioctl", p.objs.GpuarbIoctlEnter},
		{"syscalls", "sys_exit_ioctl", p.objs.GpuarbIoctlExit},
		{"syscalls", "sys_enter_openat", p.objs.GpuarbOpenat},
		{"sched", "sched_process_exit", p.objs.GpuarbProcessExit},
	}
	for _, tp := range tps {
		l, err := link.Tracepoint(tp.group, tp.name, tp.prog, nil)
		if err != nil {
			return nil, fmt.Errorf("attach tracepoint %s/%s: %w", tp.group, tp.name, err)
		}
		p.links = append(p.links, l)
	}
	return p, nil
}

// SetDevice adds or replaces one entry of the device table.
func (p *Probes) SetDevice(d Device) error {
	key := gpuarbDevKey{Major: d.Major, Minor: d.Minor}
	if d.AnyMinor {
		key.Minor = anyMinor
	}
	if err := p.objs.GpuarbDevices.Put(key, gpuarbDevEntry{Kind: uint32(d.Kind)}); err != nil {
		return fmt.Errorf("device table: add %s: %w", d, err)
	}
	return nil
}

// EventsMap is the ring buffer of event records.
func (p *Probes) EventsMap() *ebpf.Map { return p.objs.GpuarbEvents }

// Lost returns how many events could not be reserved on the ring buffer.
func (p *Probes) Lost() (uint64, error) {
	var v gpuarbLostCounter
	if err := p.objs.GpuarbLost.Lookup(uint32(0), &v); err != nil {
		return 0, fmt.Errorf("read lost counter: %w", err)
	}
	return v.Events, nil
}

// CgroupStats are the per-cgroup counters kept in the kernel.
type CgroupStats = gpuarbCgroupStats

// Cgroups returns the per-cgroup counters by cgroup id.
func (p *Probes) Cgroups() (map[uint64]CgroupStats, error) {
	out := map[uint64]CgroupStats{}
	var (
		id uint64
		st CgroupStats
	)
	it := p.objs.GpuarbCgroups.Iterate()
	for it.Next(&id, &st) {
		out[id] = st
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate cgroup counters: %w", err)
	}
	return out, nil
}

// ContextCount returns the number of live GPU objects in the context table.
func (p *Probes) ContextCount() (int, error) {
	var (
		k gpuarbCtxKey
		v gpuarbCtxInfo
		n int
	)
	it := p.objs.GpuarbCtxs.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterate context table: %w", err)
	}
	return n, nil
}

// uprobeTargets are the libcuda symbols probed, with entry and return programs.
func (p *Probes) uprobeTargets() []struct {
	sym      string
	entry    *ebpf.Program
	ret      *ebpf.Program
	required bool
} {
	o := &p.objs
	return []struct {
		sym      string
		entry    *ebpf.Program
		ret      *ebpf.Program
		required bool
	}{
		{"cuLaunchKernel", o.GpuarbCuLaunch, nil, true},
		{"cuLaunchKernelEx", o.GpuarbCuLaunchEx, nil, false},
		{"cuLaunchCooperativeKernel", o.GpuarbCuLaunchCoop, nil, false},
		{"cuGraphLaunch", o.GpuarbCuGraphLaunch, nil, false},
		{"cuMemcpyHtoD_v2", o.GpuarbCuMemcpyHtod, nil, false},
		{"cuMemcpyDtoH_v2", o.GpuarbCuMemcpyDtoh, nil, false},
		{"cuMemcpyHtoDAsync_v2", o.GpuarbCuMemcpyHtodAsync, nil, false},
		{"cuMemcpyDtoHAsync_v2", o.GpuarbCuMemcpyDtohAsync, nil, false},
		{"cuMemsetD8_v2", o.GpuarbCuMemset, nil, false},
		{"cuMemsetD8Async", o.GpuarbCuMemsetAsync, nil, false},
		{"cuStreamSynchronize", o.GpuarbCuStreamSync, o.GpuarbCuStreamSyncRet, false},
		{"cuCtxSynchronize", o.GpuarbCuCtxSync, o.GpuarbCuCtxSyncRet, false},
		{"cuEventSynchronize", o.GpuarbCuEventSync, o.GpuarbCuEventSyncRet, false},
		{"cuEventRecord", o.GpuarbCuEventRecord, nil, false},
		{"cuCtxCreate_v2", o.GpuarbCuCtxCreate, o.GpuarbCuCtxCreateRet, false},
		{"cuCtxDestroy_v2", o.GpuarbCuCtxDestroy, nil, false},
		{"cuMemAlloc_v2", o.GpuarbCuMemAlloc, o.GpuarbCuMemAllocRet, false},
		{"cuMemFree_v2", o.GpuarbCuMemFree, nil, false},
	}
}

// ErrNotLibcuda is returned by AttachLibcuda for a file without cuLaunchKernel.
var ErrNotLibcuda = errors.New("not a libcuda: no cuLaunchKernel symbol")

// AttachLibcuda attaches the uprobes to one libcuda copy. A copy already
// attached (same device and inode, under any path) is skipped: attached
// reports whether this call attached anything.
func (p *Probes) AttachLibcuda(path string) (attached bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, fmt.Errorf("libcuda %s: %w", path, err)
	}
	id := fileID{dev: st.Dev, ino: st.Ino}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.libcudas[id]; ok {
		return false, nil
	}
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return false, fmt.Errorf("libcuda %s: %w", path, err)
	}
	probe := &libcudaProbe{path: path}
	for _, t := range p.uprobeTargets() {
		l, err := ex.Uprobe(t.sym, t.entry, nil)
		if err != nil {
			if t.required {
				closeLinks(probe.links)
				if errors.Is(err, link.ErrNoSymbol) {
					return false, fmt.Errorf("libcuda %s: %w", path, ErrNotLibcuda)
				}
				return false, fmt.Errorf("libcuda %s: uprobe %s: %w", path, t.sym, err)
			}
			continue
		}
		probe.links = append(probe.links, l)
		if t.ret == nil {
			continue
		}
		rl, err := ex.Uretprobe(t.sym, t.ret, nil)
		if err != nil {
			closeLinks(probe.links)
			return false, fmt.Errorf("libcuda %s: uretprobe %s: %w", path, t.sym, err)
		}
		probe.links = append(probe.links, rl)
	}
	p.libcudas[id] = probe
	return true, nil
}

// Libcudas lists the paths of the libcuda copies with attached uprobes.
func (p *Probes) Libcudas() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.libcudas))
	for _, l := range p.libcudas {
		out = append(out, l.path)
	}
	return out
}

func closeLinks(ls []link.Link) error {
	var errs []error
	for _, l := range ls {
		if err := l.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close detaches every program and closes the objects; pins stay. It is
// safe on a nil or partly loaded Probes.
func (p *Probes) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for id, l := range p.libcudas {
		errs = append(errs, closeLinks(l.links))
		delete(p.libcudas, id)
	}
	errs = append(errs, closeLinks(p.links))
	p.links = nil
	errs = append(errs, p.objs.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close probes: %w", err)
	}
	return nil
}

// Unpin removes the pins a pinned load created.
func (p *Probes) Unpin() error {
	if p == nil || p.pinPath == "" {
		return nil
	}
	return RemovePins(p.pinPath)
}

// RemovePins removes gpuarb's pins under dir and dir itself when empty.
func RemovePins(dir string) error {
	var errs []error
	for _, name := range pinnedMaps {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove pins: %w", err)
	}
	return nil
}

// PinnedMaps lists the maps pinned under a pin path, in a fixed order.
func PinnedMaps() []string { return append([]string(nil), pinnedMaps...) }

// EventSize is the size of one ring-buffer record (struct event).
func EventSize() int { return int(unsafe.Sizeof(gpuarbEvent{})) }

// EventOffset returns the offset of a field of struct event by its C name,
// or -1; decoders use it to check their layout.
func EventOffset(field string) int {
	var e gpuarbEvent
	switch field {
	case "args":
		return int(unsafe.Offsetof(e.Args))
	case "arg":
		return int(unsafe.Offsetof(e.Arg))
	case "params":
		return int(unsafe.Offsetof(e.Params))
	case "path":
		return int(unsafe.Offsetof(e.Path))
	case "comm":
		return int(unsafe.Offsetof(e.Comm))
	case "arg_len":
		return int(unsafe.Offsetof(e.ArgLen))
	case "flags":
		return int(unsafe.Offsetof(e.Flags))
	}
	return -1
}
