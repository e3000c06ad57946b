// Package exact reads exact per-process GPU busy time where the host offers
// it, so the daemon can report the estimator's error next to its figures.
// DRM drivers publish it in /proc/PID/fdinfo (drm-engine-*, see the
// kernel's drm-usage-stats); NVML's per-process utilization would be
// another Source. Nothing here is needed to build, test or meter.
package exact

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Sample is cumulative GPU busy ns per process at one instant.
type Sample map[uint32]uint64

// Source is a provider of exact per-process GPU time.
type Source interface {
	// Name names the source in the status ("drm-fdinfo").
	Name() string
	// Sample returns cumulative busy ns per process.
	Sample() (Sample, error)
}

// DRMFdinfo reads drm-engine-* counters from /proc/PID/fdinfo.
type DRMFdinfo struct {
	// Proc is the proc filesystem's root (default /proc).
	Proc string
}

// Name implements Source.
func (DRMFdinfo) Name() string { return "drm-fdinfo" }

func (d DRMFdinfo) proc() string {
	if d.Proc == "" {
		return "/proc"
	}
	return d.Proc
}

// clientKey names one DRM client: fds that share it (dup, fork, SCM_RIGHTS)
// must be counted once.
type clientKey struct {
	pdev string
	id   string
}

// Sample implements Source. A client shared by several processes is
// counted for the lowest PID that holds it.
func (d DRMFdinfo) Sample() (Sample, error) {
	entries, err := os.ReadDir(d.proc())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", d.proc(), err)
	}
	out := Sample{}
	seen := map[clientKey]bool{}
	pids := make([]int, 0, len(entries))
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	for _, pid := range pids {
		dir := filepath.Join(d.proc(), strconv.Itoa(pid), "fdinfo")
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, fd := range fds {
			info, ok := parseFdinfo(filepath.Join(dir, fd.Name()))
			if !ok || seen[info.key] {
				continue
			}
			seen[info.key] = true
			out[uint32(pid)] += info.busyNS
		}
	}
	return out, nil
}

// Available reports whether any process has a DRM client to read.
func (d DRMFdinfo) Available() bool {
	s, err := d.Sample()
	return err == nil && len(s) > 0
}

type fdinfo struct {
	key    clientKey
	busyNS uint64
}

// parseFdinfo reads one fdinfo file; ok is false when it is not a DRM
// client with engine counters.
func parseFdinfo(path string) (fdinfo, bool) {
	f, err := os.Open(path)
	if err != nil {
		return fdinfo{}, false
	}
	defer f.Close()
	var info fdinfo
	engines := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch {
		case k == "drm-client-id":
			info.key.id = v
		case k == "drm-pdev":
			info.key.pdev = v
		case strings.HasPrefix(k, "drm-engine-") && !strings.HasPrefix(k, "drm-engine-capacity-"):
			num, unit, _ := strings.Cut(v, " ")
			n, err := strconv.ParseUint(num, 10, 64)
			if err != nil || unit != "ns" {
				continue
			}
			info.busyNS += n
			engines = true
		}
	}
	return info, engines && info.key.id != ""
}

// Shares turns two samples taken elapsedNS apart into a share of GPU time
// per group (the daemon groups processes by cgroup); processes group maps
// to "" are left out.
func Shares(prev, cur Sample, elapsedNS uint64, group func(pid uint32) string) map[string]float64 {
	out := map[string]float64{}
	if elapsedNS == 0 {
		return out
	}
	for pid, ns := range cur {
		before, ok := prev[pid]
		if !ok || ns < before {
			continue // new process, or a reused PID: no interval to measure
		}
		if g := group(pid); g != "" {
			out[g] += float64(ns-before) / float64(elapsedNS)
		}
	}
	return out
}
