package ioctlspy

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"

	"github.com/gpuarb/gpuarb/internal/atomicfile"
)

// A restarted daemon must know the RM objects of the processes that ran
// before it: their channel groups are what it steers, their memory what it
// charges, and none of them will be allocated again. The daemon saves the
// table beside its ledgers (Save) and the next one restores what is still
// the same process (Restore).

// savedObject is one RM object of a saved process.
type savedObject struct {
	Client uint32 `json:"client"`
	Handle uint32 `json:"handle"`
	// Parent is a channel's group, a subdevice's device, a group's or a
	// memory allocation's device.
	Parent uint32 `json:"parent,omitempty"`
	Class  uint32 `json:"class,omitempty"`
	Token  uint32 `json:"token,omitempty"`  // a channel's work submit token
	Engine uint32 `json:"engine,omitempty"` // a group's engine
	GPU    uint32 `json:"gpu,omitempty"`    // a device's deviceId, a memory allocation's GPU
	Bytes  uint64 `json:"bytes,omitempty"`  // a memory allocation's size
	Host   bool   `json:"host,omitempty"`   // pinned host memory
}

// savedProcess is one process of a saved table.
type savedProcess struct {
	PID uint32 `json:"pid"`
	// Start is the process's start time (clock ticks since boot): a pid
	// that names another process by the restore is not restored.
	Start    uint64            `json:"start"`
	Comm     string            `json:"comm"`
	CgroupID uint64            `json:"cgroup_id"`
	Contexts map[uint64]int32  `json:"contexts,omitempty"`
	Threads  map[uint32]uint64 `json:"threads,omitempty"`
	Made     uint64            `json:"made,omitempty"`
	Primary  uint64            `json:"primary,omitempty"`
	// PrimaryThreads are the threads on another GPU's primary context.
	PrimaryThreads map[uint32]uint64     `json:"primary_threads,omitempty"`
	Clients        map[uint32]ClientFile `json:"clients,omitempty"`
	TSGs           []savedObject         `json:"tsgs,omitempty"`
	Channels       []savedObject         `json:"channels,omitempty"`
	Subdevices     []savedObject         `json:"subdevices,omitempty"`
	Devices        []savedObject         `json:"devices,omitempty"`
	Memory         []savedObject         `json:"memory,omitempty"`
	Nouveau        []int32               `json:"nouveau,omitempty"`
	// Managed are its managed ranges, address to length.
	Managed map[uint64]uint64 `json:"managed,omitempty"`
}

// Version counts the table's changes to what Save writes: a saver writes
// again only when it moved.
func (t *Table) Version() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.version
}

// Save writes the table as JSON, each process with its start time as
// start(pid) reads it now; a process start cannot read (gone) is left out.
// start reads /proc: Save holds the table's lock only to copy it.
func (t *Table) Save(w io.Writer, start func(pid uint32) (uint64, error)) error {
	var out []savedProcess
	for _, p := range t.Processes() {
		st, err := start(p.PID)
		if err != nil {
			continue
		}
		out = append(out, saveProcess(p, st))
	}
	if err := json.NewEncoder(w).Encode(out); err != nil {
		return fmt.Errorf("save the RM object table: %w", err)
	}
	return nil
}

func saveProcess(p Process, start uint64) savedProcess {
	s := savedProcess{PID: p.PID, Start: start, Comm: p.Comm, CgroupID: p.CgroupID, Contexts: p.Contexts, Threads: p.Threads,
		Made: p.Made, Primary: p.Primary, PrimaryThreads: p.PrimaryThreads, Clients: p.Clients,
		Nouveau: slices.Sorted(maps.Keys(p.Nouveau)), Managed: p.Managed}
	for k, g := range p.TSGs {
		s.TSGs = append(s.TSGs, savedObject{Client: k.Client, Handle: k.Handle, Parent: g.Device, Engine: g.Engine})
	}
	for k, c := range p.Channels {
		s.Channels = append(s.Channels, savedObject{Client: k.Client, Handle: k.Handle, Parent: c.Parent, Class: c.Class, Token: c.Token})
	}
	for k, dev := range p.Subdevices {
		s.Subdevices = append(s.Subdevices, savedObject{Client: k.Client, Handle: k.Handle, Parent: dev})
	}
	for k, gpu := range p.Devices {
		s.Devices = append(s.Devices, savedObject{Client: k.Client, Handle: k.Handle, GPU: gpu})
	}
	for k, m := range p.Memory {
		s.Memory = append(s.Memory, savedObject{Client: k.Client, Handle: k.Handle, Parent: m.Parent, GPU: m.GPU, Bytes: m.Bytes, Host: m.Host})
	}
	return s
}

// Restore reads a table Save wrote and keeps the processes whose pid still
// names the process saved (start(pid) reads the same start time) and that
// the table does not know yet; it returns their pids. What it reads
// is the daemon's own file, but it is bounded as the event stream is:
// maxObjects RM objects and maxMemoryObjects allocations a process.
func (t *Table) Restore(r io.Reader, start func(pid uint32) (uint64, error)) ([]uint32, error) {
	var saved []savedProcess
	if err := json.NewDecoder(r).Decode(&saved); err != nil {
		return nil, fmt.Errorf("restore the RM object table: %w", err)
	}
	var kept []uint32
	for _, s := range saved {
		if st, err := start(s.PID); err != nil || st != s.Start {
			continue
		}
		p := restoreProcess(s)
		if p.objects() > maxObjects || len(p.Memory) > maxMemoryObjects || len(p.Threads) > maxThreads || len(p.PrimaryThreads) > maxThreads {
			continue
		}
		t.mu.Lock()
		if _, known := t.procs[s.PID]; !known {
			t.procs[s.PID] = p
			t.version++
			kept = append(kept, s.PID)
		}
		t.mu.Unlock()
	}
	return kept, nil
}

func restoreProcess(s savedProcess) *Process {
	p := &Process{PID: s.PID, Comm: s.Comm, CgroupID: s.CgroupID, Contexts: map[uint64]int32{}, Threads: map[uint32]uint64{},
		Made: s.Made, Primary: s.Primary, Clients: map[uint32]ClientFile{},
		TSGs: map[ObjectKey]TSG{}, Channels: map[ObjectKey]Channel{}, Subdevices: map[ObjectKey]uint32{},
		Devices: map[ObjectKey]uint32{}, Nouveau: map[int32]bool{}, Memory: map[ObjectKey]MemoryObject{}}
	maps.Copy(p.Contexts, s.Contexts)
	maps.Copy(p.Threads, s.Threads)
	if len(s.PrimaryThreads) > 0 {
		p.PrimaryThreads = maps.Clone(s.PrimaryThreads)
	}
	maps.Copy(p.Clients, s.Clients)
	for _, o := range s.TSGs {
		p.TSGs[ObjectKey{o.Client, o.Handle}] = TSG{Device: o.Parent, Engine: o.Engine}
	}
	for _, o := range s.Channels {
		p.Channels[ObjectKey{o.Client, o.Handle}] = Channel{Class: o.Class, Parent: o.Parent, Token: o.Token}
	}
	for _, o := range s.Subdevices {
		p.Subdevices[ObjectKey{o.Client, o.Handle}] = o.Parent
	}
	for _, o := range s.Devices {
		p.Devices[ObjectKey{o.Client, o.Handle}] = o.GPU
	}
	for _, o := range s.Memory {
		p.Memory[ObjectKey{o.Client, o.Handle}] = MemoryObject{Bytes: o.Bytes, GPU: o.GPU, Parent: o.Parent, Host: o.Host}
	}
	for _, ch := range s.Nouveau {
		p.Nouveau[ch] = true
	}
	for addr, n := range s.Managed {
		p.mapManaged(addr, n)
	}
	return p
}

// SaveFile saves the table (Save) to path, atomically: a file beside it,
// renamed over it.
func (t *Table) SaveFile(path string, start func(pid uint32) (uint64, error)) error {
	return atomicfile.WriteFrom(path, 0o600, func(w io.Writer) error { return t.Save(w, start) })
}

// RestoreFile restores the table saved at path (Restore); a missing file
// restores nothing.
func (t *Table) RestoreFile(path string, start func(pid uint32) (uint64, error)) ([]uint32, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return t.Restore(f, start)
}

// ContextsMade are the context creations that route the process's threads
// and place its contexts as its own calls did, at t, for a reader that
// missed them (a restarted daemon's meter): a cuCtxCreate on each thread
// routed to a context, the process's first context first, or, for a
// process of primary contexts alone, their retains, its first primary
// context first and each thread on another GPU's after it. Each names the
// context's GPU as the table knows it (Contexts).
func (p Process) ContextsMade(t uint64) []*ContextCreated {
	made := func(tid uint32, fn string, ctx uint64) *ContextCreated {
		return &ContextCreated{Header: Header{Type: "ctx_create", Start: t, End: t, PID: p.PID, TID: tid,
			Comm: p.Comm, CgroupID: p.CgroupID}, Func: fn, Ctx: ctx, Device: p.Contexts[ctx]}
	}
	first := func(tid uint32) int { // 0 for the threads of the first context
		if p.Threads[tid] == p.Made {
			return 0
		}
		return 1
	}
	tids := slices.SortedFunc(maps.Keys(p.Threads), func(a, b uint32) int {
		return cmp.Or(cmp.Compare(first(a), first(b)), cmp.Compare(a, b))
	})
	var out []*ContextCreated
	for _, tid := range tids {
		out = append(out, made(tid, "cuCtxCreate_v2", p.Threads[tid]))
	}
	if len(tids) == 0 {
		ctxs := slices.Sorted(maps.Keys(p.Contexts))
		if _, ok := p.Contexts[p.Primary]; ok {
			// Retained on the process's own thread, any other would route
			// it there: the others are retained on the threads using them.
			ctxs = []uint64{p.Primary}
		}
		for _, ctx := range ctxs {
			out = append(out, made(p.PID, "cuDevicePrimaryCtxRetain", ctx))
		}
		for _, tid := range slices.Sorted(maps.Keys(p.PrimaryThreads)) {
			out = append(out, made(tid, "cuDevicePrimaryCtxRetain", p.PrimaryThreads[tid]))
		}
	}
	return out
}
