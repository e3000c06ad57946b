package ioctlspy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpuarb/gpuarb/bpf"
)

// atFDCWD is AT_FDCWD as a 32-bit dirfd.
const atFDCWD = -100

// Spy reads the probes' ring buffer, decodes records, keeps the context
// table and attaches the uprobes to libcuda copies as processes open them.
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
}

// NewSpy opens a reader on the probes' ring buffer.
func NewSpy(p *bpf.Probes) (*Spy, error) {
	rd, err := ringbuf.NewReader(p.EventsMap())
	if err != nil {
		return nil, fmt.Errorf("open ring buffer reader: %w", err)
	}
	return &Spy{probes: p, reader: rd, table: NewTable(), self: uint32(os.Getpid()), OnError: func(error) {}}, nil
}

// Probes are the probes this Spy reads.
func (s *Spy) Probes() *bpf.Probes { return s.probes }

// Table is the live per-process context table.
func (s *Spy) Table() *Table { return s.table }

// Counts returns how many records were decoded and how many failed.
func (s *Spy) Counts() (decoded, failed uint64) {
	return s.decoded.Load(), s.decodeErrors.Load()
}

// Run delivers decoded events to handle until ctx ends or the reader is
// closed. It returns nil on a clean stop.
func (s *Spy) Run(ctx context.Context, handle func(Event)) error {
	stop := context.AfterFunc(ctx, func() { s.reader.Close() })
	defer stop()
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
		if lo, ok := ev.(*LibcudaOpened); ok {
			s.attachOpened(lo)
		}
		s.table.Apply(ev)
		handle(ev)
	}
}

// attachOpened probes a libcuda copy a process just opened, resolving the
// path through that process's root or working directory.
func (s *Spy) attachOpened(e *LibcudaOpened) {
	path := e.Path
	if !filepath.IsAbs(path) && e.DirFD != atFDCWD {
		path = filepath.Join(fmt.Sprintf("/proc/%d/fd/%d", e.PID, e.DirFD), path)
	} else {
		path = bpf.ProcessPath(int(e.PID), path)
	}
	// A process that already exited leaves nothing to probe.
	if _, err := s.probes.AttachLibcuda(path); err != nil && !errors.Is(err, bpf.ErrNotLibcuda) && !errors.Is(err, os.ErrNotExist) {
		s.OnError(err)
	}
}

// Close stops a running Run and releases the reader.
func (s *Spy) Close() error {
	if err := s.reader.Close(); err != nil {
		return fmt.Errorf("close ring buffer reader: %w", err)
	}
	return nil
}
