package ioctlspy

import (
	"slices"
	"sort"
	"sync"

	"golang.org/x/sys/unix"
)

// ObjectKey names an RM object: handles are unique per client.
type ObjectKey struct {
	Client uint32
	Handle uint32
}

// Channel is a GPU channel of a process: an nvidia GPFIFO channel (with the
// work submit token its doorbell takes) or a nouveau channel.
type Channel struct {
	Class  uint32 `json:"class"`
	Parent uint32 `json:"parent"`
	Token  uint32 `json:"token"`
}

// TSG is a channel group: the unit the GPU's scheduler time-slices.
type TSG struct {
	Device uint32 `json:"device"` // its parent, a device object
	Engine uint32 `json:"engine"` // NV2080_ENGINE_TYPE (GR0 = 1)
}

// Process is what the table knows of one process using a GPU.
type Process struct {
	PID      uint32 `json:"pid"`
	Comm     string `json:"comm"`
	CgroupID uint64 `json:"cgroup_id"`
	// Contexts maps a CUDA context to its GPU: the device id of its channel
	// group's device, or the device ordinal its call named where no group
	// was seen.
	Contexts map[uint64]int32 `json:"contexts"`
	// Threads maps a thread to the context its cuCtxCreate made current
	// on it (at most maxThreads), Made is the first context so made (0:
	// none): what the meter routes a thread's events by.
	Threads map[uint32]uint64 `json:"-"`
	Made    uint64            `json:"-"`
	// Primary is the first primary context it retained (0: none);
	// PrimaryThreads maps a thread that retained another GPU's primary
	// context (the runtime's cudaSetDevice) to that one: the meter's
	// routing of a runtime-API process on several GPUs.
	Primary        uint64            `json:"-"`
	PrimaryThreads map[uint32]uint64 `json:"-"`
	// Clients are its RM clients, each with the control file it was
	// allocated on (the driver binds it to that file).
	Clients    map[uint32]ClientFile `json:"-"`
	TSGs       map[ObjectKey]TSG     `json:"-"`
	Channels   map[ObjectKey]Channel `json:"-"`
	Subdevices map[ObjectKey]uint32  `json:"-"` // subdevice -> its device
	Devices    map[ObjectKey]uint32  `json:"-"` // device object -> the GPU it opens (deviceId)
	Nouveau    map[int32]bool        `json:"-"` // nouveau channel ids
	// Memory are its device memory allocations the driver made.
	Memory map[ObjectKey]MemoryObject `json:"-"`
	// Managed are its managed ranges, address to length (nil: none).
	Managed  map[uint64]uint64 `json:"-"`
	Launches uint64            `json:"launches"`
	LastSeen uint64            `json:"last_seen_ns"`
	// groupGPU is the GPU of the channel group each thread allocated
	// last, until the context the group belongs to is made (at most
	// maxThreads threads; made lazily, never copied).
	groupGPU map[uint32]uint32
}

// MemoryObject is a device memory allocation: its size and its GPU (the
// device id, as MemoryAllocated.GPU).
type MemoryObject struct {
	Bytes  uint64
	GPU    uint32
	Parent uint32 // the device or subdevice it was allocated under
	Host   bool   // pinned host memory, not device memory
}

// MemoryByGPU sums the process's device memory and, apart, its pinned host
// memory, by GPU.
func (p Process) MemoryByGPU() (device, host map[int]uint64) {
	device, host = map[int]uint64{}, map[int]uint64{}
	for _, m := range p.Memory {
		if m.Host {
			host[int(m.GPU)] += m.Bytes
		} else {
			device[int(m.GPU)] += m.Bytes
		}
	}
	return device, host
}

// ClientFile is the control file an RM client was allocated on: its
// descriptor in the process then, and the file itself (inode and
// filesystem), which a duplicate of that descriptor must still be.
type ClientFile struct {
	FD   int32
	File FileID
}

// Group is one channel group of a process, with what steering it needs:
// its client's control file (the descriptor it has in the process, the
// file it must be), the subdevice of its device and its channels.
type Group struct {
	PID       uint32
	FD        int32
	File      FileID
	GPU       uint32 // the device's deviceId: its GPU
	Client    uint32
	TSG       uint32
	Engine    uint32
	Subdevice uint32 // 0: none seen
	Channels  []uint32
}

// Groups returns the process's channel groups on the graphics engine that
// have channels, ordered by handle; in time linear in its objects.
func (p Process) Groups() []Group {
	channels := map[ObjectKey][]uint32{} // by their group
	for ck, ch := range p.Channels {
		k := ObjectKey{ck.Client, ch.Parent}
		channels[k] = append(channels[k], ck.Handle)
	}
	subdevices := map[ObjectKey]uint32{} // by their device
	for sk, dev := range p.Subdevices {
		subdevices[ObjectKey{sk.Client, dev}] = sk.Handle
	}
	var out []Group
	for k, t := range p.TSGs {
		cf, ok := p.Clients[k.Client]
		if !ok || t.Engine != engineGR0 || len(channels[k]) == 0 {
			continue
		}
		g := Group{PID: p.PID, FD: cf.FD, File: cf.File, Client: k.Client, TSG: k.Handle, Engine: t.Engine,
			GPU: p.Devices[ObjectKey{k.Client, t.Device}], Subdevice: subdevices[ObjectKey{k.Client, t.Device}],
			Channels: channels[k]}
		slices.Sort(g.Channels)
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TSG < out[j].TSG })
	return out
}

// objects counts the RM objects the table keeps of a process.
func (p *Process) objects() int {
	return len(p.Clients) + len(p.TSGs) + len(p.Channels) + len(p.Subdevices) + len(p.Devices)
}

// maxObjects bounds the RM objects the table keeps per process: their
// handles and statuses are read from the process's memory, so a tenant
// can claim objects without end. A CUDA process has a few per context.
const maxObjects = 4096

// maxThreads bounds the threads whose context a process's entry keeps, as
// the meter's routing does.
const maxThreads = 1024

// maxMemoryObjects bounds the device memory allocations the table keeps
// per process, as the probes' table of charged allocations does (a
// caching allocator holds hundreds); those beyond it are not counted.
const maxMemoryObjects = 65536

// engineGR0 is NV2080_ENGINE_TYPE_GR0, the graphics/compute engine.
const engineGR0 = 1

// Table is the per-process table of GPU contexts, RM clients, channel
// groups and channels, kept from the event stream. It is safe for
// concurrent use.
type Table struct {
	mu    sync.Mutex
	procs map[uint32]*Process
	// dropped counts the objects not kept, a process having maxObjects;
	// droppedMemory the allocations, a process having maxMemoryObjects.
	dropped, droppedMemory uint64
	// version counts the changes to what Save writes (Version).
	version uint64
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{procs: map[uint32]*Process{}} }

func (t *Table) proc(h *Header) *Process {
	p := t.procs[h.PID]
	if p == nil {
		p = &Process{PID: h.PID, Contexts: map[uint64]int32{}, Threads: map[uint32]uint64{}, Clients: map[uint32]ClientFile{}, TSGs: map[ObjectKey]TSG{},
			Channels: map[ObjectKey]Channel{}, Subdevices: map[ObjectKey]uint32{}, Devices: map[ObjectKey]uint32{},
			Nouveau: map[int32]bool{}, Memory: map[ObjectKey]MemoryObject{}}
		t.procs[h.PID] = p
	}
	p.Comm = h.Comm
	p.CgroupID = h.CgroupID
	p.LastSeen = h.End
	return p
}

// made tells whether an RM allocation took effect: the driver's status is
// 0 and the ioctl succeeded — or failed only with ENOTTY, as every ioctl
// on the simulated GPU's control node does (a character device of the mem
// driver; a real nvidia node, major 195, never answers ENOTTY). The
// simulator checks every handle it is later sent.
func made(ret int64, status uint32) bool {
	return status == 0 && (ret == 0 || ret == -int64(unix.ENOTTY))
}

// Made tells whether the allocation took effect (see made).
func (e *ObjectAllocated) Made() bool { return made(e.Ret, e.Status) }

// RM classes the table follows besides channels and groups.
const (
	classRootClient = 0x41
	classDevice     = 0x80
	classSubdevice  = 0x2080
)

// Apply updates the table with one event.
func (t *Table) Apply(ev Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := ev.Hdr()
	switch ev.(type) {
	case *ProcessExit, *TSGAllocated, *ChannelAllocated, *ObjectAllocated, *MemoryAllocated, *WorkSubmitToken,
		*ObjectFreed, *NouveauChannel, *ContextCreated, *ContextDestroyed, *ManagedMapped:
		t.version++ // what Save writes may have changed
	}
	switch e := ev.(type) {
	case *ProcessExit:
		delete(t.procs, h.PID)
	case *Unknown:
	case *TSGAllocated:
		if made(e.Ret, e.Status) && t.room(h) {
			p := t.proc(h)
			p.TSGs[ObjectKey{e.Client, e.Handle}] = TSG{Device: e.Parent, Engine: e.EngineType}
			if gpu, ok := p.deviceID(e.Client, e.Parent); ok {
				e.GPU = &gpu
				p.noteGroupGPU(h.TID, gpu)
			}
		}
	case *ChannelAllocated:
		if made(e.Ret, e.Status) && t.room(h) {
			t.proc(h).Channels[ObjectKey{e.Client, e.Handle}] = Channel{Class: e.Class, Parent: e.Parent}
		}
	case *MemoryAllocated:
		p := t.proc(h)
		if !e.Made() || e.OOMKilled {
			break
		}
		if len(p.Memory) >= maxMemoryObjects {
			t.droppedMemory++
			break
		}
		p.Memory[ObjectKey{e.Client, e.Handle}] = MemoryObject{Bytes: e.Bytes, GPU: e.GPU, Parent: e.Parent, Host: e.Host}
	case *ObjectAllocated:
		if !made(e.Ret, e.Status) || !t.room(h) {
			break
		}
		switch e.Class {
		case classRootClient:
			t.proc(h).Clients[e.Handle] = ClientFile{FD: e.FD, File: e.File}
		case classDevice:
			t.proc(h).Devices[ObjectKey{e.Client, e.Handle}] = e.DeviceID
		case classSubdevice:
			t.proc(h).Subdevices[ObjectKey{e.Client, e.Handle}] = e.Parent
		}
	case *WorkSubmitToken:
		p := t.proc(h)
		k := ObjectKey{e.Client, e.Channel}
		if ch, ok := p.Channels[k]; ok && made(e.Ret, e.Status) {
			ch.Token = e.Token
			p.Channels[k] = ch
		}
	case *ObjectFreed:
		if made(e.Ret, e.Status) { // a free the driver refused left the object
			t.free(t.proc(h), e.Client, e.Handle)
		}
	case *NouveauChannel:
		p := t.proc(h)
		if e.Freed {
			delete(p.Nouveau, e.Channel)
		} else if e.Ret == 0 {
			p.Nouveau[e.Channel] = true
		}
	case *ContextCreated:
		if e.Ret != 0 {
			break
		}
		p := t.proc(h)
		p.Contexts[e.Ctx] = e.Device
		if gpu, ok := p.groupGPU[h.TID]; ok {
			p.Contexts[e.Ctx] = int32(gpu)
			delete(p.groupGPU, h.TID)
		}
		if e.Ctx == 0 {
			break
		}
		if e.Func == "cuDevicePrimaryCtxRetain" {
			switch _, ok := p.PrimaryThreads[h.TID]; {
			case p.Primary == 0 || p.Primary == e.Ctx:
				p.Primary = e.Ctx
				delete(p.PrimaryThreads, h.TID)
			case ok || len(p.PrimaryThreads) < maxThreads:
				if p.PrimaryThreads == nil {
					p.PrimaryThreads = map[uint32]uint64{}
				}
				p.PrimaryThreads[h.TID] = e.Ctx
			}
			break // the runtime's primary context: made current by no cuCtxCreate
		}
		if p.Made == 0 {
			p.Made = e.Ctx
		}
		if _, ok := p.Threads[h.TID]; ok || len(p.Threads) < maxThreads {
			p.Threads[h.TID] = e.Ctx
		}
	case *ContextDestroyed:
		delete(t.proc(h).Contexts, e.Ctx)
	case *ManagedMapped:
		if e.Unmap {
			t.proc(h).unmapManaged(e.Addr, e.Len)
		} else {
			t.proc(h).mapManaged(e.Addr, e.Len)
		}
	case *Launch, *GraphLaunch:
		t.proc(h).Launches++
	default:
		t.proc(h)
	}
}

// deviceID is the GPU (deviceId) of the process's device object parent,
// or of the device above it where parent is a subdevice.
func (p *Process) deviceID(client, parent uint32) (uint32, bool) {
	if dev, ok := p.Subdevices[ObjectKey{client, parent}]; ok {
		parent = dev
	}
	gpu, ok := p.Devices[ObjectKey{client, parent}]
	return gpu, ok
}

// noteGroupGPU keeps the GPU of a channel group a thread allocated for the
// context the thread makes next.
func (p *Process) noteGroupGPU(tid, gpu uint32) {
	if p.groupGPU == nil {
		p.groupGPU = map[uint32]uint32{}
	}
	if _, ok := p.groupGPU[tid]; ok || len(p.groupGPU) < maxThreads {
		p.groupGPU[tid] = gpu
	}
}

// room tells whether the process of h may have another object kept, and
// counts the one dropped when it may not. Called with t.mu held.
func (t *Table) room(h *Header) bool {
	if p := t.procs[h.PID]; p != nil && p.objects() >= maxObjects {
		t.dropped++
		return false
	}
	return true
}

// Dropped counts the RM objects not kept because their process had
// maxObjects already, and the device memory allocations not kept beyond
// maxMemoryObjects.
func (t *Table) Dropped() (objects, allocations uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped, t.droppedMemory
}

// MemoryOf sums a process's device memory and, apart, its pinned host
// memory, by GPU.
func (t *Table) MemoryOf(pid uint32) (device, host map[int]uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.procs[pid]; p != nil {
		return p.MemoryByGPU()
	}
	return nil, nil
}

// free drops an RM object and, for a client, everything under it (the
// driver reuses handles once freed).
func (t *Table) free(p *Process, client, handle uint32) {
	k := ObjectKey{client, handle}
	delete(p.Channels, k)
	delete(p.TSGs, k)
	delete(p.Subdevices, k)
	delete(p.Devices, k)
	delete(p.Memory, k)
	if handle != client {
		// The driver frees what was allocated under a freed object.
		for mk, m := range p.Memory {
			if mk.Client == client && m.Parent == handle {
				delete(p.Memory, mk)
			}
		}
		return
	}
	delete(p.Clients, client)
	for k := range p.Channels {
		if k.Client == client {
			delete(p.Channels, k)
		}
	}
	for k := range p.TSGs {
		if k.Client == client {
			delete(p.TSGs, k)
		}
	}
	for k := range p.Subdevices {
		if k.Client == client {
			delete(p.Subdevices, k)
		}
	}
	for k := range p.Devices {
		if k.Client == client {
			delete(p.Devices, k)
		}
	}
	for k := range p.Memory {
		if k.Client == client {
			delete(p.Memory, k)
		}
	}
}

// Process returns a copy of one process's entry.
func (t *Table) Process(pid uint32) (Process, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[pid]
	if !ok {
		return Process{}, false
	}
	return p.copy(), true
}

// Processes returns a copy of the table, ordered by PID.
func (t *Table) Processes() []Process {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Process, 0, len(t.procs))
	for _, p := range t.procs {
		out = append(out, p.copy())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out
}

func (p *Process) copy() Process {
	c := *p
	c.Contexts = copyMap(p.Contexts)
	c.Threads = copyMap(p.Threads)
	c.Clients = copyMap(p.Clients)
	c.TSGs = copyMap(p.TSGs)
	c.Channels = copyMap(p.Channels)
	c.Subdevices = copyMap(p.Subdevices)
	c.Devices = copyMap(p.Devices)
	c.Nouveau = copyMap(p.Nouveau)
	c.Memory = copyMap(p.Memory)
	if p.Managed != nil {
		c.Managed = copyMap(p.Managed)
	}
	c.groupGPU = nil
	return c
}

func copyMap[K comparable, V any](m map[K]V) map[K]V {
	c := make(map[K]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
