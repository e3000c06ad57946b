package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuarb/gpuarb/lab"
)

// cgroupParent is the cgroup under which the lab makes its tenants'.
const cgroupParent = "gpuarb-lab"

// scene is one run on the simulated GPU: a private directory, the GPU, the
// daemon when arbitrating (or observing), and tenants in cgroups below one
// of the scene's own. close undoes all of it, newest first.
type scene struct {
	lab.Cleanups
	bins, dir string
	gpu       *lab.FakeGPU
	daemon    *lab.Daemon
	cgroup    *lab.Cgroup
	tenants   []lab.Tenant
}

// daemonMode says whether a scene runs the daemon, and how.
type daemonMode int

const (
	noDaemon  daemonMode = iota // the unarbitrated baseline
	observing                   // the daemon measures, never throttles
	enforcing                   // the daemon arbitrates
	gating                      // the daemon arbitrates at the launch gate alone (--gpu-scheduler off)
)

// newScene starts the simulated GPU with gpuArgs and, unless mode is
// noDaemon, the daemon.
func newScene(bins, name string, mode daemonMode, gpuArgs ...string) (_ *scene, err error) {
	s := &scene{bins: bins}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.dir, err = os.MkdirTemp("", "gpuarb-lab."); err != nil {
		return nil, fmt.Errorf("scene %s: %w", name, err)
	}
	s.Add(func() { os.RemoveAll(s.dir) })
	if s.cgroup, err = lab.NewCgroup(cgroupParent, name); err != nil {
		return nil, err
	}
	s.Add(func() {
		if err := lab.RemoveTree(s.cgroup.Path); err != nil {
			fmt.Fprintln(os.Stderr, "gpuarb-lab:", err)
		}
		_ = os.Remove(filepath.Dir(s.cgroup.Path)) // fails while another scene uses it
	})
	if s.gpu, err = lab.StartFakeGPU(bins, s.dir, gpuArgs...); err != nil {
		return nil, err
	}
	s.Add(s.gpu.Proc.Stop)
	if mode == noDaemon {
		return s, nil
	}
	var extra []string
	switch mode {
	case observing:
		extra = append(extra, "--observe-only")
	case gating:
		extra = append(extra, "--gpu-scheduler", "off")
	}
	if s.daemon, err = lab.StartDaemon(s.gpu, s.dir, extra...); err != nil {
		return nil, err
	}
	s.Add(s.daemon.Stop)
	return s, nil
}

func (s *scene) close() { s.Run() }

// tenant starts procs processes of `gpuwork args...` in a new cgroup name
// below the scene's, and samples it as name.
func (s *scene) tenant(name string, procs int, args ...string) ([]*lab.Proc, error) {
	cg, err := s.cgroup.Sub(name)
	if err != nil {
		return nil, err
	}
	s.Add(func() { _ = lab.RemoveCgroup(cg.Path) })
	s.tenants = append(s.tenants, lab.Tenant{Name: name, Cgroup: cg.Rel})
	var ps []*lab.Proc
	for i := 0; i < procs; i++ {
		p, err := lab.Start(s.gpu.Workload(args...), cg.Path)
		if err != nil {
			return nil, err
		}
		s.Add(p.Stop)
		ps = append(ps, p)
	}
	return ps, nil
}

// cgroupOf returns the cgroup (as in /proc/PID/cgroup) of a tenant.
func (s *scene) cgroupOf(name string) string {
	for _, t := range s.tenants {
		if t.Name == name {
			return t.Cgroup
		}
	}
	return ""
}

// policy applies a policy (YAML) to the daemon.
func (s *scene) policy(ctx context.Context, yaml string) error {
	if s.daemon == nil {
		return nil
	}
	if err := s.daemon.ApplyPolicy(ctx, []byte(yaml)); err != nil {
		return fmt.Errorf("apply policy: %w", err)
	}
	return nil
}

// sample waits settle, then samples every interval for d.
func (s *scene) sample(ctx context.Context, settle, interval, d time.Duration) ([]lab.Sample, error) {
	if err := sleep(ctx, settle); err != nil {
		return nil, err
	}
	sm := &lab.Sampler{GPU: s.gpu, Daemon: s.daemon, Tenants: s.tenants, Interval: interval}
	sctx, cancel := context.WithTimeout(ctx, d+interval/2)
	defer cancel()
	if err := sm.Run(sctx); err != nil {
		return nil, err
	}
	return sm.Samples(), ctx.Err()
}

// sleep waits d or until ctx ends (then its error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
