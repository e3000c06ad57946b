package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/e2e/fakegpu"
)

// RunOptions configure RunScenario.
type RunOptions struct {
	Bins   string // gpuarb, fakegpud, gpuwork, libcuda.so.1
	Parent string // cgroup (as in /proc/PID/cgroup) under which the runs make theirs
	// GPUArgs are extra fakegpud serve flags (--realism).
	GPUArgs []string
	// DaemonArgs are extra gpuarb daemon flags.
	DaemonArgs []string
	// Log, when set, is told each step.
	Log func(format string, args ...any)
	// Samples, when set, gets every 1 s sample of the runs as they end.
	Samples func(arbitrated bool, ss []Sample)
	// Logs, when set, is a directory that keeps, per seed, the daemon's
	// log and its status at every sample (JSON lines).
	Logs string
	// RecordMeter, with Logs, also keeps per seed the daemon's meter
	// recording of the run with gpuarb (gpuarb daemon --record-meter:
	// seed-N-meter.jsonl, about 1 MB a second of a busy scenario), for
	// gpuarb-lab replay-meter.
	RecordMeter bool
	// ProbedDemand adds a run of every tenant alone beside the daemon
	// observing (--observe-only: its probes, no arbitration) and sets the
	// targets from it: what each tenant takes alone under gpuarb's probes,
	// whose cost (a uprobe hit per launch and sync) is a closed loop of
	// short kernels' own. The demand without them is kept beside it.
	ProbedDemand bool
}

func (o RunOptions) logf(format string, args ...any) {
	if o.Log != nil {
		o.Log(format, args...)
	}
}

// RunScenario runs a scenario three times on the simulated GPU — every
// tenant alone (at once, each on a GPU of its own: its demand in each
// second, phases and all), all together without gpuarb, all together with
// the daemon arbitrating — sampling the ground truth every second, and
// evaluates it.
func RunScenario(ctx context.Context, sc Scenario, o RunOptions) (ScenarioResult, error) {
	alone, err := runAlone(ctx, sc, o, false)
	if err != nil {
		return ScenarioResult{}, fmt.Errorf("scenario %d: demand alone: %w", sc.Seed, err)
	}
	o.logf("seed %d: demand alone (median of its seconds) %s", sc.Seed, formatShares(medianDemand(alone)))
	var unprobed []Sample
	if o.ProbedDemand {
		unprobed = alone
		if alone, err = runAlone(ctx, sc, o, true); err != nil {
			return ScenarioResult{}, fmt.Errorf("scenario %d: demand alone under the probes: %w", sc.Seed, err)
		}
		o.logf("seed %d: demand alone under the probes %s", sc.Seed, formatShares(medianDemand(alone)))
	}
	unarb, err := runTogether(ctx, sc, o, false)
	if err != nil {
		return ScenarioResult{}, fmt.Errorf("scenario %d: without gpuarb: %w", sc.Seed, err)
	}
	arb, err := runTogether(ctx, sc, o, true)
	if err != nil {
		return ScenarioResult{}, fmt.Errorf("scenario %d: with gpuarb: %w", sc.Seed, err)
	}
	if o.Samples != nil {
		o.Samples(false, unarb)
		o.Samples(true, arb)
	}
	return sc.Evaluate(alone, arb, unarb, unprobed), nil
}

// medianDemand is each tenant's median demand over the seconds it ran.
func medianDemand(alone []Sample) map[string]float64 {
	per := map[string][]float64{}
	for _, s := range alone {
		for name, v := range s.True {
			per[name] = append(per[name], v)
		}
	}
	out := map[string]float64{}
	for name, xs := range per {
		out[name] = Median(xs)
	}
	return out
}

func formatShares(m map[string]float64) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %.1f%%", k, 100*v))
	}
	return strings.Join(parts, ", ")
}

// stage is one run's simulated GPU, cgroups and processes; close undoes
// all of it.
type stage struct {
	Cleanups
	dir     string
	gpu     *FakeGPU
	daemon  *Daemon   // the one running
	daemons []*Daemon // every one started, in order
	cgroup  *Cgroup
}

func newStage(o RunOptions, name string, gpuArgs ...string) (_ *stage, err error) {
	st := &stage{}
	defer func() {
		if err != nil {
			st.Run()
		}
	}()
	if st.dir, err = os.MkdirTemp("", "gpuarb-fuzz."); err != nil {
		return nil, err
	}
	st.Add(func() { os.RemoveAll(st.dir) })
	if st.cgroup, err = NewCgroup(o.Parent, name); err != nil {
		return nil, err
	}
	st.Add(func() { _ = RemoveTree(st.cgroup.Path) })
	if st.gpu, err = StartFakeGPU(o.Bins, st.dir, append(gpuArgs, o.GPUArgs...)...); err != nil {
		return nil, err
	}
	st.Add(st.gpu.Proc.Stop)
	return st, nil
}

// startDaemon starts bins' daemon (with args) on the stage's simulated
// GPU under the scenario's policy; the stage stops it.
func (st *stage) startDaemon(bins string, sc Scenario, args []string) error {
	if err := os.WriteFile(filepath.Join(st.dir, "policy.yaml"), []byte(sc.Policy(st.cgroup.Rel)), 0o644); err != nil {
		return err
	}
	d, err := StartDaemon(st.gpu, st.dir, args...)
	if err != nil {
		return err
	}
	st.daemon = d
	st.daemons = append(st.daemons, d)
	st.Add(d.Stop)
	return nil
}

// start starts a tenant's processes (env adds to their environment) in
// its cgroup below the stage's; they run until the stage ends, or leave. A
// tenant whose steering the driver refuses has its processes' control
// files reopened after setup (GPUWORK_REOPEN_CTL).
func (st *stage) start(t ScenarioTenant, duration time.Duration, env ...string) ([]*Proc, error) {
	cg, err := st.cgroup.Sub(t.Name)
	if err != nil {
		return nil, err
	}
	st.Add(func() { _ = RemoveCgroup(cg.Path) })
	if t.Refused {
		env = append(env, "GPUWORK_REOPEN_CTL=1")
	}
	var ps []*Proc
	for i := range t.Procs {
		args := append([]string{"loop", "--duration", strconv.FormatFloat(duration.Seconds(), 'f', 1, 64), "--seed",
			strconv.Itoa(1000*i + 1)}, t.Args...)
		cmd := st.gpu.Workload(args...)
		cmd.Env = append(cmd.Env, env...)
		p, err := Start(cmd, cg.Path)
		if err != nil {
			return nil, err
		}
		st.Add(p.Stop)
		ps = append(ps, p)
	}
	return ps, nil
}

// runAlone runs every tenant alone on the scenario's timeline, each on
// simulated GPUs of its own (as many as the scenario has: tenant i sees
// GPUs i·n to i·n+n−1 as 0 to n−1, CUDA_VISIBLE_DEVICES), and samples
// every second each one's share of each GPU it uses (in Sample.True, by
// SlotKey): what it would take alone in that second. A tenant's phases run
// on the same clock as in the runs together, so each second's targets
// follow them. probed runs the daemon beside them, observing only.
func runAlone(ctx context.Context, sc Scenario, o RunOptions, probed bool) ([]Sample, error) {
	name := fmt.Sprintf("alone-%d", sc.Seed)
	if probed {
		name = fmt.Sprintf("probed-%d", sc.Seed)
	}
	n := sc.gpuCount()
	st, err := newStage(o, name, "--gpus", strconv.Itoa(n*len(sc.Tenants)))
	if err != nil {
		return nil, err
	}
	defer st.Run()
	if probed {
		if err := st.startDaemon(o.Bins, sc, append([]string{"--observe-only"}, o.DaemonArgs...)); err != nil {
			return nil, err
		}
	}
	if _, err := st.gpu.Stats(true); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, sc.Duration+500*time.Millisecond)
	defer cancel()
	failed := st.followAll(sctx, cancel, sc, func(i int) []string {
		visible := make([]string, n)
		for g := range visible {
			visible[g] = strconv.Itoa(i*n + g)
		}
		return []string{"CUDA_VISIBLE_DEVICES=" + strings.Join(visible, ",")}
	})
	var out []Sample
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for at := time.Second; at <= sc.Duration; at += time.Second {
		select {
		case <-sctx.Done():
			if err := failed(); err != nil {
				return nil, err
			}
			return nil, sctx.Err()
		case <-tick.C:
		}
		stats, err := st.gpu.Stats(true)
		if err != nil {
			return nil, err
		}
		s := Sample{At: at, True: map[string]float64{}}
		for i, t := range sc.Tenants {
			if t.Arrive < at && (t.Leave == 0 || t.Leave > at-time.Second) {
				for _, g := range t.GPUsOf() {
					s.True[SlotKey(t.Name, g)] = busyShare(stats, i*n+g)
				}
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// followAll runs every tenant of the scenario on its timeline from now
// (follow), tenant i with environment extra(i). A tenant that cannot
// start cancels the run; the returned function then says why.
func (st *stage) followAll(ctx context.Context, cancel func(), sc Scenario, extra func(i int) []string) (failed func() error) {
	var mu sync.Mutex
	var first error
	start := time.Now()
	for i, t := range sc.Tenants {
		go func(i int, t ScenarioTenant) {
			if err := st.follow(ctx, t, start, sc.Duration, extra(i)...); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				cancel()
			}
		}(i, t)
	}
	return func() error {
		mu.Lock()
		defer mu.Unlock()
		return first
	}
}

// follow starts a tenant at its arrival (start is the scenario's time
// zero) with env added to its processes' environment, and ends its
// processes at its departure; it returns once the tenant has left or ctx ends, with an
// error only if it could not start.
func (st *stage) follow(ctx context.Context, t ScenarioTenant, start time.Time, duration time.Duration, env ...string) error {
	if Sleep(ctx, time.Until(start.Add(t.Arrive))) != nil {
		return nil
	}
	end := duration
	if t.Leave > 0 {
		end = t.Leave
	}
	ps, err := st.start(t, time.Until(start.Add(end)), env...)
	if err != nil || t.Leave == 0 {
		return err
	}
	// It leaves then, its queued work with it: a loop's own deadline
	// would first drain a queue of seconds.
	if Sleep(ctx, time.Until(start.Add(t.Leave))) == nil {
		for _, p := range ps {
			p.Stop()
		}
	}
	return nil
}

// busyShare is GPU i's busy share of the stats' window.
func busyShare(st fakegpu.Stats, i int) float64 {
	if i >= len(st.GPUs) || st.ElapsedNS == 0 {
		return 0
	}
	return float64(st.GPUs[i].BusyNS) / float64(st.ElapsedNS)
}

// runTogether runs the scenario's tenants on its simulated GPUs, with the
// daemon arbitrating by the scenario's policy (restarted at
// Scenario.Restart) or without it, and samples every second.
func runTogether(ctx context.Context, sc Scenario, o RunOptions, arbitrate bool) ([]Sample, error) {
	name := fmt.Sprintf("free-%d", sc.Seed)
	if arbitrate {
		name = fmt.Sprintf("arb-%d", sc.Seed)
	}
	st, err := newStage(o, name, "--gpus", strconv.Itoa(sc.gpuCount()))
	if err != nil {
		return nil, err
	}
	defer st.Run()
	var tenants []Tenant
	for _, t := range sc.Tenants {
		tenants = append(tenants, Tenant{Name: t.Name, Cgroup: filepath.Join(st.cgroup.Rel, t.Name)})
	}
	var args []string
	if arbitrate {
		args = o.DaemonArgs
		if o.RecordMeter && o.Logs != "" {
			args = append(slices.Clone(args), "--record-meter", filepath.Join(o.Logs, fmt.Sprintf("seed-%d-meter.jsonl", sc.Seed)))
		}
		if err := st.startDaemon(o.Bins, sc, args); err != nil {
			return nil, err
		}
	}
	sctx, cancel := context.WithTimeout(ctx, sc.Duration+500*time.Millisecond)
	defer cancel()
	sm := &Sampler{GPU: st.gpu, Daemon: st.daemon, Tenants: tenants, Interval: time.Second}
	if arbitrate && o.Logs != "" {
		statuses, err := os.Create(filepath.Join(o.Logs, fmt.Sprintf("seed-%d-status.jsonl", sc.Seed)))
		if err != nil {
			return nil, err
		}
		defer statuses.Close()
		enc := json.NewEncoder(statuses)
		sm.Status = func(at time.Duration, status api.Status) {
			_ = enc.Encode(struct {
				At     float64    `json:"at_s"`
				Status api.Status `json:"status"`
			}{at.Seconds(), status})
		}
		st.Add(func() {
			var logs []string
			for i, d := range st.daemons {
				_, stderr := d.Proc.Output()
				if i > 0 {
					stderr = fmt.Sprintf("---- the daemon restarted at %s ----\n%s", sc.Restart, stderr)
				}
				logs = append(logs, stderr)
			}
			_ = os.WriteFile(filepath.Join(o.Logs, fmt.Sprintf("seed-%d-daemon.log", sc.Seed)), []byte(strings.Join(logs, "")), 0o644)
		})
	}
	done := make(chan error, 1)
	go func() { done <- sm.Run(sctx) }()
	restarted := make(chan error, 1)
	if arbitrate && sc.Restart > 0 {
		go func() { restarted <- st.restartDaemon(sctx, sm, sc, args) }()
	} else {
		restarted <- nil
	}
	failed := st.followAll(sctx, cancel, sc, func(int) []string { return nil })
	runErr := <-done
	if err := failed(); err != nil {
		return nil, err
	}
	if err := <-restarted; err != nil {
		return nil, err
	}
	if runErr != nil {
		return nil, runErr
	}
	if st.daemon != nil && st.daemon.Proc.Done() {
		_, stderr := st.daemon.Proc.Output()
		return nil, fmt.Errorf("the daemon exited during the run: %s", tail(stderr, 4000))
	}
	return sm.Samples(), ctx.Err()
}

// restartDaemon stops the stage's daemon at the scenario's Restart (with
// SIGINT, or SIGKILL where RestartKilled) and starts another with args in
// its place, the same directory and pins, for the sampler to read on.
func (st *stage) restartDaemon(ctx context.Context, sm *Sampler, sc Scenario, args []string) error {
	if Sleep(ctx, sc.Restart) != nil {
		return nil
	}
	old := st.daemon
	if sc.RestartKilled {
		old.Proc.Stop()
	} else {
		old.Stop()
	}
	if err := st.startDaemon(st.gpu.bins, sc, args); err != nil {
		return fmt.Errorf("restart the daemon at %s: %w", sc.Restart, err)
	}
	sm.SetDaemon(st.daemon)
	return nil
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// Sleep waits d or until ctx ends (then its error).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
