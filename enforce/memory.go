package enforce

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/policy"
)

// MemoryTarget is one tenant's GPU memory limit and who it covers.
type MemoryTarget struct {
	Limit policy.MemoryLimit
	// Cgroups (with everything below them) and PIDs are its processes:
	// a cgroup tenant's cgroup, a pid tenant's tree.
	Cgroups []uint64
	PIDs    []int
}

// MemoryUsage is what a limited tenant holds and what its limit did.
type MemoryUsage struct {
	Limit   policy.MemoryLimit
	Charged map[int]uint64 // bytes by GPU, as the probes charged them
	Kills   map[int]uint64 // processes killed at an allocation past the limit, by GPU
}

// MemoryLimits holds tenants' GPU memory to their limits in the probes
// (bpf.MemoryLimit: the OOM killer at the driver boundary). Safe for
// concurrent use; Sync is called by one goroutine at a time.
type MemoryLimits struct {
	probes *bpf.Probes
	start  time.Time
	mu     sync.Mutex
	limits map[string]*memoryLimit
	// released tells that the slots an earlier daemon held over and no
	// tenant adopted are released.
	released bool
}

// heldOverGrace is how long the slots an earlier daemon left hold over
// (their limits in force, their charges kept) for a tenant to adopt them
// (bpf.AdoptMemoryLimit): a container tenant is found by its processes,
// which the control steps see within seconds of the daemon's start.
const heldOverGrace = 30 * time.Second

type memoryLimit struct {
	slot   *bpf.MemoryLimit
	target MemoryTarget
}

// NewMemoryLimits holds limits in p's probes (nil: none can be held, and
// Sync refuses every limit).
func NewMemoryLimits(p *bpf.Probes) *MemoryLimits {
	return &MemoryLimits{probes: p, start: time.Now(), limits: map[string]*memoryLimit{}}
}

// Sync makes the limits exactly targets, by tenant name: new ones adopt
// the slot an earlier daemon left with any of their members, with its
// charges, or take a fresh one; changed ones update theirs, those gone
// give it back. From heldOverGrace after the start, the slots nobody
// adopted are released.
func (m *MemoryLimits) Sync(targets map[string]MemoryTarget) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for name, l := range m.limits {
		if _, ok := targets[name]; !ok {
			errs = append(errs, l.slot.Close())
			delete(m.limits, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(targets)) {
		want := targets[name]
		l := m.limits[name]
		if l == nil {
			if m.probes == nil {
				errs = append(errs, fmt.Errorf("GPU memory limit of %s: no probes", name))
				continue
			}
			slot := m.probes.AdoptMemoryLimit(want.Cgroups, want.PIDs)
			if slot == nil {
				var err error
				if slot, err = m.probes.NewMemoryLimit(); err != nil {
					errs = append(errs, fmt.Errorf("GPU memory limit of %s: %w", name, err))
					continue
				}
			}
			l = &memoryLimit{slot: slot}
			m.limits[name] = l
		}
		// Members first: a lower limit never applies to members that are
		// about to go.
		if err := l.slot.SetMembers(want.Cgroups, want.PIDs); err != nil {
			errs = append(errs, fmt.Errorf("GPU memory limit of %s: %w", name, err))
		}
		if l.target.Limit != want.Limit {
			if err := l.slot.SetLimit(uint64(want.Limit.Bytes), want.Limit.Share); err != nil {
				errs = append(errs, fmt.Errorf("GPU memory limit of %s: %w", name, err))
				continue
			}
		}
		l.target = want
	}
	if !m.released && m.probes != nil && (targets == nil || time.Since(m.start) >= heldOverGrace) {
		m.released = true
		if err := m.probes.ReleaseHeldOverMemoryLimits(); err != nil {
			errs = append(errs, fmt.Errorf("GPU memory limits an earlier daemon left: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Usage reads every limited tenant's charges and kills, by name.
func (m *MemoryLimits) Usage() map[string]MemoryUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]MemoryUsage, len(m.limits))
	for name, l := range m.limits {
		u, err := l.slot.Usage()
		if err != nil {
			continue // its slot is still there: read at the next step
		}
		out[name] = MemoryUsage{Limit: l.target.Limit, Charged: u.Charged, Kills: u.Kills}
	}
	return out
}

// Close gives every slot back: no limit holds after it.
func (m *MemoryLimits) Close() error {
	return m.Sync(nil)
}

// Leave forgets every limit and leaves its slot, members and charges in
// the probes' pins for the next daemon to adopt.
func (m *MemoryLimits) Leave() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.limits = map[string]*memoryLimit{}
}

// Set makes or updates one tenant's limit, leaving the others as they are
// (a tenant attached between control steps is limited at once).
func (m *MemoryLimits) Set(name string, target MemoryTarget) error {
	m.mu.Lock()
	targets := make(map[string]MemoryTarget, len(m.limits)+1)
	for n, l := range m.limits {
		targets[n] = l.target
	}
	m.mu.Unlock()
	targets[name] = target
	return m.Sync(targets)
}

// Owner names the tenant whose limit holds the probes' slot (a
// MemoryAllocated's LimitSlot); "" when none does now.
func (m *MemoryLimits) Owner(slot uint32) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, l := range m.limits {
		if l.slot.Slot() == slot {
			return name
		}
	}
	return ""
}
