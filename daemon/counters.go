package daemon

import "github.com/gpuarb/gpuarb/meter"

// contextCounts remembers the totals last read per process so that each
// control step adds only what is new to its tenant's counters.
type contextCounts map[uint32]countedContext

type countedContext struct {
	cgroupID uint64
	gpu      int
	total    meter.Totals
}

// delta returns what c counted since the last step. A process that moved
// to another cgroup or GPU, or a reused pid, starts again from its total.
func (cc *contextCounts) delta(c meter.ContextStats) meter.Totals {
	if *cc == nil {
		*cc = contextCounts{}
	}
	prev, ok := (*cc)[c.PID]
	(*cc)[c.PID] = countedContext{c.CgroupID, c.GPU, c.Total}
	cur := c.Total
	if !ok || prev.cgroupID != c.CgroupID || prev.gpu != c.GPU ||
		cur.GPUNS < prev.total.GPUNS || cur.Launches < prev.total.Launches || cur.Syncs < prev.total.Syncs {
		return cur
	}
	return meter.Totals{GPUNS: cur.GPUNS - prev.total.GPUNS, Launches: cur.Launches - prev.total.Launches,
		Syncs: cur.Syncs - prev.total.Syncs}
}

// forgetAbsent drops the processes the meter no longer lists.
func (cc contextCounts) forgetAbsent(listed []meter.ContextStats) {
	seen := make(map[uint32]bool, len(listed))
	for _, c := range listed {
		seen[c.PID] = true
	}
	for pid := range cc {
		if !seen[pid] {
			delete(cc, pid)
		}
	}
}
