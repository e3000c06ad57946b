package enforce

// Member is a process a control step found, with its tenant's actuators.
type Member struct {
	PID    uint32
	Cgroup uint64
	Tenant *Tenant
	// ByCgroup: its tenant is a cgroup, which its new processes join.
	ByCgroup bool
}

// Wakers finds the gater to wake when a process is held at a launch gate:
// by its pid, or (a process the meter has not seen yet) by its cgroup.
type Wakers struct {
	byPID    map[uint32]*Gater
	byCgroup map[uint64]*Gater
}

// NewWakers indexes the gaters of the members' tenants.
func NewWakers(seen []Member) *Wakers {
	w := &Wakers{byPID: map[uint32]*Gater{}, byCgroup: map[uint64]*Gater{}}
	for _, m := range seen {
		g := m.Tenant.Gater()
		if g == nil {
			continue
		}
		w.byPID[m.PID] = g
		if m.ByCgroup {
			w.byCgroup[m.Cgroup] = g
		}
	}
	return w
}

// Wake wakes the gater of a process just held.
func (w *Wakers) Wake(pid uint32, cgroupID uint64) {
	g := w.byPID[pid]
	if g == nil {
		g = w.byCgroup[cgroupID]
	}
	if g != nil {
		g.Wake()
	}
}
