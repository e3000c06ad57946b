package ocihook

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/gpuarb/gpuarb/cgroup"
)

// SpecCgroupPath turns linux.cgroupsPath into the cgroup path the
// container gets, as /proc/PID/cgroup shows it:
//   - cgroupfs form: "/kubepods/pod1/ctr" (absolute, as is) or "a/b"
//     (relative, under the root);
//   - systemd form "slice:prefix:name": the slice expanded as systemd
//     nests it ("a-b.slice" is "/a.slice/a-b.slice"; "" means
//     system.slice, "-.slice" the root) and the unit "prefix-name.scope"
//     (a name ending in ".slice" is a slice of its own);
//   - "" (the runtime's default): "/<id>", runc's cgroupfs default.
func SpecCgroupPath(cgroupsPath, id string) (string, error) {
	if cgroupsPath == "" {
		return "/" + id, nil
	}
	parts := strings.Split(cgroupsPath, ":")
	switch len(parts) {
	case 1:
		return path.Clean("/" + cgroupsPath), nil
	case 3:
		slice, err := expandSlice(parts[0])
		if err != nil {
			return "", fmt.Errorf("linux.cgroupsPath %q: %w", cgroupsPath, err)
		}
		prefix, name := parts[1], parts[2]
		if name == "" || strings.Contains(name, "/") || strings.Contains(prefix, "/") {
			return "", fmt.Errorf("linux.cgroupsPath %q: the systemd form is slice:prefix:name, with no '/' in prefix or name", cgroupsPath)
		}
		if strings.HasSuffix(name, ".slice") {
			sub, err := expandSlice(name)
			if err != nil {
				return "", fmt.Errorf("linux.cgroupsPath %q: %w", cgroupsPath, err)
			}
			return path.Join(slice, path.Base(sub)), nil
		}
		unit := name + ".scope"
		if prefix != "" {
			unit = prefix + "-" + unit
		}
		return path.Join(slice, unit), nil
	default:
		return "", fmt.Errorf("linux.cgroupsPath %q is neither a path nor slice:prefix:name", cgroupsPath)
	}
}

// expandSlice nests a systemd slice name under its parents: "a-b.slice"
// is "/a.slice/a-b.slice".
func expandSlice(slice string) (string, error) {
	switch slice {
	case "":
		return "/system.slice", nil
	case "-.slice":
		return "/", nil
	}
	base, ok := strings.CutSuffix(slice, ".slice")
	if !ok || base == "" || strings.Contains(slice, "/") || strings.HasPrefix(base, "-") ||
		strings.HasSuffix(base, "-") || strings.Contains(base, "--") {
		return "", fmt.Errorf("%q is not a valid systemd slice name", slice)
	}
	p := ""
	prefix := ""
	for _, comp := range strings.Split(base, "-") {
		prefix += comp
		p += "/" + prefix + ".slice"
		prefix += "-"
	}
	return p, nil
}

// ContainerCgroup returns the container's cgroup. With the container's
// pid (createRuntime, prestart, poststart) the kernel's answer wins: it
// is right whatever the runtime made of cgroupsPath, and a disagreement
// with the spec is returned as a warning. Without a pid the spec decides.
func ContainerCgroup(cgroupsPath, id string, pid int, procRoot string) (cg, warning string, err error) {
	fromSpec, specErr := SpecCgroupPath(cgroupsPath, id)
	if pid <= 0 {
		return fromSpec, "", specErr
	}
	fromProc, err := cgroup.GatePath(procRoot, pid)
	if err != nil {
		if specErr != nil {
			return "", "", fmt.Errorf("%w; %w", err, specErr)
		}
		return fromSpec, err.Error() + "; using linux.cgroupsPath", nil
	}
	if specErr != nil {
		return fromProc, specErr.Error() + "; using the cgroup of pid " + strconv.Itoa(pid), nil
	}
	if fromProc != fromSpec && cgroupsPath != "" {
		warning = fmt.Sprintf("linux.cgroupsPath %q reads as %s but pid %d is in %s; using the latter", cgroupsPath, fromSpec, pid, fromProc)
	}
	return fromProc, warning, nil
}
