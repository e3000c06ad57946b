package policy

import (
	"crypto/sha256"
	"errors"
	"io/fs"
	"os"

	"github.com/gpuarb/gpuarb/internal/atomicfile"
)

// KeepCopy copies the policy file at path to dst, atomically (a file
// beside dst, renamed over it), for a daemon that starts on a file it
// cannot read. A missing file is nothing to keep (no error).
func KeepCopy(path, dst string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return atomicfile.Write(dst, data, 0o600)
}

// FileSum is a policy file's content as a watcher compares it: its
// SHA-256, zero when it cannot be read (missing).
func FileSum(path string) [sha256.Size]byte {
	data, err := os.ReadFile(path)
	if err != nil {
		return [sha256.Size]byte{}
	}
	return sha256.Sum256(data)
}
