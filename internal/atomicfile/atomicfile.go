// Package atomicfile replaces a file whole: a reader sees the old content
// or the new, never part of either, and a writer that dies midway leaves
// the old file. The new content goes to a fresh file beside the target
// (created exclusively, under a name no one can plant a file or link at
// beforehand) and is renamed over it.
//
// The files it writes describe processes and cgroups (ledgers, tables,
// registrations), which a power loss ends too, so it does not fsync: the
// rename is atomic against a crash of the writer, not durable across a
// crash of the host.
package atomicfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Write replaces the file at path with data, with mode perm whatever the
// umask.
func Write(path string, data []byte, perm os.FileMode) error {
	return WriteFrom(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFrom replaces the file at path with what fill writes, with mode
// perm whatever the umask. Where fill or any step fails, the file at
// path is left as it was and nothing is left beside it.
func WriteFrom(path string, perm os.FileMode, fill func(io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp*")
	if err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	err = fill(tmp)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return nil
}
