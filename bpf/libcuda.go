package bpf

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
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

var (
	// inProcessRoot is a path through a process's root: /proc/PID/root/...
	inProcessRoot = regexp.MustCompile(`^(/proc/[0-9]+/root)(/.*)$`)
	// inProcessDir is a path below a process's working directory or an
	// open directory of it.
	inProcessDir = regexp.MustCompile(`^(/proc/[0-9]+/(?:cwd|fd/[0-9]+))/(.+)$`)
)

// maxLibcudaSize bounds the files parsed as libcuda (the driver's is tens of
// MiB).
const maxLibcudaSize = 1 << 30

// openLibcuda opens a libcuda candidate once, without blocking and without
// leaving the filesystem of the process that named it: a path through
// /proc/PID/root is resolved inside that root (RESOLVE_IN_ROOT: a
// container's absolute symlinks stay in the container), one below a
// process's working directory or open directory follows no symlink and
// stays beneath it. Only a regular file of sane size qualifies: a FIFO
// named libcuda.so.1 would block whoever reads it.
func openLibcuda(path string) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY}
	dir, rest := "", path
	if m := inProcessRoot.FindStringSubmatch(path); m != nil {
		dir, rest = m[1], m[2]
		how.Resolve = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS
	} else if m := inProcessDir.FindStringSubmatch(path); m != nil {
		dir, rest = m[1], m[2]
		how.Resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS
	}
	dirfd := unix.AT_FDCWD
	if dir != "" {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, st, &os.PathError{Op: "open", Path: dir, Err: err}
		}
		defer unix.Close(fd)
		dirfd = fd
	}
	fd, err := unix.Openat2(dirfd, rest, &how)
	if err != nil {
		return nil, st, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, st, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > maxLibcudaSize {
		f.Close()
		return nil, st, fmt.Errorf("not a regular file of at most 1 GiB: %w", ErrNotLibcuda)
	}
	return f, st, nil
}

// mapping is one executable file mapping of a process, from its maps.
type mapping struct {
	addr string // "start-end", its name under /proc/PID/map_files
	id   fileID
	path string // as maps shows it ("/memfd:x (deleted)" for a memfd)
}

// executableMappings lists the distinct files a process maps executable.
func executableMappings(pid int) ([]mapping, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, fmt.Errorf("mappings of pid %d: %w", pid, err)
	}
	return parseMaps(data), nil
}

// parseMaps reads the executable file mappings out of a /proc/PID/maps
// text, one per file (its device and inode).
func parseMaps(data []byte) []mapping {
	var out []mapping
	seen := map[fileID]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		// start-end perms offset major:minor inode [path]
		fields := strings.Fields(line)
		if len(fields) < 6 || len(fields[1]) < 3 || fields[1][2] != 'x' {
			continue
		}
		maj, mnr, ok := strings.Cut(fields[3], ":")
		if !ok {
			continue
		}
		major, err1 := strconv.ParseUint(maj, 16, 32)
		minor, err2 := strconv.ParseUint(mnr, 16, 32)
		ino, err3 := strconv.ParseUint(fields[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || ino == 0 {
			continue
		}
		id := fileID{dev: unix.Mkdev(uint32(major), uint32(minor)), ino: ino}
		if seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, mapping{addr: fields[0], id: id, path: strings.Join(fields[5:], " ")})
	}
	return out
}

// openMapping opens the file behind one mapping of a process through
// /proc/PID/map_files: first as a path only (opening a mapped device
// node for reading could act on the device), then, a regular file of
// sane size, for reading through that very inode.
func openMapping(pid int, addr string) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	name := fmt.Sprintf("/proc/%d/map_files/%s", pid, addr)
	pfd, err := unix.Open(name, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, st, &os.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(pfd)
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, st, &os.PathError{Op: "fstat", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > maxLibcudaSize {
		return nil, st, fmt.Errorf("%s: not a regular file of at most 1 GiB: %w", name, ErrNotLibcuda)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, st, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), st, nil
}

// LibcudaOpensDropped counts the opens of files named libcuda.so* the
// probes did not report since they were loaded: their cgroup had spent its
// budget (64 at once, then 64 a second), so a flood of opens cannot fill
// the ring buffer.
func (p *Probes) LibcudaOpensDropped() (uint64, error) {
	var n uint64
	if err := p.objs.GpuarbOpenDrops.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("read dropped libcuda opens: %w", err)
	}
	return n, nil
}
