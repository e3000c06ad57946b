package daemon

import "github.com/gpuarb/gpuarb/meter"

// contextCounts remembers the totals last read per context so that each
// control step adds only what is new to its tenant's counters.
type contextCounts map[contextID]countedContext

// contextID names one of a process's CUDA contexts as the meter lists it.
type contextID struct {
	pid uint32
	ctx uint64
}

type countedContext struct {
	cgroupID uint64
	gpu      int
	total    meter.Totals
}

// delta returns what c counted since the last step. A context that moved
// to another cgroup or GPU, or a reused pid, starts again from its total.
func (cc *contextCounts) delta(c meter.ContextStats) meter.Totals {
	if *cc == nil {
		*cc = contextCounts{}
	}
	id := contextID{c.PID, c.Ctx}
	prev, ok := (*cc)[id]
	(*cc)[id] = countedContext{c.CgroupID, c.GPU, c.Total}
	cur := c.Total
	if !ok || prev.cgroupID != c.CgroupID || prev.gpu != c.GPU ||
		cur.GPUNS < prev.total.GPUNS || cur.Launches < prev.total.Launches || cur.Syncs < prev.total.Syncs {
		return cur
	}
	return meter.Totals{GPUNS: cur.GPUNS - prev.total.GPUNS, Launches: cur.Launches - prev.total.Launches,
		Syncs: cur.Syncs - prev.total.Syncs}
}

// forgetAbsent drops the contexts the meter no longer lists.
func (cc contextCounts) forgetAbsent(listed []meter.ContextStats) {
	seen := make(map[contextID]bool, len(listed))
	for _, c := range listed {
		seen[contextID{c.PID, c.Ctx}] = true
	}
	for id := range cc {
		if !seen[id] {
			delete(cc, id)
		}
	}
}
