package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// DefaultPinPath is where the daemon pins gpuarb's maps.
const DefaultPinPath = "/sys/fs/bpf/gpuarb"

// DefaultRingSize is the event ring buffer size in bytes.
const DefaultRingSize = 4 << 20

// pinnedMaps are the maps a pinned load exposes under the pin path.
var pinnedMaps = []string{"gpuarb_devices", "gpuarb_cgroups", "gpuarb_ctxs", "gpuarb_procs", "gpuarb_events", "gpuarb_lost",
	"gpuarb_gates", "gpuarb_gate_allow", gateKeysMap, heldMap, releasingMap, leaseMap, "gpuarb_trees"}

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
	// NoUprobeMulti attaches a uprobe per libcuda symbol even where the
	// kernel has uprobe_multi links.
	NoUprobeMulti bool
	// MaxLibcudas bounds the libcuda copies probed at once (each takes a
	// uprobe per entry point); 0 means DefaultMaxLibcudas. A copy beyond
	// it is refused and counted (RefusedLibcudas): a process that maps
	// only refused copies has no probed libcuda, and is held as one
	// whose launches nobody sees.
	MaxLibcudas int
}

// DefaultMaxLibcudas is the default bound on the libcuda copies probed:
// a host has one per driver install and container image that brings its
// own, tens at most; a tenant that makes copies without end (a memfd per
// process) must not make the daemon attach without end.
const DefaultMaxLibcudas = 256

// Probes owns gpuarb's BPF objects and links. Close releases them and
// leaves pins; Unpin removes the pins.
type Probes struct {
	objs    gpuarbObjects
	pinPath string

	mu       sync.Mutex
	links    []link.Link
	libcudas map[fileID]*libcudaProbe
	// notLibcuda are files named like libcuda that are not one.
	notLibcuda map[notLibcudaMark]struct{}
	// multi is set when the uprobe programs load for uprobe_multi links.
	multi bool
	// maxLibcudas bounds libcudas; refused counts the copies refused.
	maxLibcudas int
	refused     uint64

	gates gateTable
	// urgent are the processes in gpuarb_urgent, urgentCgroups the
	// cgroups in gpuarb_urgent_cgroups (SetUrgent).
	urgent        map[uint32]bool
	urgentCgroups map[uint64]bool
}

type fileID struct{ dev, ino uint64 }

// notLibcudaMark is a file found not to be a libcuda, as it was then: a
// file rewritten in place changes its size or modification time.
type notLibcudaMark struct {
	id    fileID
	size  int64
	mtime unix.Timespec
}

// maxNotLibcuda bounds the files remembered as not libcuda; the memory is
// dropped when full.
const maxNotLibcuda = 4096

// rememberNotLibcuda keeps a file from being parsed again at its next
// open. Called with p.mu held.
func (p *Probes) rememberNotLibcuda(m notLibcudaMark) {
	if len(p.notLibcuda) >= maxNotLibcuda {
		clear(p.notLibcuda)
	}
	p.notLibcuda[m] = struct{}{}
}

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

	p := &Probes{pinPath: opts.PinPath, libcudas: map[fileID]*libcudaProbe{}, notLibcuda: map[notLibcudaMark]struct{}{},
		maxLibcudas: opts.MaxLibcudas, urgent: map[uint32]bool{}, urgentCgroups: map[uint64]bool{}}
	if p.maxLibcudas <= 0 {
		p.maxLibcudas = DefaultMaxLibcudas
	}
	if !opts.NoUprobeMulti && features.HaveBPFLinkUprobeMulti() == nil {
		// One link per program for all of a libcuda's variants.
		for _, name := range uprobePrograms {
			spec.Programs[name].AttachType = ebpf.AttachTraceUprobeMulti
		}
		p.multi = true
	}
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
	fork, err := link.AttachTracing(link.TracingOptions{Program: p.objs.GpuarbProcessFork})
	if err != nil {
		return nil, fmt.Errorf("attach tp_btf/sched_process_fork: %w", err)
	}
	p.links = append(p.links, fork)
	waking, err := link.AttachTracing(link.TracingOptions{Program: p.objs.GpuarbSchedWaking})
	if err != nil {
		return nil, fmt.Errorf("attach tp_btf/sched_waking: %w", err)
	}
	p.links = append(p.links, waking)
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

// programs returns the programs a probed entry point attaches: its entry
// program and, for calls measured to their return, the return program.
func (p *Probes) programs(e EntryPoint) (entry, ret *ebpf.Program) {
	o := &p.objs
	switch e.Class {
	case ClassLaunch:
		if e.Func == gpuarbCudaFuncCU_LAUNCH_KERNEL_EX || e.Func == gpuarbCudaFuncCU_LAUNCH_KERNEL_EX_PTSZ {
			return o.GpuarbCuLaunchEx, nil
		}
		return o.GpuarbCuLaunch, nil
	case ClassGraphLaunch:
		return o.GpuarbCuGraphLaunch, nil
	case ClassEventRecord, ClassStreamWait, ClassCapture, ClassContextEnd:
		return o.GpuarbCuTwoArgs, nil
	case ClassSync:
		return o.GpuarbCuSync, o.GpuarbCuSyncRet
	case ClassQuery:
		return o.GpuarbCuQuery, o.GpuarbCuQueryRet
	case ClassContext:
		return o.GpuarbCuCtxCreate, o.GpuarbCuCtxCreateRet
	case ClassMemory:
		if strings.Contains(e.Symbol, "Free") {
			return o.GpuarbCuMemFree, nil
		}
		return o.GpuarbCuMemAlloc, o.GpuarbCuMemAllocRet
	case ClassCopy:
		return o.GpuarbCuCopy, nil
	}
	return nil, nil
}

// uprobePrograms are the programs attached to libcuda, by name in the
// collection spec: they load as uprobe_multi programs where the kernel
// has those links.
var uprobePrograms = []string{"gpuarb_cu_launch", "gpuarb_cu_launch_ex", "gpuarb_cu_graph_launch", "gpuarb_cu_two_args",
	"gpuarb_cu_copy", "gpuarb_cu_sync", "gpuarb_cu_sync_ret", "gpuarb_cu_query", "gpuarb_cu_query_ret",
	"gpuarb_cu_ctx_create", "gpuarb_cu_ctx_create_ret", "gpuarb_cu_mem_alloc", "gpuarb_cu_mem_alloc_ret",
	"gpuarb_cu_mem_free"}

// ErrNotLibcuda is returned by AttachLibcuda for a file that exports no
// kernel launch entry point of the CUDA driver API.
var ErrNotLibcuda = errors.New("not a libcuda: it exports no kernel launch entry point")

// ErrTooManyLibcudas is returned for a libcuda copy beyond
// Options.MaxLibcudas.
var ErrTooManyLibcudas = errors.New("too many libcuda copies probed already")

// RefusedLibcudas counts the libcuda copies refused because
// Options.MaxLibcudas were probed already.
func (p *Probes) RefusedLibcudas() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// attachment is one program attached to some symbols of a libcuda.
type attachment struct {
	prog    *ebpf.Program
	ret     bool
	symbols []string
	cookies []uint64
}

// AttachLibcuda attaches the uprobes to one libcuda copy: every probed
// entry point it exports, each variant with its number as the cookie. A
// copy already attached (same device and inode, under any path) is
// skipped: attached reports whether this call attached anything.
func (p *Probes) AttachLibcuda(path string) (attached bool, err error) {
	f, st, err := openLibcuda(path)
	if err != nil {
		return false, fmt.Errorf("libcuda %s: %w", path, err)
	}
	defer f.Close()
	return p.attachFile(f, st, path)
}

// AttachMapped finds libcuda copies by what they are, not by their name:
// every executable file mapping of process pid that exports a kernel
// launch entry point of the driver API is probed — a renamed copy, one
// loaded from a memfd or by a call the openat probe does not see. Each
// mapping is opened through /proc/PID/map_files (its very inode, deleted
// or not, without resolving a path) and only if it is a regular file.
// It returns how many copies it attached and whether the process maps a
// probed copy at all (one attached now or before): a process with GPU
// channels that maps none submits work no uprobe sees. A process that
// exits meanwhile is not an error (and maps nothing).
func (p *Probes) AttachMapped(pid int) (attached int, probed bool, err error) {
	maps, err := executableMappings(pid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return 0, false, nil
		}
		return 0, false, err
	}
	var errs []error
	for _, m := range maps {
		p.mu.Lock()
		_, known := p.libcudas[m.id]
		p.mu.Unlock()
		if known {
			probed = true
			continue
		}
		f, st, err := openMapping(pid, m.addr)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, ErrNotLibcuda) {
				errs = append(errs, err)
			}
			continue
		}
		ok, err := p.attachFile(f, st, fmt.Sprintf("%s (mapped by pid %d)", m.path, pid))
		f.Close()
		switch {
		case ok:
			attached++
			probed = true
		case err != nil && !errors.Is(err, ErrNotLibcuda) && !errors.Is(err, ErrTooManyLibcudas):
			errs = append(errs, err) // refusals are counted, not errors
		}
	}
	return attached, probed, errors.Join(errs...)
}

// attachFile attaches the uprobes to an opened libcuda candidate; path
// names it in errors and in Libcudas.
func (p *Probes) attachFile(f *os.File, st unix.Stat_t, path string) (attached bool, err error) {
	id := fileID{dev: st.Dev, ino: st.Ino}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.libcudas[id]; ok {
		return false, nil
	}
	notMark := notLibcudaMark{id: id, size: st.Size, mtime: st.Mtim}
	if _, ok := p.notLibcuda[notMark]; ok {
		return false, fmt.Errorf("libcuda %s: %w", path, ErrNotLibcuda)
	}
	// The file as opened, whatever its path resolves to by now.
	opened := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	exported, err := exportedFunctions(opened)
	if err != nil {
		p.rememberNotLibcuda(notMark)
		return false, fmt.Errorf("libcuda %s: %w", path, err)
	}
	has := map[string]bool{}
	for _, n := range exported {
		has[n] = true
	}
	var groups []*attachment
	byProg := map[*ebpf.Program]*attachment{}
	launches := 0
	for _, e := range EntryPoints {
		if e.Func == 0 || !has[e.Symbol] {
			continue
		}
		if e.Class == ClassLaunch {
			launches++
		}
		entry, ret := p.programs(e)
		for i, prog := range []*ebpf.Program{entry, ret} {
			if prog == nil {
				continue
			}
			a := byProg[prog]
			if a == nil {
				a = &attachment{prog: prog, ret: i == 1}
				byProg[prog] = a
				groups = append(groups, a)
			}
			a.symbols = append(a.symbols, e.Symbol)
			a.cookies = append(a.cookies, e.cookie())
		}
	}
	if launches == 0 {
		p.rememberNotLibcuda(notMark)
		return false, fmt.Errorf("libcuda %s: %w", path, ErrNotLibcuda)
	}
	if len(p.libcudas) >= p.maxLibcudas {
		p.refused++
		return false, fmt.Errorf("libcuda %s: %w (%d)", path, ErrTooManyLibcudas, p.maxLibcudas)
	}
	ex, err := link.OpenExecutable(opened)
	if err != nil {
		return false, fmt.Errorf("libcuda %s: %w", path, err)
	}
	probe := &libcudaProbe{path: path}
	for _, a := range groups {
		ls, err := p.attach(ex, a)
		probe.links = append(probe.links, ls...)
		if err != nil {
			return false, errors.Join(fmt.Errorf("libcuda %s: %w", path, err), closeLinks(probe.links))
		}
	}
	p.libcudas[id] = probe
	return true, nil
}

// attach attaches one program to its symbols: one uprobe_multi link where
// the kernel has them, else a uprobe per symbol.
func (p *Probes) attach(ex *link.Executable, a *attachment) ([]link.Link, error) {
	if p.multi {
		opts := &link.UprobeMultiOptions{Cookies: a.cookies}
		var l link.Link
		var err error
		if a.ret {
			l, err = ex.UretprobeMulti(a.symbols, a.prog, opts)
		} else {
			l, err = ex.UprobeMulti(a.symbols, a.prog, opts)
		}
		if err != nil {
			return nil, fmt.Errorf("uprobe_multi on %d symbols: %w", len(a.symbols), err)
		}
		return []link.Link{l}, nil
	}
	var ls []link.Link
	for i, sym := range a.symbols {
		opts := &link.UprobeOptions{Cookie: a.cookies[i]}
		var l link.Link
		var err error
		if a.ret {
			l, err = ex.Uretprobe(sym, a.prog, opts)
		} else {
			l, err = ex.Uprobe(sym, a.prog, opts)
		}
		if err != nil {
			return ls, fmt.Errorf("uprobe %s: %w", sym, err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// UprobeMulti tells whether libcuda is probed with uprobe_multi links.
func (p *Probes) UprobeMulti() bool { return p.multi }

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
