package daemon

import (
	"path/filepath"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/meter"
)

// The RM objects of the processes using a GPU (their clients, channel
// groups, channels and memory) are seen once, when each is allocated: a
// daemon that starts beside running processes would not know them, and
// would neither steer nor charge those processes. Each control step saves
// the table beside the ledgers when it changed, the daemon saves it at its
// stop, and the next daemon restores what is still the same process.

// beside is the path of a file the daemon saves beside its thaw ledger:
// objects.json the table, backlogs.json the meter's modeled queues.
func beside(ledger, name string) string { return filepath.Join(filepath.Dir(ledger), name) }

// processStart reads a process's start time, the saved table's check
// against pid reuse.
func processStart(pid uint32) (uint64, error) { return cgroup.StartTime(int(pid)) }

// restoreObjects restores the saved table into the probes' table, before
// the events are read.
func (d *Daemon) restoreObjects() {
	path := beside(d.cfg.Ledger, "objects.json")
	pids, err := d.spy.Table().RestoreFile(path, processStart)
	if err != nil {
		d.log.Warn("the RM objects of running processes are unknown", "path", path, "err", err)
		return
	}
	if len(pids) == 0 {
		return
	}
	for _, pid := range pids {
		d.routeRestored(pid)
	}
	d.log.Info("restored the RM objects of running processes", "processes", len(pids), "path", path)
	// And the work they queued, which they may wait for without a launch.
	if n, err := d.meter.RestoreBacklogs(beside(d.cfg.Ledger, "backlogs.json"), processStart); err != nil || n > 0 {
		d.log.Info("restored the work running processes queued", "contexts", n, "err", err) // said where some came back or the file failed
	}
}

// saveBacklogs keeps the meter's modeled queues for the next daemon. It
// reads /proc and writes a file: called without d.mu. A failure is the
// directory's, which saveObjects reports.
func (d *Daemon) saveBacklogs() {
	if err := d.meter.SaveBacklogs(beside(d.cfg.Ledger, "backlogs.json"), processStart); err != nil {
		d.log.Debug("save the modeled queues", "err", err)
	}
}

// routeRestored replays to the meter the context creations of a restored
// process that it will never see again (Process.ContextsMade): each
// thread routed to its context and each context on its GPU.
func (d *Daemon) routeRestored(pid uint32) {
	if p, ok := d.spy.Table().Process(pid); ok {
		for _, ev := range p.ContextsMade(meter.MonotonicNow()) {
			d.meter.Observe(ev)
		}
	}
}

// saveObjects saves the table if it changed since the last save. It reads
// /proc and writes a file: called without d.mu.
func (d *Daemon) saveObjects() {
	if d.spy == nil {
		return
	}
	tbl := d.spy.Table()
	v := tbl.Version()
	if v == d.savedObjects {
		return
	}
	path := beside(d.cfg.Ledger, "objects.json")
	err := tbl.SaveFile(path, processStart)
	if err != nil {
		if !d.objectsUnsaved {
			d.log.Warn("a restarted daemon will not know the RM objects of running processes", "path", path, "err", err)
		}
		d.objectsUnsaved = true
		return
	}
	d.savedObjects, d.objectsUnsaved = v, false
}
