package bpf

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/cgroup"
)

// DefaultPinPath is where the daemon pins gpuarb's maps.
const DefaultPinPath = "/sys/fs/bpf/gpuarb"

// DefaultRingSize is the event ring buffer size in bytes.
const DefaultRingSize = 4 << 20

// pinnedMaps are the maps a pinned load exposes under the pin path.
var pinnedMaps = []string{"gpuarb_devices", "gpuarb_cgroups", "gpuarb_ctxs", "gpuarb_procs", "gpuarb_events", "gpuarb_lost",
	"gpuarb_gates", "gpuarb_gate_allow", gateKeysMap, heldMap, releasingMap, leaseMap, "gpuarb_trees",
	memKeysMap, memLimitMap, memShareMap, memUsageMap, memCgroupsMap, memProcsMap, memObjsMap, memDevsMap}

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
// leaves pins; Unpin removes them.
type Probes struct {
	objs    gpuarbObjects
	pinPath string

	// mu guards the libcuda bookkeeping below, never held while a file is
	// read or a probe attached (a tenant's file can be slow to read).
	mu       sync.Mutex
	links    []link.Link
	libcudas map[fileID]*libcudaProbe
	// attaching are the copies being read or attached now, outside mu;
	// reserved counts those of them within the bounds, about to be
	// probed.
	attaching map[fileID]bool
	reserved  int
	// notLibcuda are files named like libcuda that are not one.
	notLibcuda map[notLibcudaMark]struct{}
	// readExports reads a copy's exported symbols (the package's
	// readExports; a test makes it slow to show that no one waits on it).
	readExports func(r io.ReaderAt, size int64) ([]export, error)
	// multi is set when the uprobe programs load for uprobe_multi links.
	multi bool
	// maxLibcudas bounds libcudas; refused counts the copies refused.
	maxLibcudas int
	refused     uint64

	// gates and memory allocate launch gate and memory limit slots.
	gates, memory slotTable
	// defaultMemoryLimit is mem_default_limit as last set, under memory.mu;
	// defaultMemoryCarried tells that the default limit's charges in the
	// pins are an earlier daemon's, in force.
	defaultMemoryLimit   uint64
	defaultMemoryShare   uint32 // mem_default_share, ppm
	defaultMemoryCarried bool
	// gpuMemory is mem_gpu_bytes as last set, under memory.mu.
	gpuMemory [MemoryGPUs]uint64
	// memHeldOver are the memory limit slots an earlier daemon left with
	// their members, under memory.mu (memory_carry.go).
	memHeldOver map[uint32][]gpuarbGateKey
	// urgentMu guards urgent, the processes in gpuarb_urgent, and
	// urgentCgroups, the cgroups in gpuarb_urgent_cgroups (SetUrgent).
	urgentMu      sync.Mutex
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

// libcudaProbe is one probed libcuda copy: its links, the cgroup of the
// process it was found mapped by (0: the operator's or the host's), and
// the processes known to map it, by pid and start time (users beyond
// maxUsers are not tracked: such a copy is never pruned).
type libcudaProbe struct {
	path   string
	links  []link.Link
	cgroup uint64
	users  map[int]uint64
}

// maxLibcudasPerCgroup bounds the copies found mapped by the processes of
// one cgroup: a tenant that maps copy after copy fills its own budget,
// not the host's (DefaultMaxLibcudas).
const maxLibcudasPerCgroup = 16

// maxUsers bounds the processes remembered per probed copy.
const maxUsers = 64

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

	p := &Probes{pinPath: opts.PinPath, libcudas: map[fileID]*libcudaProbe{}, attaching: map[fileID]bool{},
		notLibcuda: map[notLibcudaMark]struct{}{}, maxLibcudas: opts.MaxLibcudas, urgent: map[uint32]bool{}, urgentCgroups: map[uint64]bool{},
		readExports: readExports}
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

	p.gates = newSlotTable(GateSlots, p.objs.GateMembers)
	p.memory = newSlotTable(MemorySlots, p.objs.MemMembers)
	if err := p.clearGateMembers(); err != nil {
		return nil, err
	}
	if err := p.holdOverMemoryLimits(); err != nil {
		return nil, err
	}
	if err := p.reconcileMemoryCharges(); err != nil {
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
		{"syscalls", "sys_enter_mmap", p.objs.GpuarbMmapEnter},
		{"syscalls", "sys_exit_mmap", p.objs.GpuarbMmapExit},
		{"syscalls", "sys_enter_munmap", p.objs.GpuarbMunmapEnter},
		{"syscalls", "sys_exit_munmap", p.objs.GpuarbMunmapExit},
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
	signals, err := link.AttachTracing(link.TracingOptions{Program: p.objs.GpuarbSignalGenerate})
	if err != nil {
		return nil, fmt.Errorf("attach tp_btf/signal_generate: %w", err)
	}
	p.links = append(p.links, signals)
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

// attachment is one program attached to some entry points of a libcuda:
// their names, file offsets and cookies.
type attachment struct {
	prog    *ebpf.Program
	ret     bool
	symbols []string
	offsets []uint64
	cookies []uint64
}

// AttachLibcuda attaches the uprobes to a libcuda the operator names
// (--libcuda) or the host's linker cache lists: every probed entry point
// it exports, each variant with its number as the cookie. A copy already
// attached (same device and inode, under any path) is skipped: attached
// reports whether this call attached anything. Tenants' copies are found
// by what their processes map (AttachMapped), never by a path.
func (p *Probes) AttachLibcuda(path string) (attached bool, err error) {
	f, st, err := openLibcuda(path)
	if err != nil {
		return false, fmt.Errorf("libcuda %s: %w", path, err)
	}
	defer f.Close()
	return p.attachFile(f, st, path, 0, 0)
}

// AttachHost probes the libcuda copies the host's linker cache lists and
// those running processes map (by mapping, as AttachMapped does, for the
// processes that map a file named libcuda*); it returns what failed.
func (p *Probes) AttachHost() error {
	var errs []error
	for _, path := range LinkerCacheLibcudas() {
		if _, err := p.AttachLibcuda(path); err != nil {
			errs = append(errs, err)
		}
	}
	for _, pid := range processes() {
		if len(mappedLibcudaNames(pid)) == 0 {
			continue
		}
		if _, _, err := p.AttachMapped(pid, processCgroupID(pid)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// processCgroupID is the cgroup v2 id of a process (0 when unknown).
func processCgroupID(pid int) uint64 {
	mount, err := cgroup.UnifiedMount()
	if err != nil {
		return 0
	}
	rel, err := cgroup.ProcessPath(pid)
	if err != nil {
		return 0
	}
	id, _ := cgroup.ID(filepath.Join(mount, rel))
	return id
}

// AttachMapped finds libcuda copies by what they are, not by their name:
// every executable file mapping of process pid (of cgroup cgroupID) that
// exports a kernel launch entry point of the driver API is probed — a
// renamed copy, one loaded from a memfd or by a call no probe sees. Each
// mapping is opened through /proc/PID/map_files (its very inode, deleted
// or not, without resolving a path) and only if it is a regular file on a
// local filesystem (openRegular). It returns how many copies it attached
// and whether the process maps a probed copy at all (one attached now or
// before): a process with GPU channels that maps none submits work no
// uprobe sees. A process that exits meanwhile is not an error (and maps
// nothing). A cgroup's processes get at most maxLibcudasPerCgroup copies
// probed.
func (p *Probes) AttachMapped(pid int, cgroupID uint64) (attached int, probed bool, err error) {
	maps, err := executableMappings(pid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return 0, false, nil
		}
		return 0, false, err
	}
	start, _ := cgroup.StartTime(pid)
	var errs []error
	for _, m := range maps {
		p.mu.Lock()
		known := p.libcudas[m.id]
		if known != nil {
			known.addUser(pid, start)
		}
		p.mu.Unlock()
		if known != nil {
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
		ok, err := p.attachFile(f, st, fmt.Sprintf("%s (mapped by pid %d)", m.path, pid), cgroupID, pid)
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

// addUser remembers that process pid (started at start) maps the copy.
// Called with p.mu held.
func (l *libcudaProbe) addUser(pid int, start uint64) {
	if l.users != nil && len(l.users) < maxUsers {
		l.users[pid] = start
	} else if l.users != nil && l.users[pid] == 0 {
		l.users = nil // too many to track: never pruned
	}
}

// inUse tells whether a process known to map the copy still runs. Copies
// of the operator and the host, and those with untracked users, always
// are.
func (l *libcudaProbe) inUse() bool {
	if l.cgroup == 0 || l.users == nil {
		return true
	}
	for pid, start := range l.users {
		if s, err := cgroup.StartTime(pid); err == nil && s == start {
			return true
		}
	}
	return false
}

// attachFile attaches the uprobes to an opened libcuda candidate; path
// names it in errors and in Libcudas, cgroupID is the cgroup it was found
// mapped in (0: the operator's or the host's) and pid the process that
// maps it (0: none). The file is read (readExports) and the probes
// attached without p.mu: a slow file delays no one but its own attach.
func (p *Probes) attachFile(f *os.File, st unix.Stat_t, path string, cgroupID uint64, pid int) (attached bool, err error) {
	id := fileID{dev: st.Dev, ino: st.Ino}
	notMark := notLibcudaMark{id: id, size: st.Size, mtime: st.Mtim}
	if claimed, err := p.claim(id, notMark, path); !claimed || err != nil {
		return false, err
	}
	defer func() {
		p.mu.Lock()
		delete(p.attaching, id)
		p.mu.Unlock()
	}()
	exports, err := p.readExports(f, st.Size)
	if err != nil {
		p.mu.Lock()
		p.rememberNotLibcuda(notMark)
		p.mu.Unlock()
		return false, fmt.Errorf("libcuda %s: %w: %w", path, ErrNotLibcuda, err)
	}
	groups, launches := p.attachments(exports)
	if launches == 0 {
		p.mu.Lock()
		p.rememberNotLibcuda(notMark)
		p.mu.Unlock()
		return false, fmt.Errorf("libcuda %s: %w", path, ErrNotLibcuda)
	}
	if err := p.reserve(path, cgroupID); err != nil {
		return false, err
	}
	probe := &libcudaProbe{path: path, cgroup: cgroupID, users: map[int]uint64{}}
	defer func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.reserved--
		if attached {
			p.libcudas[id] = probe
		}
	}()
	if pid != 0 {
		start, _ := cgroup.StartTime(pid)
		probe.addUser(pid, start)
	}
	// The file as opened, whatever its path resolves to by now.
	ex, err := link.OpenExecutable(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return false, fmt.Errorf("libcuda %s: %w", path, err)
	}
	for _, a := range groups {
		ls, err := p.attach(ex, a)
		probe.links = append(probe.links, ls...)
		if err != nil {
			return false, errors.Join(fmt.Errorf("libcuda %s: %w", path, err), closeLinks(probe.links))
		}
	}
	return true, nil
}

// claim marks a copy as being attached, unless it is probed or being
// attached already (false, nil) or known to be no libcuda.
func (p *Probes) claim(id fileID, notMark notLibcudaMark, path string) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.libcudas[id] != nil || p.attaching[id] {
		return false, nil
	}
	if _, ok := p.notLibcuda[notMark]; ok {
		return false, fmt.Errorf("libcuda %s: %w", path, ErrNotLibcuda)
	}
	p.attaching[id] = true
	return true, nil
}

// reserve takes a place for a libcuda about to be probed, within the
// bounds: the host's maxLibcudas (copies nothing maps any more are pruned
// first) and, for a copy found mapped in a cgroup, maxLibcudasPerCgroup.
// A copy over them is refused and counted.
func (p *Probes) reserve(path string, cgroupID uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cgroupID != 0 {
		n := 0
		for _, l := range p.libcudas {
			if l.cgroup == cgroupID {
				n++
			}
		}
		if n >= maxLibcudasPerCgroup {
			p.refused++
			return fmt.Errorf("libcuda %s: %w (%d for its cgroup)", path, ErrTooManyLibcudas, maxLibcudasPerCgroup)
		}
	}
	if len(p.libcudas)+p.reserved >= p.maxLibcudas {
		p.pruneLocked()
	}
	if len(p.libcudas)+p.reserved >= p.maxLibcudas {
		p.refused++
		return fmt.Errorf("libcuda %s: %w (%d)", path, ErrTooManyLibcudas, p.maxLibcudas)
	}
	p.reserved++
	return nil
}

// pruneLocked detaches the probed copies no running process is known to
// map. Called with p.mu held.
func (p *Probes) pruneLocked() {
	for id, l := range p.libcudas {
		if !l.inUse() {
			_ = closeLinks(l.links)
			delete(p.libcudas, id)
		}
	}
}

// attachments groups the probed entry points a copy exports by program:
// what attach attaches, at the entry points' file offsets; launches counts
// the kernel launch entry points among them.
func (p *Probes) attachments(exports []export) (groups []*attachment, launches int) {
	offset := make(map[string]uint64, len(exports))
	for _, e := range exports {
		offset[e.name] = e.offset
	}
	byProg := map[*ebpf.Program]*attachment{}
	for _, e := range EntryPoints {
		off, ok := offset[e.Symbol]
		if e.Func == 0 || !ok {
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
			a.offsets = append(a.offsets, off)
			a.cookies = append(a.cookies, e.cookie())
		}
	}
	return groups, launches
}

// attach attaches one program to its entry points, by their file offsets
// (the uprobe library reads no symbol table): one uprobe_multi link where
// the kernel has them, else a uprobe per entry point.
func (p *Probes) attach(ex *link.Executable, a *attachment) ([]link.Link, error) {
	if p.multi {
		opts := &link.UprobeMultiOptions{Addresses: a.offsets, Cookies: a.cookies}
		var l link.Link
		var err error
		if a.ret {
			l, err = ex.UretprobeMulti(nil, a.prog, opts)
		} else {
			l, err = ex.UprobeMulti(nil, a.prog, opts)
		}
		if err != nil {
			return nil, fmt.Errorf("uprobe_multi on %d entry points: %w", len(a.symbols), err)
		}
		return []link.Link{l}, nil
	}
	var ls []link.Link
	for i, sym := range a.symbols {
		opts := &link.UprobeOptions{Address: a.offsets[i], Cookie: a.cookies[i]}
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

// Unpin removes the pins a pinned load created; keepMemory keeps the
// memory tables (while a limited process holds charged memory, HoldsMemory)
// for the next daemon to carry on (memory_carry.go).
func (p *Probes) Unpin(keepMemory bool) error {
	if p == nil || p.pinPath == "" {
		return nil
	}
	var keep []string
	if keepMemory {
		keep = memoryPins
	}
	return removePins(p.pinPath, keep)
}

// RemovePins removes gpuarb's pins under dir and dir itself when empty.
func RemovePins(dir string) error { return removePins(dir, nil) }

// removePins removes gpuarb's pins under dir but those named in keep, and
// dir itself when empty.
func removePins(dir string, keep []string) error {
	var errs []error
	for _, name := range pinnedMaps {
		if slices.Contains(keep, name) {
			continue
		}
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
