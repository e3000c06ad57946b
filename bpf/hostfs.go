package bpf

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Filesystem mount points the probes need.
const (
	BPFFSPath   = "/sys/fs/bpf"
	TracefsPath = "/sys/kernel/tracing"
)

// EnsureFilesystems mounts bpffs and tracefs when they are absent, as
// cilium/ebpf's tracepoint attach reads tracefs. It reports what it mounted.
func EnsureFilesystems() (mounted []string, err error) {
	for _, fs := range []struct {
		path, typ string
		magic     int64
	}{
		{BPFFSPath, "bpf", unix.BPF_FS_MAGIC},
		{TracefsPath, "tracefs", unix.TRACEFS_MAGIC},
	} {
		ok, err := isFS(fs.path, fs.magic)
		if err != nil {
			return mounted, err
		}
		if ok {
			continue
		}
		if err := os.MkdirAll(fs.path, 0o755); err != nil {
			return mounted, fmt.Errorf("create %s: %w", fs.path, err)
		}
		if err := unix.Mount(fs.typ, fs.path, fs.typ, 0, ""); err != nil {
			return mounted, fmt.Errorf("mount %s on %s: %w", fs.typ, fs.path, err)
		}
		mounted = append(mounted, fs.path)
	}
	return mounted, nil
}

func isFS(path string, magic int64) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return int64(st.Type) == magic, nil
}

// FilesystemMounted reports whether path holds a filesystem with the given
// magic (unix.BPF_FS_MAGIC, unix.TRACEFS_MAGIC).
func FilesystemMounted(path string, magic int64) bool {
	ok, _ := isFS(path, magic)
	return ok
}
