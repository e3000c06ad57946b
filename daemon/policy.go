package daemon

import (
	"path/filepath"

	"github.com/gpuarb/gpuarb/policy"
)

// LastGoodBeside is where a daemon keeps a copy of the last policy file it
// could read, for a start on a file that cannot be.
func LastGoodBeside(socket string) string {
	return filepath.Join(filepath.Dir(socket), "policy.last-good.yaml")
}

// loadPolicy reads the policy file into d.policyFile; a file that cannot
// be read leaves the daemon on the last one that could (its copy beside
// the socket), else on the defaults, with the error in d.policyErr
// (status shows it). Called before any other goroutine runs, or with d.mu
// held.
func (d *Daemon) loadPolicy() {
	pol, found, err := policy.Load(d.cfg.PolicyPath)
	if err == nil {
		d.policyFile, d.policyErr = pol, ""
		d.log.Info("policy", "path", d.cfg.PolicyPath, "found", found, "tenants", len(pol.Tenants), "period", pol.Period)
		if len(pol.Admission) == 0 {
			d.log.Info("admission: the policy has no rules, so the default bounds what workloads ask for themselves",
				"max_weight", policy.DefaultAdmission[0].MaxWeight, "latency", "refused")
		}
		d.keepLastGood()
		return
	}
	d.policyErr = err.Error()
	if d.policyFile != nil {
		d.log.Error("policy file refused: the last good policy stays", "err", err)
		return
	}
	last, _, lerr := policy.Load(LastGoodBeside(d.cfg.Socket))
	if lerr != nil || last == nil {
		last = policy.Default()
	}
	d.policyFile = last
	d.log.Error("policy file refused: running on the last good policy (the defaults where none was kept)", "err", err,
		"tenants", len(last.Tenants))
}

// keepLastGood copies the policy file, just read, beside the socket.
func (d *Daemon) keepLastGood() {
	if err := policy.KeepCopy(d.cfg.PolicyPath, LastGoodBeside(d.cfg.Socket)); err != nil {
		d.log.Warn("keeping a copy of the last good policy", "err", err)
	}
}

// watchPolicy reloads the policy file, as SIGHUP does, when its content is
// not what it was at the last look: an edit, or a Kubernetes ConfigMap
// update (its atomic swap of the mounted file). Looked at once a window;
// a file caught half-written is refused and the last good policy stays
// until the next change.
func (d *Daemon) watchPolicy() {
	sum := policy.FileSum(d.cfg.PolicyPath)
	if sum == d.policySum {
		return
	}
	d.policySum = sum
	d.log.Info("policy file changed; reloading", "path", d.cfg.PolicyPath)
	_ = d.Reload() // logged; a bad file keeps the policy in force
}
