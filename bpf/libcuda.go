package bpf

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// RunningLibcudas names the files named libcuda* that running processes
// map, as "PATH (pid N)", for display: nothing is opened. The probes find
// them by mapping (Probes.AttachHost), never by these paths.
func RunningLibcudas() []string {
	var out []string
	seen := map[string]bool{}
	for _, pid := range processes() {
		for _, path := range mappedLibcudaNames(pid) {
			if !seen[path] {
				seen[path] = true
				out = append(out, fmt.Sprintf("%s (pid %d)", path, pid))
			}
		}
	}
	return out
}

// processes lists the pids in /proc.
func processes() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mappedLibcudaNames returns the paths, as its maps show them, of the
// files named libcuda* a process maps.
func mappedLibcudaNames(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 6 {
			continue
		}
		path := strings.Join(fields[5:], " ")
		if strings.HasPrefix(path, "/") && IsLibcudaName(path) && !slices.Contains(out, path) {
			out = append(out, path)
		}
	}
	return out
}

// untrustedFS are the filesystems whose files gpuarb never reads: remote
// and user-space ones, where a read can block as long as the server
// wishes (a tenant's FUSE mount) or reach another machine. By statfs(2)
// magic.
var untrustedFS = map[int64]string{
	0x65735546: "FUSE", 0x6969: "NFS", 0xFF534D42: "CIFS", 0xFE534D42: "SMB2", 0x517B: "SMB", 0x01021997: "9P",
	0x00C36400: "Ceph", 0x5346414F: "AFS", 0x73757245: "Coda", 0x0BD00BD0: "Lustre", 0x19830326: "fhgfs",
	0x47504653: "GPFS", 0x013111A8: "IBRIX", 0x6B414653: "kAFS", 0x564C: "NCP", 0x7461636F: "OCFS2",
}

// openRegular opens for reading the file a path names (resolved from
// dirfd with the resolve flags of openat2), never acting on anything but a
// regular file of at most maxELFSize bytes on a local filesystem: it is
// opened as a path only (O_PATH: opening a device node, a FIFO or a
// socket for reading can act on it or block), checked (fstat, fstatfs),
// and only then opened for reading, through that very inode. A path whose
// last component is a magic link (/proc/PID/map_files/ADDR) needs resolve
// without RESOLVE_NO_MAGICLINKS.
func openRegular(dirfd int, path string, resolve uint64) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	pfd, err := unix.Openat2(dirfd, path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolve})
	if err != nil {
		return nil, st, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(pfd)
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, st, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > maxELFSize {
		return nil, st, fmt.Errorf("%s: not a regular file of at most %d bytes: %w", path, maxELFSize, ErrNotLibcuda)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(pfd, &fs); err != nil {
		return nil, st, &os.PathError{Op: "fstatfs", Path: path, Err: err}
	}
	if name, bad := untrustedFS[int64(fs.Type)]; bad {
		return nil, st, fmt.Errorf("%s: on a %s filesystem, whose reads may block: %w", path, name, ErrNotLibcuda)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, st, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), st, nil
}

// openLibcuda opens a libcuda the operator or the host's linker cache
// names (never a tenant's path: those are found by mapping), as
// openRegular does, following no magic link.
func openLibcuda(path string) (*os.File, unix.Stat_t, error) {
	return openRegular(unix.AT_FDCWD, path, unix.RESOLVE_NO_MAGICLINKS)
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
// /proc/PID/map_files, its very inode, as openRegular does.
func openMapping(pid int, addr string) (*os.File, unix.Stat_t, error) {
	return openRegular(unix.AT_FDCWD, fmt.Sprintf("/proc/%d/map_files/%s", pid, addr), 0)
}
