package ocihook

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Integration is how a node's container runtime hands its containers to
// gpuarb: through NRI (the daemon registers them itself) or through OCI
// hooks in a hooks.d directory the runtime reads.
type Integration struct {
	// Runtime is "containerd", "crio" or "" when not told by a socket.
	Runtime string
	// NRISocket is the runtime's NRI socket (host path), when it serves
	// one: the integration to use.
	NRISocket string
	// HooksDir is where the runtime reads OCI hooks (host path), when
	// there is no NRI.
	HooksDir string
}

// Host paths DetectIntegration looks at, below the host's root.
const (
	NRISocketPath = "/var/run/nri/nri.sock"
	// CRIOHooksDir is the hooks directory CRI-O reads when its
	// configuration names none (its compiled-in hooks_dir).
	CRIOHooksDir = "/usr/share/containers/oci/hooks.d"
)

// ErrNoIntegration says that no runtime on the node can hand gpuarb its
// containers without changes to the runtime's configuration.
var ErrNoIntegration = errors.New("no container runtime integration")

// DetectIntegration finds, on the host whose root is mounted at root, how
// its runtime reaches gpuarb: NRI where its socket exists (containerd ≥
// 2.0, CRI-O ≥ 1.30, and older ones with NRI enabled), else CRI-O's
// hooks_dir (its configuration and drop-ins, else its default). A
// containerd without NRI is an error that says what to do: its hooks need
// a base runtime spec and a restart, which a DaemonSet cannot make.
func DetectIntegration(root string) (Integration, error) {
	var in Integration
	exists := func(p string) bool { _, err := os.Stat(filepath.Join(root, p)); return err == nil }
	switch {
	case exists("/run/containerd/containerd.sock"):
		in.Runtime = "containerd"
	case exists("/run/crio/crio.sock") || exists("/etc/crio"):
		in.Runtime = "crio"
	}
	for _, p := range []string{"/run/nri/nri.sock", NRISocketPath} {
		if st, err := os.Stat(filepath.Join(root, p)); err == nil && st.Mode()&os.ModeSocket != 0 {
			in.NRISocket = p
			return in, nil
		}
	}
	switch in.Runtime {
	case "crio":
		dirs, err := crioHooksDirs(root)
		if err != nil {
			return in, err
		}
		in.HooksDir = CRIOHooksDir
		if len(dirs) > 0 {
			in.HooksDir = dirs[0]
		}
		return in, nil
	case "containerd":
		return in, fmt.Errorf("%w: containerd serves no NRI socket (%s): containerd 1.7 has NRI off by default (set disable = false in [plugins.\"io.containerd.nri.v1.nri\"] and restart it); containerd 1.6 has none, and takes the OCI hook through a base runtime spec and pod_annotations (docs/deploy.md, \"containerd 1.6 and 1.7\")", ErrNoIntegration, NRISocketPath)
	}
	return in, fmt.Errorf("%w: neither containerd (/run/containerd/containerd.sock) nor CRI-O (/run/crio/crio.sock, /etc/crio) found under %s, and no NRI socket (%s)", ErrNoIntegration, root, NRISocketPath)
}

// hooksDirLine matches a hooks_dir setting's start in CRI-O's TOML.
var hooksDirLine = regexp.MustCompile(`(?m)^\s*hooks_dir\s*=\s*\[`)

// crioHooksDirs reads hooks_dir from /etc/crio/crio.conf and then the
// drop-ins of /etc/crio/crio.conf.d in name order (a later setting
// replaces an earlier one, as CRI-O merges them); nil when none sets it.
func crioHooksDirs(root string) ([]string, error) {
	files := []string{filepath.Join(root, "/etc/crio/crio.conf")}
	dropins, _ := filepath.Glob(filepath.Join(root, "/etc/crio/crio.conf.d/*.conf"))
	sort.Strings(dropins)
	var dirs []string
	for _, f := range append(files, dropins...) {
		data, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("CRI-O configuration: %w", err)
		}
		loc := hooksDirLine.FindIndex(data)
		if loc == nil {
			continue
		}
		rest := string(data[loc[1]:])
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return nil, fmt.Errorf("CRI-O configuration %s: hooks_dir: no closing ']'", f)
		}
		dirs = nil
		for _, item := range strings.Split(rest[:end], ",") {
			item = strings.TrimSpace(stripComment(item))
			if item = strings.Trim(item, `"'`); item != "" {
				dirs = append(dirs, item)
			}
		}
	}
	return dirs, nil
}

// stripComment drops a TOML comment that fills the rest of a line inside
// an array.
func stripComment(s string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}
