package cgroup

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Mode describes the host's cgroup setup.
type Mode struct {
	// Name is "unified", "hybrid" or "legacy".
	Name string `json:"mode"`
	// UnifiedMount is the cgroup v2 mount point, "" on legacy hosts.
	UnifiedMount string `json:"unified_mount"`
	// Freeze tells whether cgroup v2 cgroup.freeze is available.
	Freeze bool `json:"freeze"`
	// V1Freezer tells whether the v1 freezer controller is mounted.
	V1Freezer bool `json:"v1_freezer"`
}

// V1FreezerMount is where hybrid and legacy hosts mount the v1 freezer.
const V1FreezerMount = "/sys/fs/cgroup/freezer"

// DetectMode inspects /sys/fs/cgroup and the mounts.
func DetectMode() Mode {
	var m Mode
	m.UnifiedMount, _ = UnifiedMount()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		m.Name = "unified"
	} else if m.UnifiedMount != "" {
		m.Name = "hybrid"
	} else {
		m.Name = "legacy"
	}
	if m.UnifiedMount != "" {
		// cgroup.freeze exists in every non-root cgroup (kernel 5.2+); the
		// kernel exposes the same support through cgroup.events' "frozen".
		m.Freeze = hasFreezeFile(m.UnifiedMount)
	}
	if err := unix.Statfs(V1FreezerMount, &st); err == nil && st.Type == unix.CGROUP_SUPER_MAGIC {
		_, err := os.Stat(filepath.Join(V1FreezerMount, "tasks"))
		m.V1Freezer = err == nil
	}
	return m
}

func hasFreezeFile(root string) bool {
	entries, err := os.ReadDir(root)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, e.Name(), "cgroup.freeze")); err == nil {
			return true
		}
	}
	// No child cgroup to look at: try one.
	dir, err := os.MkdirTemp(root, "gpuarb-probe-")
	if err != nil {
		return false
	}
	defer os.Remove(dir)
	_, err = os.Stat(filepath.Join(dir, "cgroup.freeze"))
	return err == nil
}
