package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuarb/gpuarb/internal/atomicfile"

	"golang.org/x/sys/unix"
)

// The spool keeps the registrations a hook (OCI, libvirt) could not hand
// to the daemon (it was down or did not answer): the daemon attaches them
// when it starts
// and once a window after, so a container or VM started while it was away is
// arbitrated with its own policy once it is back. It is a directory beside
// the socket, root's alone; each registration is a file named after its
// owner, replaced by a later one of the same owner and removed by the
// owner's poststop.

// SpoolBeside is the spool directory for a daemon socket.
func SpoolBeside(socket string) string { return filepath.Join(filepath.Dir(socket), "spool") }

// Spooled is one registration in the spool: the owner (as Client.Attach
// takes it), the tenant, as the API's POST of TenantsPath takes it, and
// the name to register it under instead when its own is another's.
type Spooled struct {
	Owner    string          `json:"owner"`
	Tenant   json.RawMessage `json:"tenant"`
	Fallback string          `json:"fallback,omitempty"`
}

// MaxSpooled bounds a spooled file's size, and MaxSpool the files the
// daemon reads at once.
const (
	MaxSpooled = 64 << 10
	MaxSpool   = 4096
)

// spoolFile is where the registration of owner goes in dir.
func spoolFile(dir, owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return filepath.Join(dir, hex.EncodeToString(sum[:16])+".json")
}

// Spool writes a registration into the spool at dir (made, mode 0700, if
// missing; its parent 0755, as the daemon makes its socket's directory),
// atomically, replacing one of the same owner. The spool must be a
// directory of the caller's own.
func Spool(dir string, s Spooled) error {
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if len(data) > MaxSpooled {
		return fmt.Errorf("spool: a registration of %d bytes, at most %d", len(data), MaxSpooled)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("spool: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("spool: %s is not a directory of this user's", dir)
	}
	if err := atomicfile.Write(spoolFile(dir, s.Owner), data, 0o600); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	return nil
}

// Unreachable tells whether an error of the Client says the daemon is
// down or did not answer in time, rather than that it refused the
// request: what a hook spools.
func Unreachable(err error) bool {
	return errors.Is(err, ErrNoDaemon) || errors.Is(err, context.DeadlineExceeded)
}

// Unspool removes owner's registration from the spool at dir, if any.
func Unspool(dir, owner string) error {
	if err := os.Remove(spoolFile(dir, owner)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("spool: %w", err)
	}
	return nil
}

// DrainSpool hands each registration in the spool at dir to handle, with
// the error that kept it from being read (err != nil: s is empty), and
// removes its file: at most MaxSpool files, each read up to MaxSpooled
// bytes. A missing spool holds nothing; one that is not a directory only
// root may write is not read (an error), since whoever could write it
// could register tenants.
func DrainSpool(dir string, handle func(path string, s Spooled, err error)) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil // no spool: nothing was spooled
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
		return errors.New("not a directory only root may write")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read the spool: %w", err)
	}
	for i, e := range entries {
		if i == MaxSpool {
			break
		}
		if !strings.HasSuffix(e.Name(), ".json") || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		s, err := readSpooled(path)
		handle(path, s, err)
		_ = os.Remove(path)
	}
	return nil
}

// readSpooled reads one spooled registration, refusing a link.
func readSpooled(path string) (Spooled, error) {
	var s Spooled
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return s, err
	}
	defer f.Close()
	if err := json.NewDecoder(io.LimitReader(f, MaxSpooled)).Decode(&s); err != nil {
		return Spooled{}, fmt.Errorf("unreadable: %w", err)
	}
	return s, nil
}
