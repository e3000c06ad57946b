package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/policy"
)

type credKey struct{}

// peerCred stores the connecting process's credentials (SO_PEERCRED) in
// the request context.
func peerCred(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *unix.Ucred
	_ = raw.Control(func(fd uintptr) {
		cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cred == nil {
		return ctx
	}
	return context.WithValue(ctx, credKey{}, cred)
}

// rootOnly refuses requests from processes not running as root.
func rootOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		cred, _ := r.Context().Value(credKey{}).(*unix.Ucred)
		if cred == nil || cred.Uid != 0 {
			http.Error(w, "changes require root", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}

const maxBody = 1 << 20

func (d *Daemon) routes(mux *http.ServeMux) {
	mux.HandleFunc("GET "+api.StatusPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(d.Status()); err != nil {
			d.log.Warn("status", "err", err)
		}
	})
	mux.HandleFunc("GET "+api.PolicyPath, func(w http.ResponseWriter, _ *http.Request) {
		d.mu.Lock()
		out, err := d.policy.YAML()
		d.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(out)
	})
	mux.HandleFunc("PUT "+api.PolicyPath, rootOnly(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		cfg, err := policy.Parse(body)
		if err == nil {
			err = d.checkGates(cfg.Tenants...)
		}
		if err == nil {
			err = d.setBase(cfg, "api")
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	}))
	mux.HandleFunc("POST "+api.TenantsPath, rootOnly(func(w http.ResponseWriter, r *http.Request) {
		var t policy.Tenant
		dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&t); err != nil {
			http.Error(w, "tenant: "+err.Error(), http.StatusBadRequest)
			return
		}
		if t.Cgroup != "" {
			t.Cgroup = normalizeCgroup(t.Cgroup, d.mount)
		}
		d.mu.Lock()
		cfg, err := d.policy.With(t)
		d.mu.Unlock()
		if err == nil {
			err = d.checkGates(t)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		d.mu.Lock()
		d.attached.set(t)
		err = d.attached.save()
		d.mu.Unlock()
		if err != nil {
			d.log.Warn("attached, but a restarted daemon will not know it", "tenant", t.Name, "err", err)
		}
		d.setPolicy(cfg, "attach "+t.Name)
	}))
	mux.HandleFunc("DELETE "+api.TenantsPath+"/{name}", rootOnly(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		d.mu.Lock()
		cfg, ok := d.policy.Without(name)
		var err error
		if d.attached.remove(name) {
			err = d.attached.save()
		}
		d.mu.Unlock()
		if !ok {
			http.Error(w, fmt.Sprintf("no tenant %q in the policy", name), http.StatusNotFound)
			return
		}
		if err != nil {
			d.log.Warn("detached, but a restarted daemon would attach it again", "tenant", name, "err", err)
		}
		d.setPolicy(cfg, "detach "+name)
	}))
	mux.HandleFunc("POST "+api.ThawPath, rootOnly(func(w http.ResponseWriter, _ *http.Request) {
		d.mu.Lock()
		d.enforcing = false
		d.mu.Unlock()
		d.stopAllGates()
		if _, err := cgroup.ThawAll(d.cfg.Ledger); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		d.log.Warn("thawed everything by request; enforcement paused until a policy is applied")
	}))
}

// checkGates refuses tenants gpuarb must never stop (root and system
// cgroups, its own cgroup, PID 1, itself).
func (d *Daemon) checkGates(ts ...policy.Tenant) error {
	var errs []error
	for _, t := range ts {
		switch {
		case t.PID != 0:
			if _, err := cgroup.NewSignalGate(t.PID); err != nil {
				errs = append(errs, fmt.Errorf("tenant %s: %w", t.Name, err))
			}
		case t.Cgroup != "":
			own, _ := cgroup.ProcessPath(os.Getpid())
			if err := cgroup.CheckFreezable(normalizeCgroup(t.Cgroup, d.mount), own); err != nil {
				errs = append(errs, fmt.Errorf("tenant %s: %w", t.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// setPolicy installs a validated policy: tenants whose rules or selectors
// changed are re-gated from the next period, and enforcement resumes.
func (d *Daemon) setPolicy(cfg *policy.Config, why string) {
	d.stopAllGates() // gates are rebuilt for the new tenant set
	d.mu.Lock()
	d.policy = cfg
	d.enforcing = !d.cfg.ObserveOnly
	d.mu.Unlock()
	d.meter.SetScheduling(cfg.Scheduling)
	d.log.Info("policy changed", "by", why, "tenants", len(cfg.Tenants), "period", cfg.Period)
}

// Reload re-reads the policy file; a bad file keeps the policy in force.
func (d *Daemon) Reload() error {
	cfg, found, err := policy.Load(d.cfg.PolicyPath)
	if err == nil {
		err = d.checkGates(cfg.Tenants...)
	}
	if err == nil {
		err = d.setBase(cfg, "reload "+d.cfg.PolicyPath)
	}
	if err != nil {
		d.log.Error("reload refused; keeping the last good policy", "err", err)
		return err
	}
	if !found {
		d.log.Warn("policy file missing on reload; using defaults", "path", d.cfg.PolicyPath)
	}
	return nil
}

// setBase replaces the policy file's part of the policy; the attached
// tenants stay.
func (d *Daemon) setBase(base *policy.Config, why string) error {
	d.mu.Lock()
	cfg, err := d.attached.onto(base)
	if err == nil {
		d.base = base
	}
	d.mu.Unlock()
	if err != nil {
		return err
	}
	d.setPolicy(cfg, why)
	return nil
}
