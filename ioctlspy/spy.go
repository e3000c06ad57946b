package ioctlspy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpuarb/gpuarb/bpf"
)

// Spy reads the probes' ring buffer, decodes records, keeps the context
// table and attaches the uprobes to the libcuda copies processes map as
// they set up their GPUs.
type Spy struct {
	probes *bpf.Probes
	reader *ringbuf.Reader
	table  *Table
	self   uint32

	// OnError receives errors that do not stop the stream (a record that
	// does not decode, a libcuda copy that could not be probed).
	OnError func(error)

	decoded      atomic.Uint64
	decodeErrors atomic.Uint64
	// attachDrops counts the mapping scans not done because the attach
	// queue was full.
	attachDrops atomic.Uint64
	// scans counts the processes whose mappings were searched for
	// libcuda copies, scanAttached the copies that found.
	scans, scanAttached atomic.Uint64

	// unprobed are the processes whose last mapping scan found no probed
	// libcuda: they set up GPU channels, so they submit work no uprobe
	// sees. Kept until they exit or a scan finds one.
	mu       sync.Mutex
	unprobed map[uint32]bool
}

// scanJob is a process whose executable mappings are searched for libcuda
// copies, under any name (the attach worker's work).
type scanJob struct {
	pid    uint32
	cgroup uint64
}

// Mapping scans: a process is searched for libcuda copies at its first GPU
// ioctl (its libcuda, under whatever name, is mapped by then: it issues
// the ioctl, before any launch), and again when it allocates a channel
// group or channel, at most once per rescanAfter; scanned remembers at
// most maxScanned processes. Only processes that use a GPU are scanned,
// and a file is read only as one of their executable mappings
// (/proc/PID/map_files): no path a tenant names is ever opened.
const (
	rescanAfter = time.Second
	maxScanned  = 4096
)

// attachQueue bounds the scans waiting: the reader never waits on an
// attach (ELF reading, uprobe links), and a storm of GPU processes costs
// at most this many pending scans.
const attachQueue = 256

// NewSpy opens a reader on the probes' ring buffer.
func NewSpy(p *bpf.Probes) (*Spy, error) {
	rd, err := ringbuf.NewReader(p.EventsMap())
	if err != nil {
		return nil, fmt.Errorf("open ring buffer reader: %w", err)
	}
	return &Spy{probes: p, reader: rd, table: NewTable(), self: uint32(os.Getpid()), OnError: func(error) {},
		unprobed: map[uint32]bool{}}, nil
}

// Probes are the probes this Spy reads.
func (s *Spy) Probes() *bpf.Probes { return s.probes }

// Table is the live per-process context table.
func (s *Spy) Table() *Table { return s.table }

// Counts returns how many records were decoded and how many failed.
func (s *Spy) Counts() (decoded, failed uint64) {
	return s.decoded.Load(), s.decodeErrors.Load()
}

// AttachDrops counts the mapping scans that were not done because too many
// were waiting.
func (s *Spy) AttachDrops() uint64 { return s.attachDrops.Load() }

// Scans counts the processes searched for libcuda copies by mapping, and
// the copies found that way (not by an open of a file named libcuda).
func (s *Spy) Scans() (scanned, attached uint64) { return s.scans.Load(), s.scanAttached.Load() }

// Run delivers decoded events to handle until ctx ends or the reader is
// closed. It returns nil on a clean stop. The libcuda copies processes map
// as they set up their GPUs are probed by a worker of its own, so that the
// stream never waits on one.
func (s *Spy) Run(ctx context.Context, handle func(Event)) error {
	stop := context.AfterFunc(ctx, func() { s.reader.Close() })
	defer stop()
	attach := make(chan scanJob, attachQueue)
	worker := make(chan struct{})
	go func() {
		defer close(worker)
		for job := range attach {
			s.attachMapped(job)
		}
	}()
	enqueue := func(job scanJob) {
		select {
		case attach <- job:
		default:
			s.attachDrops.Add(1)
		}
	}
	scanned := map[uint32]time.Time{}
	defer func() {
		close(attach)
		select { // an attach in progress finishes on its own
		case <-worker:
		case <-time.After(time.Second):
		}
	}()
	var rec ringbuf.Record
	for {
		// Records arrive without wake-ups until a backlog builds: poll.
		s.reader.SetDeadline(time.Now().Add(bpf.PollInterval))
		if err := s.reader.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			if errors.Is(err, ringbuf.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read ring buffer: %w", err)
		}
		ev, err := Decode(rec.RawSample)
		if err != nil {
			s.decodeErrors.Add(1)
			s.OnError(fmt.Errorf("decode record: %w", err))
			continue
		}
		s.decoded.Add(1)
		if ev.Hdr().PID == s.self {
			continue // gpuarb's own opens of libcuda while attaching
		}
		h := ev.Hdr()
		_, ioctl := ev.(interface{ Info() *IoctlInfo })
		_, first := scanned[h.PID]
		first = ioctl && !first
		switch e := ev.(type) {
		case *TSGAllocated, *ChannelAllocated:
			first = first || time.Since(scanned[h.PID]) >= rescanAfter
		case *ProcessExit:
			delete(scanned, e.PID)
			s.mu.Lock()
			delete(s.unprobed, e.PID)
			s.mu.Unlock()
		}
		if first {
			if len(scanned) >= maxScanned {
				clear(scanned)
			}
			scanned[h.PID] = time.Now()
			enqueue(scanJob{pid: h.PID, cgroup: h.CgroupID})
		}
		s.table.Apply(ev)
		handle(ev)
	}
}

// attachMapped probes the libcuda copies a process maps under any name,
// and notes a process that maps none it could probe.
func (s *Spy) attachMapped(job scanJob) {
	pid := job.pid
	s.scans.Add(1)
	n, probed, err := s.probes.AttachMapped(int(pid), job.cgroup)
	s.scanAttached.Add(uint64(n))
	if err != nil {
		s.OnError(fmt.Errorf("pid %d: %w", pid, err))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case probed:
		delete(s.unprobed, pid)
	case running(pid) && len(s.unprobed) < maxScanned:
		// A scan may end before the table holds the process (its first
		// ioctls create no object): it is noted while it runs, and
		// Unprobed reports it once it has channel groups.
		s.unprobed[pid] = true
	}
}

// running reports whether the process still exists (its /proc entry).
func running(pid uint32) bool {
	_, err := os.Stat("/proc/" + strconv.FormatUint(uint64(pid), 10))
	return err == nil
}

// Unprobed returns the processes with GPU channel groups that map no
// libcuda copy the probes could attach to (a driver linked into the
// program and stripped, a copy that is not an ELF the probes accept):
// their launches and syncs are unseen. The daemon meters them as busy
// whenever it lets them run and holds them without the launch gate.
func (s *Spy) Unprobed() []Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Process
	for pid := range s.unprobed {
		p, ok := s.table.Process(pid)
		switch {
		case !ok && !running(pid):
			delete(s.unprobed, pid) // gone: its exit was applied before the scan
		case ok && len(p.Groups()) > 0:
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out
}

// Close stops a running Run and releases the reader.
func (s *Spy) Close() error {
	if err := s.reader.Close(); err != nil {
		return fmt.Errorf("close ring buffer reader: %w", err)
	}
	return nil
}
