package daemon

import (
	"path"
	"regexp"
	"strings"
)

// containerID matches the 64-hex container ids runtimes put in cgroup
// paths: /docker/<id>, docker-<id>.scope, cri-containerd-<id>.scope,
// crio-<id>.scope, libpod-<id>.scope, /kubepods/.../<id>.
var containerID = regexp.MustCompile(`(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$`)

// TenantName names a tenant after its container (the short id) or, for
// other cgroups, after its path.
func TenantName(cgroupPath string) string {
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
