package enforce

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
)

// GateTarget is what a tenant's freeze gate stops: a pid tenant's process
// tree, or a cgroup tenant's cgroup.
type GateTarget struct {
	// PID is a pid tenant's root (0: a cgroup tenant); Attached tells
	// whether it is still the process that was attached (its start time).
	PID      int
	Attached bool
	// Tree lists a pid tenant's processes at each freeze.
	Tree func() *[]int
	// Cgroup is a cgroup tenant's v2 path below the mount ("cgroup:ID"
	// while its path is unknown); AnyPID one of its processes, whose v1
	// freezer cgroup a legacy host freezes.
	Cgroup string
	AnyPID int
}

// FreezeGate makes the gate that freezes t: SIGSTOP of a pid tenant's
// tree, recorded process by process in ledger, or its cgroup's v2 freeze
// (v1 freezer on legacy hosts, per mode). It refuses what must never be
// stopped: a root that is no longer the process attached, a cgroup whose
// path is unknown, a host without a freezer.
func FreezeGate(t GateTarget, mode cgroup.Mode, mount string, ledger *cgroup.Ledger) (cgroup.Gate, error) {
	if t.PID != 0 {
		if !t.Attached {
			return nil, fmt.Errorf("pid %d is no longer the process attached", t.PID)
		}
		return cgroup.NewSignalGate(t.PID, func() []int {
			if tree := t.Tree(); tree != nil {
				return *tree
			}
			return nil
		}, ledger)
	}
	if strings.HasPrefix(t.Cgroup, "cgroup:") {
		return nil, errors.New("its cgroup path is unknown")
	}
	if mode.Freeze {
		return cgroup.NewV2Gate(mount, t.Cgroup)
	}
	if mode.V1Freezer {
		rel, err := cgroup.V1ProcessPath(t.AnyPID, "freezer")
		if err != nil {
			return nil, err
		}
		return cgroup.NewV1Gate(rel)
	}
	return nil, errors.New("no cgroup freezer on this host")
}

// NewProbesLaunchGate makes a launch gate in the probes over a cgroup
// tenant's cgroup and what is below it (cgroupPath, below mount) or, where
// cgroupPath is "", over a pid tenant's processes pids.
func NewProbesLaunchGate(p *bpf.Probes, mount, cgroupPath string, pids []int) (*bpf.LaunchGate, error) {
	if p == nil {
		return nil, errors.New("no probes")
	}
	var cgroups []uint64
	if cgroupPath != "" {
		id, err := cgroup.ID(filepath.Join(mount, cgroupPath))
		if err != nil {
			return nil, err
		}
		cgroups = []uint64{id}
	}
	lg, err := p.NewLaunchGate()
	if err != nil {
		return nil, err
	}
	if err := lg.SetMembers(cgroups, pids); err != nil {
		return nil, errors.Join(err, lg.Close())
	}
	return lg, nil
}
