package daemon

import (
	"fmt"
	"path"
	"regexp"
	"strings"
)

// containerID matches the 64-hex container ids runtimes put in cgroup
// paths: /docker/<id>, docker-<id>.scope, cri-containerd-<id>.scope,
// crio-<id>.scope, libpod-<id>.scope, /kubepods/.../<id>.
var containerID = regexp.MustCompile(`(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$`)

// DefaultName names the tenant of a cgroup no policy entry names: its path,
// or "cgroup id N" where the path is unknown. Such a name is one cgroup's
// alone, and no other tenant's can equal it: the names of policy entries,
// attachments and workloads have neither '/' nor spaces.
func DefaultName(cgroupPath string, cgroupID uint64) string {
	if cgroupPath == "" {
		return fmt.Sprintf("cgroup id %d", cgroupID)
	}
	return cgroupPath
}

// Label is what the tables show of a default tenant: its container (the
// short id) or, for other cgroups, its systemd unit or path. Two tenants
// may share a label: it is for display only, never a key.
func Label(cgroupPath string) string {
	if m := containerID.FindStringSubmatch(cgroupPath); m != nil {
		return m[1][:12]
	}
	if cgroupPath == "" {
		return "?"
	}
	if cgroupPath == "/" {
		return "/"
	}
	// A systemd unit reads better without its parents: user.slice/... -> unit.
	base := path.Base(cgroupPath)
	if strings.HasSuffix(base, ".service") || strings.HasSuffix(base, ".scope") {
		return base
	}
	return cgroupPath
}

// podCgroup tells whether a cgroup path lies under the kubelet's pods
// (cgroupfs "/kubepods/...", systemd "/kubepods.slice/...").
func podCgroup(cgroupPath string) bool {
	first, _, _ := strings.Cut(strings.TrimPrefix(cgroupPath, "/"), "/")
	return first == "kubepods" || first == "kubepods.slice"
}
