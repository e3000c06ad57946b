package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/policy"
)

// restoreAttachments reads what an earlier daemon had attached and keeps
// the tenants whose cgroup still exists. Tenants attached by pid are not
// restored: the pid may belong to another process by now.
func (d *Daemon) restoreAttachments() error {
	a, err := loadAttachments(d.cfg.Attached)
	if errors.Is(err, errBadAttachments) {
		// Never let a damaged file keep the daemon down: set it aside.
		bad := a.path + ".bad"
		d.log.Warn("ignoring the attached tenants file", "err", err, "moved_to", bad)
		err = os.Rename(a.path, bad)
	}
	if err != nil {
		return err
	}
	kept := a.tenants[:0]
	cfg := d.base
	for _, at := range a.tenants {
		t := at.Tenant
		why := ""
		switch {
		case t.PID != 0:
			why = "attached by pid"
		case t.Cgroup != "" && d.mount != "":
			if _, err := os.Stat(filepath.Join(d.mount, normalizeCgroup(t.Cgroup, d.mount))); err != nil {
				why = "its cgroup is gone"
			}
		}
		if why == "" {
			if err := d.checkGates(t); err != nil {
				why = err.Error()
			} else if _, taken := cfg.Tenant(t.Name); taken && at.Owner != "" {
				why = "the policy file has a tenant of that name"
			} else if next, err := cfg.With(t); err != nil {
				why = err.Error()
			} else {
				cfg = next
			}
		}
		if why != "" {
			d.log.Info("not restoring an attached tenant", "tenant", t.Name, "why", why)
			continue
		}
		kept = append(kept, at)
	}
	dropped := len(a.tenants) - len(kept)
	a.tenants = kept
	if dropped > 0 {
		if err := a.save(); err != nil {
			return err
		}
	}
	if len(kept) > 0 {
		d.log.Info("restored attached tenants", "tenants", len(kept), "file", a.path)
	}
	d.attached, d.policy = a, cfg
	d.unfollow(d.pinPIDs(readPIDTenants(cfg).starts))
	return nil
}

// AttachedBeside is the file of API-registered tenants for a daemon socket.
func AttachedBeside(socket string) string {
	return filepath.Join(filepath.Dir(socket), "attached.json")
}

// attachments are the tenants registered through the API (gpuarb attach,
// the OCI and libvirt hooks). They are kept apart from the policy file, so
// that a reload or `policy apply` does not drop them, and saved to a file
// (beside the socket, on /run: they last as long as the containers and
// VMs they name) so that a restarted daemon keeps them.
type attachments struct {
	path    string
	tenants []attachment // in attach order
	changed bool         // since the file was last written (set, remove)
}

// attachment is one registered tenant, as registered (rules not filled).
type attachment struct {
	policy.Tenant
	// Owner is the workload that registered it with rules of its own (a
	// container, a VM; see api.Client.Attach), "" for the operator.
	Owner string `json:"owner,omitempty"`
	// Via is the integration that registered it: viaNRI, or "" for the
	// API (the CLI, the hooks).
	Via string `json:"via,omitempty"`
}

// viaNRI marks the attachments the NRI plugin made.
const viaNRI = "nri"

// errBadAttachments marks an attached-tenants file that cannot be read.
var errBadAttachments = errors.New("unreadable attached tenants file")

// loadAttachments reads the file at path; a missing file is no tenants.
func loadAttachments(path string) (*attachments, error) {
	a := &attachments{path: path}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return a, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read attached tenants: %w", err)
	}
	if err := json.Unmarshal(data, &a.tenants); err != nil {
		a.tenants = nil
		return a, fmt.Errorf("%w: %s: %v", errBadAttachments, path, err)
	}
	return a, nil
}

// get returns the attachment of a name.
func (a *attachments) get(name string) (attachment, bool) {
	for _, at := range a.tenants {
		if at.Name == name {
			return at, true
		}
	}
	return attachment{}, false
}

// set adds at, or replaces the attachment of its name.
func (a *attachments) set(at attachment) {
	for i := range a.tenants {
		if a.tenants[i].Name == at.Name {
			a.tenants[i] = at
			a.changed = true
			return
		}
	}
	a.tenants = append(a.tenants, at)
	a.changed = true
}

// remove drops the named attachment; false when there is none.
func (a *attachments) remove(name string) bool {
	for i := range a.tenants {
		if a.tenants[i].Name == name {
			a.tenants = append(a.tenants[:i], a.tenants[i+1:]...)
			a.changed = true
			return true
		}
	}
	return false
}

// onto returns base with every attachment added, validated. The
// operator's attachments replace file entries of the same name; a
// workload's never do (it is left out, and named in shadowed).
func (a *attachments) onto(base *policy.Config) (cfg *policy.Config, shadowed []string, err error) {
	cfg = base
	for _, at := range a.tenants {
		if _, inFile := base.Tenant(at.Name); inFile && at.Owner != "" {
			shadowed = append(shadowed, at.Name)
			continue
		}
		next, err := cfg.With(at.Tenant)
		if err != nil {
			return nil, nil, fmt.Errorf("attached tenant %s: %w", at.Name, err)
		}
		cfg = next
	}
	return cfg, shadowed, nil
}

// save writes the file atomically.
func (a *attachments) save() error {
	data, err := a.encode()
	if err != nil {
		return err
	}
	return a.write(data)
}

// unsaved is the file's content if it changed since it was last written
// (nil: unchanged), for write to write without the daemon's lock.
func (a *attachments) unsaved() ([]byte, error) {
	if !a.changed {
		return nil, nil
	}
	a.changed = false
	return a.encode()
}

func (a *attachments) encode() ([]byte, error) {
	data, err := json.MarshalIndent(a.tenants, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode attached tenants: %w", err)
	}
	return append(data, '\n'), nil
}

// write replaces the file with data, atomically.
func (a *attachments) write(data []byte) error {
	tmp := a.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("save attached tenants: %w", err)
	}
	if err := os.Rename(tmp, a.path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("save attached tenants: %w", err)
	}
	return nil
}

// replaySpool makes the registrations the hooks spooled while the daemon
// was away or not answering (api.Spool): each as the API would have made
// it (attach: bounded by the admission rules, never another's name), but
// those of a cgroup that is gone (the container ended). Each file is
// removed once handled; one that does not parse is dropped with a
// warning. The spool must be root's and no one else's to write: otherwise
// nothing in it is read. Run at the start and once a window.
func (d *Daemon) replaySpool() {
	dir := api.SpoolBeside(d.cfg.Socket)
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return // no spool: nothing was spooled
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
		d.log.Error("the hooks' spool is not a directory only root may write: not read", "dir", dir)
		return
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		d.log.Warn("the hooks' spool", "err", err)
		return
	}
	for i, e := range entries {
		if i == api.MaxSpool {
			break
		}
		if !strings.HasSuffix(e.Name(), ".json") || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if err := d.replaySpooled(path); err != nil {
			d.log.Warn("a spooled registration", "file", path, "err", err)
		}
		_ = os.Remove(path)
	}
}

// replaySpooled makes one spooled registration, under its fallback name
// when its own is another's (as the hook does).
func (d *Daemon) replaySpooled(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var s api.Spooled
	if err := json.NewDecoder(io.LimitReader(f, api.MaxSpooled)).Decode(&s); err != nil {
		return fmt.Errorf("unreadable: %w", err)
	}
	var t policy.Tenant
	dec := json.NewDecoder(bytes.NewReader(s.Tenant))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return fmt.Errorf("tenant: %w", err)
	}
	if t.Cgroup != "" && d.mount != "" {
		if _, err := os.Stat(filepath.Join(d.mount, normalizeCgroup(t.Cgroup, d.mount))); err != nil {
			return nil // the container has ended meanwhile
		}
	}
	_, err = d.attach(t, s.Owner)
	if errors.Is(err, errNameTaken) && s.Fallback != "" && s.Fallback != t.Name {
		d.log.Warn("a spooled registration's name is another's: registered under its fallback", "tenant", t.Name, "as", s.Fallback)
		t.Name = s.Fallback
		_, err = d.attach(t, s.Owner)
	}
	if err != nil {
		return fmt.Errorf("attach %s for %s: %w", t.Name, s.Owner, err)
	}
	d.log.Info("attached a registration spooled while the daemon was away", "tenant", t.Name, "owner", s.Owner)
	return nil
}
