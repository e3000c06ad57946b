package policy

import (
	"cmp"
	"fmt"
	"path"
	"strings"
)

// Admission bounds what a workload may ask for itself. Rules a workload
// brings (a container's gpuarb.io/* annotations, a VM's domain metadata)
// are written by whoever starts the workload, not by the operator: a pod
// could otherwise ask for weight 10000, or latency priority with an SLO
// that pushes every other tenant down. The operator's own entries (the
// policy file, `gpuarb attach` run as root) are never bounded by it.
type Admission struct {
	// CgroupPrefix selects the workloads whose cgroup is this one or
	// under it ("/" for all). Where several match, the longest applies.
	CgroupPrefix string `yaml:"cgroup_prefix" json:"cgroup_prefix"`
	// MaxWeight caps a requested weight (0: 10000, no cap).
	MaxWeight Weight `yaml:"max_weight,omitempty" json:"max_weight,omitempty"`
	// MaxMemoryLimit bounds a workload's GPU memory limit: an amount, a
	// share of each GPU's memory, or both. A request above it, or none, is
	// admitted with each part of the bound the request lacks or exceeds
	// (zero: no bound).
	MaxMemoryLimit MemoryLimit `yaml:"max_memory_limit,omitempty" json:"max_memory_limit,omitzero"`
	// AllowLatency admits requests for latency priority and SLOs; without
	// it such a request is admitted as priority normal with no SLO.
	AllowLatency bool `yaml:"allow_latency,omitempty" json:"allow_latency,omitempty"`
}

// validate checks one admission rule; field prefixes field names.
func (a *Admission) validate(field string) error {
	if !strings.HasPrefix(a.CgroupPrefix, "/") || path.Clean(a.CgroupPrefix) != a.CgroupPrefix {
		return &FieldError{field + ".cgroup_prefix", fmt.Sprintf("%q is not a clean absolute cgroup path (/kubepods.slice, or / for all)", a.CgroupPrefix)}
	}
	if a.MaxWeight != 0 && (a.MaxWeight < MinWeight || a.MaxWeight > MaxWeight) {
		return &FieldError{field + ".max_weight", fmt.Sprintf("%d out of range %d–%d", a.MaxWeight, MinWeight, MaxWeight)}
	}
	if err := a.MaxMemoryLimit.validate(); err != nil {
		return &FieldError{field + ".max_memory_limit", err.Error()}
	}
	return nil
}

// covers tells whether the rule selects a workload in cgroup cg.
func (a *Admission) covers(cg string) bool {
	if a.CgroupPrefix == "/" {
		return true
	}
	return cg == a.CgroupPrefix || strings.HasPrefix(cg, a.CgroupPrefix+"/")
}

// DefaultAdmission bounds what workloads ask for themselves where the
// policy has no admission rules: weights up to 1000, and neither latency
// priority nor an SLO (a pod could otherwise take latency priority on any
// node). An operator who trusts every pod author says so with rules of
// their own (allow_latency, a higher max_weight).
var DefaultAdmission = []Admission{{CgroupPrefix: "/", MaxWeight: 1000}}

// AdmissionRules are the admission rules in force: the policy's, else
// DefaultAdmission.
func (c *Config) AdmissionRules() []Admission {
	if len(c.Admission) == 0 {
		return DefaultAdmission
	}
	return c.Admission
}

// AdmissionFor returns the rule that bounds a workload in cgroup cg (a
// path as in /proc/PID/cgroup): the matching rule in force with the
// longest prefix; ok is false when none matches and the workload's
// request stands as made.
func (c *Config) AdmissionFor(cg string) (a Admission, ok bool) {
	for _, r := range c.AdmissionRules() {
		if r.covers(cg) && (!ok || len(r.CgroupPrefix) > len(a.CgroupPrefix)) {
			a, ok = r, true
		}
	}
	return a, ok
}

// Admit bounds rules a workload in cgroup cg requested by the admission
// rule that covers it, and says what it changed (nothing when no rule
// covers cg or the request is within bounds).
func (c *Config) Admit(cg string, r *Rules) (changed []string) {
	a, ok := c.AdmissionFor(cg)
	if !ok {
		return nil
	}
	by := fmt.Sprintf("the admission rule for %s", a.CgroupPrefix)
	if a.MaxWeight != 0 && r.Weight > a.MaxWeight {
		changed = append(changed, fmt.Sprintf("weight %d lowered to %d by %s", r.Weight, a.MaxWeight, by))
		r.Weight = a.MaxWeight
	}
	if m, bounded := r.MemoryLimit, r.MemoryLimit.within(a.MaxMemoryLimit); bounded != m {
		was := "no GPU memory limit"
		if !m.IsZero() {
			was = "GPU memory limit " + m.String()
		}
		r.MemoryLimit = bounded
		changed = append(changed, fmt.Sprintf("%s lowered to %s by %s", was, bounded, by))
	}
	if !a.AllowLatency && (r.Priority == Latency || r.SLO != (SLO{})) {
		// The defaults' priority, unless that is latency too.
		r.Priority, r.SLO = "", SLO{}
		if c.Defaults.Priority == Latency {
			r.Priority = Normal
		}
		changed = append(changed, fmt.Sprintf("priority latency and SLOs are not admitted by %s: admitted with priority %s",
			by, cmp.Or(r.Priority, c.Defaults.Priority, Normal)))
	}
	return changed
}
