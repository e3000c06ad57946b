// Package cgroup finds cgroups and their ids on cgroup v2 (unified or
// hybrid hosts) and, for the arbiter, freezes and thaws them. It knows
// nothing of GPUs.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNoUnified is returned when no cgroup v2 hierarchy is mounted.
var ErrNoUnified = errors.New("no cgroup v2 hierarchy mounted")

// UnifiedMount returns the mount point of the cgroup v2 hierarchy:
// /sys/fs/cgroup on unified hosts, /sys/fs/cgroup/unified on hybrid ones.
func UnifiedMount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		if fstype, _, _ := strings.Cut(post, " "); fstype != "cgroup2" {
			continue
		}
		if f := strings.Fields(pre); len(f) >= 5 {
			return f[4], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	return "", ErrNoUnified
}

// ID returns the cgroup v2 id of a cgroup directory (its inode number, as
// bpf_get_current_cgroup_id reports it).
func ID(dir string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("cgroup id of %s: %w", dir, err)
	}
	return st.Ino, nil
}

// ProcessPath returns the cgroup v2 path of a process as in
// /proc/PID/cgroup ("/" for the root).
func ProcessPath(pid int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", fmt.Errorf("cgroup of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return rest, nil
		}
	}
	return "", fmt.Errorf("cgroup of pid %d: no cgroup v2 entry", pid)
}

// V1ProcessPath returns a process's path in the v1 hierarchy of a
// controller ("freezer"), as in /proc/PID/cgroup.
func V1ProcessPath(pid int, controller string) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", fmt.Errorf("cgroup of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && f[0] != "0" && slices.Contains(strings.Split(f[1], ","), controller) {
			return f[2], nil
		}
	}
	return "", fmt.Errorf("cgroup of pid %d: no v1 %s hierarchy", pid, controller)
}

// GatePath reads from procRoot/PID/cgroup the cgroup a gate for pid
// would freeze: the unified (v2) entry, or on a v1-only host the freezer
// controller's.
func GatePath(procRoot string, pid int) (string, error) {
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", fmt.Errorf("cgroup of pid %d: %w", pid, err)
	}
	defer f.Close()
	freezer := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), ":", 3)
		if len(fields) != 3 {
			continue
		}
		if fields[0] == "0" && fields[1] == "" {
			return fields[2], nil
		}
		for _, c := range strings.Split(fields[1], ",") {
			if c == "freezer" {
				freezer = fields[2]
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("cgroup of pid %d: %w", pid, err)
	}
	if freezer == "" {
		return "", fmt.Errorf("pid %d has neither a cgroup v2 nor a freezer cgroup", pid)
	}
	return freezer, nil
}

// Resolver maps cgroup ids to paths relative to the v2 mount, walking the
// hierarchy again (at most once per minRescan) when an id is unknown.
type Resolver struct {
	root string

	mu       sync.Mutex
	paths    map[uint64]string
	lastScan time.Time
}

const minRescan = 200 * time.Millisecond

// NewResolver returns a resolver over the cgroup v2 mount at root.
func NewResolver(root string) *Resolver {
	return &Resolver{root: root, paths: map[uint64]string{}}
}

// Path returns the cgroup path ("/a/b") for id, or "" when unknown.
func (r *Resolver) Path(id uint64) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.paths[id]; ok {
		return p
	}
	if time.Since(r.lastScan) < minRescan {
		return ""
	}
	r.scan()
	return r.paths[id]
}

func (r *Resolver) scan() {
	r.lastScan = time.Now()
	paths := map[uint64]string{}
	_ = filepath.WalkDir(r.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil // a cgroup removed during the walk is skipped
		}
		id, err := ID(path)
		if err != nil {
			return nil
		}
		rel := strings.TrimPrefix(path, r.root)
		if rel == "" {
			rel = "/"
		}
		paths[id] = rel
		return nil
	})
	r.paths = paths
}
