package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/classify"
	"github.com/gpuarb/gpuarb/policy"
	"github.com/gpuarb/gpuarb/registry"
)

// restoreAttachments reads what an earlier daemon had attached and keeps
// the tenants whose cgroup still exists. Tenants attached by pid are not
// restored: the pid may belong to another process by now.
func (d *Daemon) restoreAttachments() error {
	a, err := registry.Load(d.cfg.Attached)
	if errors.Is(err, registry.ErrUnreadable) {
		// Never let a damaged file keep the daemon down: set it aside.
		bad := a.Path() + ".bad"
		d.log.Warn("ignoring the attached tenants file", "err", err, "moved_to", bad)
		err = os.Rename(a.Path(), bad)
	}
	if err != nil {
		return err
	}
	var kept []registry.Entry
	cfg := d.base
	for _, at := range a.Entries() {
		t := at.Tenant
		why := ""
		switch {
		case t.PID != 0:
			why = "attached by pid"
		case t.Cgroup != "" && d.mount != "":
			if _, err := os.Stat(filepath.Join(d.mount, classify.NormalizeCgroup(t.Cgroup, d.mount))); err != nil {
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
	if err := a.Keep(kept); err != nil {
		return err
	}
	if len(kept) > 0 {
		d.log.Info("restored attached tenants", "tenants", len(kept), "file", a.Path())
	}
	d.attached, d.policy = a, cfg
	d.unfollow(d.pinPIDs(classify.ReadPIDTenants(cfg).Starts))
	return nil
}

// AttachedBeside is the file of API-registered tenants for a daemon socket.
func AttachedBeside(socket string) string {
	return filepath.Join(filepath.Dir(socket), "attached.json")
}

// replaySpool makes the registrations the hooks spooled while the daemon
// was away or not answering (api.Spool): each as the API would have made
// it (attach: bounded by the admission rules, never another's name), but
// those of a cgroup that is gone (the container ended). Each file is
// removed once handled; one that does not parse is dropped with a
// warning (api.DrainSpool). Run at the start and once a window.
func (d *Daemon) replaySpool() {
	dir := api.SpoolBeside(d.cfg.Socket)
	err := api.DrainSpool(dir, func(path string, s api.Spooled, err error) {
		if err == nil {
			err = d.replaySpooled(s)
		}
		if err != nil {
			d.log.Warn("a spooled registration", "file", path, "err", err)
		}
	})
	if err != nil {
		d.log.Error("the hooks' spool is not read", "dir", dir, "err", err)
	}
}

// replaySpooled makes one spooled registration, under its fallback name
// when its own is another's (as the hook does).
func (d *Daemon) replaySpooled(s api.Spooled) error {
	var t policy.Tenant
	dec := json.NewDecoder(bytes.NewReader(s.Tenant))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return fmt.Errorf("tenant: %w", err)
	}
	if t.Cgroup != "" && d.mount != "" {
		if _, err := os.Stat(filepath.Join(d.mount, classify.NormalizeCgroup(t.Cgroup, d.mount))); err != nil {
			return nil // the container has ended meanwhile
		}
	}
	_, err := d.attach(t, s.Owner)
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
