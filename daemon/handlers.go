package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/classify"
	"github.com/gpuarb/gpuarb/gpusched"
	"github.com/gpuarb/gpuarb/policy"
	"github.com/gpuarb/gpuarb/registry"
)

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
	mux.HandleFunc("PUT "+api.PolicyPath, api.RootOnly(func(w http.ResponseWriter, r *http.Request) {
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
	mux.HandleFunc("POST "+api.TenantsPath, api.RootOnly(func(w http.ResponseWriter, r *http.Request) {
		var t policy.Tenant
		dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&t); err != nil {
			http.Error(w, "tenant: "+err.Error(), http.StatusBadRequest)
			return
		}
		owner := r.URL.Query().Get(api.OwnerParam)
		res, err := d.attach(t, owner)
		switch {
		case errors.Is(err, errNameTaken):
			http.Error(w, err.Error(), http.StatusConflict)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	}))
	mux.HandleFunc("DELETE "+api.TenantsPath+"/{name}", api.RootOnly(func(w http.ResponseWriter, r *http.Request) {
		err := d.detach(r.PathValue("name"), r.URL.Query().Get(api.OwnerParam))
		switch {
		case errors.Is(err, errNoTenant):
			http.Error(w, err.Error(), http.StatusNotFound)
		case errors.Is(err, errNameTaken):
			http.Error(w, err.Error(), http.StatusConflict)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	mux.HandleFunc("POST "+api.ThawPath, api.RootOnly(func(w http.ResponseWriter, _ *http.Request) {
		d.stepMu.Lock()
		defer d.stepMu.Unlock()
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

// attach registers tenant t for owner ("" for the operator: unbounded;
// else a workload, whose rules the admission rules bound and which may not
// take a name that is not its own), as the API's POST of TenantsPath and
// the replay of the hooks' spool do.
func (d *Daemon) attach(t policy.Tenant, owner string) (api.AttachResult, error) {
	return d.attachVia(t, owner, "")
}

// attachVia is attach, recording the integration that made it (registry.ViaNRI or
// "" for the API): reconciliation with a runtime touches its own alone.
func (d *Daemon) attachVia(t policy.Tenant, owner, via string) (api.AttachResult, error) {
	var res api.AttachResult
	if err := checkOwner(owner); err != nil {
		return res, err
	}
	if t.Cgroup != "" {
		t.Cgroup = classify.NormalizeCgroup(t.Cgroup, d.mount)
	}
	// A tenant the policy refuses is told so before its gates are checked.
	d.mu.Lock()
	admitted := t
	if owner != "" {
		d.policy.Admit(admitted.Cgroup, &admitted.Rules)
	}
	_, err := d.policy.With(admitted)
	d.mu.Unlock()
	if err != nil {
		return res, err
	}
	var start uint64 // attached now: the process its pid names now
	if t.PID != 0 {
		start = classify.PIDStart(t.PID)
	}
	err = d.updatePolicy("attach "+t.Name, owner == "", func(cur *policy.Config) (*policy.Config, error) {
		if owner != "" {
			if err := d.nameFree(t.Name, owner); err != nil {
				return nil, err
			}
			res.Adjusted = cur.Admit(t.Cgroup, &t.Rules)
		}
		cfg, err := cur.With(t)
		if err != nil {
			return nil, err
		}
		if t.PID != 0 {
			d.pidStarts[t.PID] = start
		}
		d.attached.Set(registry.Entry{Tenant: t, Owner: owner, Via: via})
		return cfg, nil
	}, t)
	for _, a := range res.Adjusted {
		d.log.Warn("admission bounded a workload's request", "tenant", t.Name, "owner", owner, "change", a)
	}
	return res, err
}

// detach removes the tenant name attached by owner ("" for the operator,
// who may remove any attached tenant but no policy file entry); an error
// wrapping errNoTenant means owner has no attached tenant of that name.
func (d *Daemon) detach(name, owner string) error {
	return d.updatePolicy("detach "+name, owner == "", func(*policy.Config) (*policy.Config, error) {
		at, ok := d.attached.Get(name)
		_, inFile := d.base.Tenant(name)
		switch {
		case !ok && inFile && owner == "":
			return nil, fmt.Errorf("%w: %q is a tenant of the policy file %s, not an attached one: remove it there and reload", errNameTaken, name, d.cfg.PolicyPath)
		case !ok:
			return nil, fmt.Errorf("%w %q is attached", errNoTenant, name)
		case owner != "" && at.Owner != owner:
			return nil, fmt.Errorf("%w %q is attached by %s", errNoTenant, name, owner)
		}
		d.attached.Remove(name)
		cfg, _, err := d.attached.Onto(d.base)
		return cfg, err
	})
}

// checkGates refuses tenants gpuarb must never stop (root and system
// cgroups, its own cgroup, PID 1, itself).
func (d *Daemon) checkGates(ts ...policy.Tenant) error {
	var errs []error
	for _, t := range ts {
		switch {
		case t.PID != 0:
			if _, err := cgroup.NewSignalGate(t.PID, nil, nil); err != nil {
				errs = append(errs, fmt.Errorf("tenant %s: %w", t.Name, err))
			}
		case t.Cgroup != "":
			own, _ := cgroup.ProcessPath(os.Getpid())
			if err := cgroup.CheckFreezable(classify.NormalizeCgroup(t.Cgroup, d.mount), own); err != nil {
				errs = append(errs, fmt.Errorf("tenant %s: %w", t.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// errNoTenant is a detach of a tenant that is not attached (by its owner).
var errNoTenant = errors.New("no tenant")

// errNameTaken is a workload's attach under a name that is not its own,
// or an operator's detach of a policy file entry.
var errNameTaken = errors.New("tenant name taken")

// nameFree refuses a workload's attach under the name of a policy file
// tenant or of a tenant another owner (or the operator) attached: a
// container must not replace, or at its exit remove, what is not its own.
// Called with d.mu held.
func (d *Daemon) nameFree(name, owner string) error {
	if _, inFile := d.base.Tenant(name); inFile {
		return fmt.Errorf("%w: %q is a tenant of the policy file %s", errNameTaken, name, d.cfg.PolicyPath)
	}
	if at, ok := d.attached.Get(name); ok && at.Owner != owner {
		by := at.Owner
		if by == "" {
			by = "the operator"
		}
		return fmt.Errorf("%w: %q is attached by %s", errNameTaken, name, by)
	}
	return nil
}

// checkOwner refuses an owner that could not be shown or logged plainly.
func checkOwner(owner string) error {
	if len(owner) > 256 || strings.IndexFunc(owner, func(r rune) bool { return r == utf8.RuneError || !unicode.IsPrint(r) }) >= 0 {
		return fmt.Errorf("owner %q: want at most 256 printable characters", owner)
	}
	return nil
}

// updatePolicy installs the policy next derives from the one in force
// (an error installs nothing): tenants whose rules or selectors changed
// are re-gated from the next period. Enforcement paused by thaw --all
// resumes when resume is set (the operator's own change: a policy applied
// or reloaded, an attach or detach), never at a workload's attach or
// detach: containers starting and stopping must not undo the operator's
// pause. Updates run one at a time and between control steps, so two
// attaches at once both count and no step acts on a policy replaced under
// it. next runs with d.mu held and must do no I/O; the gates of the
// tenants in checked (new entries) are checked before it, and the host
// facts the change needs (pid tenants' cgroups and start times) are read
// between it and the change's installation, without the lock.
func (d *Daemon) updatePolicy(why string, resume bool, next func(cur *policy.Config) (*policy.Config, error), checked ...policy.Tenant) error {
	if err := d.checkGates(checked...); err != nil {
		return err
	}
	d.stepMu.Lock()
	defer d.stepMu.Unlock()
	d.mu.Lock()
	old := d.policy
	cfg, err := next(old)
	attached, encErr := d.attached.Unsaved()
	d.mu.Unlock()
	if encErr == nil && attached != nil {
		encErr = d.attached.Write(attached)
	}
	if encErr != nil {
		d.log.Warn("the attached tenants file is not up to date: a restarted daemon will not know this change", "change", why, "err", encErr)
	}
	if err != nil {
		return err
	}
	host := classify.ReadPIDTenants(cfg)

	d.mu.Lock()
	// Only the tenants the change touches start afresh (their gates and
	// pauses end, their groups go back to their own timeslices): a
	// container that starts or stops leaves the others as they run.
	var finish []func()
	var groups []gpusched.Group
	for _, t := range d.tenants {
		if !classify.Reshaped(old, cfg, t.name, t.cgroup, d.mount, host.Cgroups) {
			continue
		}
		finish = append(finish, t.act.Release())
		if gs := t.act.Groups.Load(); gs != nil {
			groups = append(groups, *gs...)
		}
	}
	d.policy = cfg
	forgotten := d.pinPIDs(host.Starts)
	if resume {
		d.enforcing = !d.cfg.ObserveOnly
	}
	d.mu.Unlock()
	d.unfollow(forgotten)
	for _, f := range finish {
		f()
	}
	d.limitMemoryNow(cfg)
	if err := d.steer.PutBack(groups); err != nil {
		d.log.Warn("gpu scheduler: putting channel groups back", "err", err)
	}
	d.meter.SetScheduling(cfg.Scheduling)
	d.log.Info("policy changed", "by", why, "tenants", len(cfg.Tenants), "period", cfg.Period)
	return nil
}

// pinPIDs pins the pid tenants the policy gained to the processes their
// pids name now (starts, classify.ReadPIDTenants) and forgets those it lost,
// returning them for unfollow. Called with d.mu held.
func (d *Daemon) pinPIDs(starts map[int]uint64) (forgotten []int) {
	has := map[int]bool{}
	for _, t := range d.policy.Tenants {
		if t.PID == 0 {
			continue
		}
		has[t.PID] = true
		if _, ok := d.pidStarts[t.PID]; !ok {
			d.pidStarts[t.PID] = starts[t.PID]
		}
	}
	for pid := range d.pidStarts {
		if !has[pid] {
			delete(d.pidStarts, pid)
			forgotten = append(forgotten, pid)
		}
	}
	return forgotten
}

// unfollow stops following the process trees of the pid tenants the
// policy lost. Called under stepMu, without d.mu.
func (d *Daemon) unfollow(pids []int) {
	for _, pid := range pids {
		if d.trees != nil {
			d.trees.Forget(pid)
		}
		if d.probes != nil {
			if err := d.probes.Unfollow(pid); err != nil {
				d.log.Warn("unfollow pid tenant", "pid", pid, "err", err)
			}
		}
	}
}

// Reload re-reads the policy file; a bad file keeps the policy in force,
// and status shows why until a reload succeeds.
func (d *Daemon) Reload() error {
	cfg, found, err := policy.Load(d.cfg.PolicyPath)
	if err == nil {
		err = d.checkGates(cfg.Tenants...)
	}
	if err == nil {
		err = d.setBase(cfg, "reload "+d.cfg.PolicyPath)
	}
	d.mu.Lock()
	if err != nil {
		d.policyErr = err.Error()
		d.mu.Unlock()
		d.log.Error("reload refused; keeping the last good policy", "err", err)
		return err
	}
	d.policyFile, d.policyErr = cfg, ""
	d.mu.Unlock()
	d.keepLastGood()
	if !found {
		d.log.Warn("policy file missing on reload; using defaults", "path", d.cfg.PolicyPath)
	}
	return nil
}

// setBase replaces the policy file's part of the policy; the attached
// tenants stay.
func (d *Daemon) setBase(base *policy.Config, why string) error {
	return d.updatePolicy(why, true, func(*policy.Config) (*policy.Config, error) {
		cfg, shadowed, err := d.attached.Onto(base)
		if err != nil {
			return nil, err
		}
		d.base = base
		for _, name := range shadowed {
			d.log.Warn("a workload's attached tenant has the name of a policy file tenant; the file's entry applies", "tenant", name)
		}
		return cfg, nil
	})
}
