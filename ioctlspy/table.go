package ioctlspy

import (
	"sort"
	"sync"
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

// Process is what the table knows of one process using a GPU.
type Process struct {
	PID      uint32                `json:"pid"`
	Comm     string                `json:"comm"`
	CgroupID uint64                `json:"cgroup_id"`
	Contexts map[uint64]int32      `json:"contexts"` // CUDA context -> device ordinal
	TSGs     map[ObjectKey]uint32  `json:"-"`        // TSG -> engine type
	Channels map[ObjectKey]Channel `json:"-"`
	Nouveau  map[int32]bool        `json:"-"` // nouveau channel ids
	Launches uint64                `json:"launches"`
	LastSeen uint64                `json:"last_seen_ns"`
}

// Table is the per-process table of GPU contexts, channel groups and
// channels, kept from the event stream. It is safe for concurrent use.
type Table struct {
	mu    sync.Mutex
	procs map[uint32]*Process
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{procs: map[uint32]*Process{}} }

func (t *Table) proc(h *Header) *Process {
	p := t.procs[h.PID]
	if p == nil {
		p = &Process{PID: h.PID, Contexts: map[uint64]int32{}, TSGs: map[ObjectKey]uint32{},
			Channels: map[ObjectKey]Channel{}, Nouveau: map[int32]bool{}}
		t.procs[h.PID] = p
	}
	p.Comm = h.Comm
	p.CgroupID = h.CgroupID
	p.LastSeen = h.End
	return p
}

// Apply updates the table with one event.
func (t *Table) Apply(ev Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := ev.Hdr()
	switch e := ev.(type) {
	case *ProcessExit:
		delete(t.procs, h.PID)
	case *LibcudaOpened, *Unknown:
	case *TSGAllocated:
		if e.Ret == 0 && e.Status == 0 {
			t.proc(h).TSGs[ObjectKey{e.Client, e.Handle}] = e.EngineType
		}
	case *ChannelAllocated:
		if e.Ret == 0 && e.Status == 0 {
			t.proc(h).Channels[ObjectKey{e.Client, e.Handle}] = Channel{Class: e.Class, Parent: e.Parent}
		}
	case *WorkSubmitToken:
		p := t.proc(h)
		k := ObjectKey{e.Client, e.Channel}
		if ch, ok := p.Channels[k]; ok && e.Ret == 0 {
			ch.Token = e.Token
			p.Channels[k] = ch
		}
	case *ObjectFreed:
		p := t.proc(h)
		k := ObjectKey{e.Client, e.Handle}
		delete(p.Channels, k)
		delete(p.TSGs, k)
		if e.Handle == e.Client { // freeing the client frees everything under it
			for k := range p.Channels {
				if k.Client == e.Client {
					delete(p.Channels, k)
				}
			}
			for k := range p.TSGs {
				if k.Client == e.Client {
					delete(p.TSGs, k)
				}
			}
		}
	case *NouveauChannel:
		p := t.proc(h)
		if e.Freed {
			delete(p.Nouveau, e.Channel)
		} else if e.Ret == 0 {
			p.Nouveau[e.Channel] = true
		}
	case *ContextCreated:
		if e.Ret == 0 {
			t.proc(h).Contexts[e.Ctx] = e.Device
		}
	case *ContextDestroyed:
		delete(t.proc(h).Contexts, e.Ctx)
	case *Launch, *GraphLaunch:
		t.proc(h).Launches++
	default:
		t.proc(h)
	}
}

// Processes returns a copy of the table, ordered by PID.
func (t *Table) Processes() []Process {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Process, 0, len(t.procs))
	for _, p := range t.procs {
		c := *p
		c.Contexts = copyMap(p.Contexts)
		c.TSGs = copyMap(p.TSGs)
		c.Channels = copyMap(p.Channels)
		c.Nouveau = copyMap(p.Nouveau)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out
}

func copyMap[K comparable, V any](m map[K]V) map[K]V {
	c := make(map[K]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
