package meter

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"

	"github.com/gpuarb/gpuarb/internal/atomicfile"
)

// A daemon started beside running processes sees none of the work they
// queued before it: a process that queued seconds of work and waits for
// it launches nothing for seconds, and would read as idle, neither
// metered nor held, while the GPU runs its queue. SaveBacklogs keeps each
// context's modeled queue in a file; RestoreBacklogs gives each context of
// a process still running what is left of it.

// savedBacklogs is the file: when it was read (CLOCK_MONOTONIC ns, which
// daemons share) and each context with work queued.
type savedBacklogs struct {
	At       uint64         `json:"at"`
	Contexts []savedBacklog `json:"contexts"`
}

type savedBacklog struct {
	PID uint32 `json:"pid"`
	// Start is the process's start time, against pid reuse.
	Start uint64 `json:"start"`
	Ctx   uint64 `json:"ctx"`
	// QueuedNS is the modeled work queued; Share what the context took of
	// its GPU over the window before, the pace it drains at.
	QueuedNS uint64  `json:"queued_ns"`
	Share    float64 `json:"share"`
}

// SaveBacklogs writes to path the modeled queues of the contexts whose
// processes still run (start reads a process's start time), as the replay
// last settled them, with each one's share of the window before, through
// a file beside path renamed over it.
func (m *Meter) SaveBacklogs(path string, start func(pid uint32) (uint64, error)) error {
	type queued struct {
		pid         uint32
		ctx, queued uint64
		share       float64
	}
	var qs []queued
	m.mu.Lock()
	now := m.horizon(m.cfg.Now())
	w := uint64(m.cfg.Window)
	for _, c := range m.ctxs {
		if q := c.queued(); q > 0 && !c.exited && now > w {
			qs = append(qs, queued{c.pid, c.ctx, q, sumIn(c.held, now-w, now) / float64(w)})
		}
	}
	m.mu.Unlock()
	saved := savedBacklogs{At: now, Contexts: []savedBacklog{}}
	for _, q := range qs {
		st, err := start(q.pid)
		if err != nil {
			continue // gone
		}
		saved.Contexts = append(saved.Contexts, savedBacklog{PID: q.pid, Start: st, Ctx: q.ctx, QueuedNS: q.queued, Share: q.share})
	}
	b, err := json.Marshal(saved)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o600)
}

// RestoreBacklogs gives each context in the file at path whose process
// still runs (the same start time) what is left of its queue: the queue
// less what the context took at its saved share since (RestoreBacklog).
// Call it once the contexts are made (their creations replayed). It
// returns how many contexts took work; a missing file restores nothing.
func (m *Meter) RestoreBacklogs(path string, start func(pid uint32) (uint64, error)) (int, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	var saved savedBacklogs
	if err == nil {
		err = json.Unmarshal(b, &saved)
	}
	if err != nil {
		return 0, err
	}
	now := m.cfg.Now()
	restored := 0
	for _, c := range saved.Contexts {
		if st, err := start(c.PID); err != nil || st != c.Start {
			continue // gone, or its pid is another process's
		}
		left := float64(c.QueuedNS)
		if now > saved.At {
			left -= float64(now-saved.At) * c.Share
		}
		if left > 0 && m.RestoreBacklog(c.PID, c.Ctx, left) {
			restored++
		}
	}
	return restored, nil
}
