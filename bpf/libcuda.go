package bpf

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// IsLibcudaName reports whether a file name is a libcuda shared object
// (libcuda.so, libcuda.so.1, libcuda.so.550.54.14).
func IsLibcudaName(name string) bool {
	return strings.HasPrefix(filepath.Base(name), "libcuda.so")
}

// LinkerCacheLibcudas returns the libcuda paths the dynamic linker cache
// names (ldconfig -p); none when ldconfig is absent.
func LinkerCacheLibcudas() []string {
	return parseLdconfig(ldconfigOutput(), IsLibcudaName)
}

func ldconfigOutput() []byte {
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		ldconfig = "/sbin/ldconfig"
	}
	out, _ := exec.Command(ldconfig, "-p").Output()
	return out
}

// linkerCachePath returns the first path the linker cache has for a library.
func linkerCachePath(soname string) (string, error) {
	paths := parseLdconfig(ldconfigOutput(), func(p string) bool { return filepath.Base(p) == soname })
	if len(paths) == 0 {
		return "", fmt.Errorf("%s not in the linker cache", soname)
	}
	return paths[0], nil
}

func parseLdconfig(out []byte, match func(string) bool) []string {
	var paths []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		_, path, ok := strings.Cut(sc.Text(), "=>")
		if !ok {
			continue
		}
		path = strings.TrimSpace(path)
		if match(path) {
			paths = append(paths, path)
		}
	}
	return paths
}

// ProcessLibcudas returns the libcuda copies mapped by running processes,
// each as /proc/PID/root/PATH so copies inside containers resolve.
func ProcessLibcudas() []string {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var paths []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		for _, p := range MappedLibcudas(pid) {
			if !seen[p] {
				seen[p] = true
				paths = append(paths, p)
			}
		}
	}
	return paths
}

// MappedLibcudas returns the libcuda files one process maps, as paths
// through its /proc/PID/root.
func MappedLibcudas(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil
	}
	var out []string
	seen := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 6 {
			continue
		}
		path := strings.Join(fields[5:], " ")
		if !strings.HasPrefix(path, "/") || !IsLibcudaName(path) || seen[path] {
			continue
		}
		seen[path] = true
		out = append(out, ProcessPath(pid, path))
	}
	return out
}

// ProcessPath resolves a path as process pid sees it: absolute paths
// through /proc/PID/root, relative ones through /proc/PID/cwd.
func ProcessPath(pid int, path string) string {
	if filepath.IsAbs(path) {
		return fmt.Sprintf("/proc/%d/root%s", pid, path)
	}
	return filepath.Join(fmt.Sprintf("/proc/%d/cwd", pid), path)
}
