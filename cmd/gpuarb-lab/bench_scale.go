package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/lab"
)

// benchReaction: a tenant with three times the weight of a running hog
// arrives; how soon it has its share, and the controller's trace.
func benchReaction(ctx context.Context, b *bench) (string, error) {
	var s strings.Builder
	s.WriteString("A hog (weight 100) runs alone for 3 s, then a second hog (weight 300) arrives: its target is 75%. Shares are sampled every 100 ms; it has reached its target at the first moment from which every later 500 ms window is within 5 pp of it (shorter windows swing with the hogs' 20 ms kernels).\n\n")
	s.WriteString("| run | reached its target after | its share 1–4 s after arriving |\n|---|---|---|\n")
	var trace []lab.Sample
	for _, m := range modes {
		b.logf("arrival, %s", m.name)
		ss, err := b.arrival(ctx, m.mode)
		if err != nil {
			return "", err
		}
		bs := lab.Series(ss, 0, func(s lab.Sample) float64 { return s.True["b"] })
		reached := "never (in 4 s)"
		if at := settledAt(bs, 5, 0.75, 0.05); at >= 0 {
			reached = fmt.Sprintf("%.1f s", float64(at)/10)
		}
		fmt.Fprintf(&s, "| %s | %s | %s |\n", m.name, reached, pct(lab.Mean(lab.Series(ss, time.Second, func(s lab.Sample) float64 { return s.True["b"] }))))
		if m.mode == enforcing {
			trace = ss
		}
	}
	var x, a, bb, duty, target []float64
	for _, smp := range trace {
		x = append(x, smp.At.Seconds())
		a, bb = append(a, 100*smp.True["a"]), append(bb, 100*smp.True["b"])
		duty, target = append(duty, 100*smp.Duty["a"]), append(target, 100*smp.Target["a"])
	}
	path, link := b.chart("reaction.png")
	if err := lab.LineChart(path, "A tenant of weight 300 arrives at 0 s beside a hog of weight 100 (with gpuarb)", "seconds after it arrived",
		"%", 120, []lab.Line{{Name: "first hog (true share)", X: x, Y: a, Color: 0}, {Name: "its target", X: x, Y: target, Dashed: true, Color: 0},
			{Name: "its duty (paced rate)", X: x, Y: duty, Dashed: true, Color: 2}, {Name: "arriving hog (true share)", X: x, Y: bb, Color: 1}}); err != nil {
		return "", err
	}
	fmt.Fprintf(&s, "\n![shares, target and duty after the arrival](%s)\n\n", link)
	s.WriteString("The first hog has up to 320 ms of kernels queued when the second arrives; gpuarb sets the two hogs' channel groups' timeslices in the ratio of their targets (1:3) once the arrival's group is known, which reaches the queued work too, then corrects by the measured shares.\n")
	return s.String(), nil
}

// arrival runs the arrival scenario and returns 100 ms samples from the
// arrival on.
func (b *bench) arrival(ctx context.Context, mode daemonMode) ([]lab.Sample, error) {
	sc, err := b.scene("arrival", mode)
	if err != nil {
		return nil, err
	}
	defer sc.close()
	if _, err := sc.tenant("a", 1, "hog", "--duration", "20"); err != nil {
		return nil, err
	}
	if _, err := sc.tenant("b", 0); err != nil {
		return nil, err
	}
	if err := sc.policy(ctx, fmt.Sprintf("tenants:\n  - {name: a, cgroup: %s, weight: 100}\n  - {name: b, cgroup: %s, weight: 300}\n",
		sc.cgroupOf("a"), sc.cgroupOf("b"))); err != nil {
		return nil, err
	}
	if err := sleep(ctx, 3*time.Second); err != nil {
		return nil, err
	}
	p, err := lab.Start(sc.gpu.Workload("hog", "--duration", "20"), sc.cgroup.Path+"/b")
	if err != nil {
		return nil, err
	}
	sc.Add(p.Stop)
	return sc.sample(ctx, 0, 100*time.Millisecond, 4*time.Second)
}

// settledAt returns the first index from which the mean of every later run
// of span values is within tol of want, or -1.
func settledAt(xs []float64, span int, want, tol float64) int {
	at := -1
	for i := len(xs) - span; i >= 0; i-- {
		if math.Abs(lab.Mean(xs[i:i+span])-want) > tol {
			break
		}
		at = i
	}
	return at
}

// benchScale: the daemon's cost with 10, 100 and 1000 tenants, and what
// stopping a tenant costs.
func benchScale(ctx context.Context, b *bench) (string, error) {
	var s strings.Builder
	s.WriteString("N tenants, each a cgroup with one process on the GPU: two hogs and N − 2 inference services at one request per second (mostly idle). After they have all started and 5 s more, the daemon is measured over 10 s: the mean time of one control step (measure, decide, gate: `control_ns` in its status), its CPU time per 100 ms period (every thread: probes' reader, meter, control, API), its resident memory, and the simulator's truth for the hogs.\n\n")
	s.WriteString("| tenants | control step (mean) | daemon CPU per period | daemon RSS | tenants in its status | hogs' shares |\n|---|---|---|---|---|---|\n")
	scales := []int{10, 100, 1000}
	if b.quick {
		scales = []int{10, 40}
	}
	for _, n := range scales {
		b.logf("%d tenants", n)
		row, err := b.scaleRun(ctx, n)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&s, "| %d | %s |\n", n, row)
	}
	b.logf("fork storm")
	storm, err := b.forkStorm(ctx)
	if err != nil {
		return "", err
	}
	s.WriteString("\n" + storm)
	b.logf("freeze and signal latency")
	gates, err := gateLatency(ctx, b.quick)
	if err != nil {
		return "", err
	}
	s.WriteString("\n" + gates)
	return s.String(), nil
}

func (b *bench) scaleRun(ctx context.Context, n int) (string, error) {
	sc, err := b.scene("scale", enforcing)
	if err != nil {
		return "", err
	}
	defer sc.close()
	for _, h := range []string{"hog1", "hog2"} {
		if _, err := sc.tenant(h, 1, "hog", "--duration", "600"); err != nil {
			return "", err
		}
	}
	// Idle tenants, started a few at a time.
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := 0; i < n-2; i++ {
		cg, err := sc.cgroup.Sub(fmt.Sprintf("idle%04d", i))
		if err != nil {
			return "", err
		}
		sc.Add(func() { _ = lab.RemoveCgroup(cg.Path) })
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			p, err := lab.Start(sc.gpu.Workload("infer", "--rate", "1", "--kernels", "1", "--duration", "600"), cg.Path)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = err
				return
			}
			sc.Add(p.Stop)
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return "", firstErr
	}
	// Every tenant has launched once, then 5 s more.
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := sc.daemon.Status(ctx)
		if err == nil && len(st.Tenants) >= n {
			break
		}
		if time.Now().After(deadline) {
			if err != nil {
				return "", fmt.Errorf("%d tenants started, the daemon's status after 60 s: %w", n, err)
			}
			return "", fmt.Errorf("%d tenants started, the daemon shows %d after 60 s", n, len(st.Tenants))
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return "", err
		}
	}
	if err := sleep(ctx, 5*time.Second); err != nil {
		return "", err
	}
	pid := sc.daemon.Proc.Cmd.Process.Pid
	cpu0, err := lab.CPUTime(pid)
	if err != nil {
		return "", err
	}
	ss, err := sc.sample(ctx, 0, time.Second, 10*time.Second)
	if err != nil {
		return "", err
	}
	cpu1, err := lab.CPUTime(pid)
	if err != nil {
		return "", err
	}
	st, err := sc.daemon.Status(ctx)
	if err != nil {
		return "", err
	}
	rss, err := rssBytes(pid)
	if err != nil {
		return "", err
	}
	periods := float64(len(ss)) * 10 // 1 s samples, 100 ms periods
	hogs := fmt.Sprintf("%s / %s", pct(lab.Median(lab.Series(ss, 0, func(s lab.Sample) float64 { return s.True["hog1"] }))),
		pct(lab.Median(lab.Series(ss, 0, func(s lab.Sample) float64 { return s.True["hog2"] }))))
	return fmt.Sprintf("%.2f ms | %.2f ms | %.0f MiB | %d | %s", float64(st.ControlNS)/1e6, float64(cpu1-cpu0)/periods/1e6,
		float64(rss)/(1<<20), len(st.Tenants), hogs), nil
}

// rssBytes returns a process's resident memory.
func rssBytes(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("rss of %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("rss of %d: no VmRSS", pid)
}

// forkStorm measures what following a pid tenant's every fork costs: a
// storm of forks that exit at once (lab/forkstorm), sized to about 2 s a
// round on this host, three rounds, beside a hog on the GPU: without the
// daemon, beside it (not a tenant of its), and attached as a pid tenant
// (every fork followed by the probes). The e2e test
// TestForkStormLeavesTheDaemonResponsive holds the ratios.
func (b *bench) forkStorm(ctx context.Context) (string, error) {
	sc, err := b.scene("forkstorm", noDaemon)
	if err != nil {
		return "", err
	}
	defer sc.close()
	if _, err := sc.tenant("hog", 1, "hog", "--kernel-ms", "2", "--duration", "600"); err != nil {
		return "", err
	}
	cg, err := sc.cgroup.Sub("storm")
	if err != nil {
		return "", err
	}
	sc.Add(func() { _ = lab.RemoveCgroup(cg.Path) })
	forks, err := lab.ForkStormSize(b.bins, cg.Path, 2*time.Second)
	if err != nil {
		return "", err
	}
	alone, err := lab.RunForkStorm(b.bins, cg.Path, forks, 3, 0, nil, nil)
	if err != nil {
		return "", err
	}
	if sc.daemon, err = lab.StartDaemon(sc.gpu, sc.dir); err != nil {
		return "", err
	}
	sc.Add(sc.daemon.Stop)
	if err := sleep(ctx, 2*time.Second); err != nil {
		return "", err
	}
	pid := sc.daemon.Proc.Cmd.Process.Pid
	beside, err := lab.RunForkStorm(b.bins, cg.Path, forks, 3, pid, nil, nil)
	if err != nil {
		return "", err
	}
	attach := func(storm int) error {
		return sc.policy(ctx, fmt.Sprintf("tenants:\n  - {name: storm, pid: %d, limit: 0.5}\n", storm))
	}
	followed, err := lab.RunForkStorm(b.bins, cg.Path, forks, 3, pid, attach, nil)
	if err != nil {
		return "", err
	}
	var s strings.Builder
	fmt.Fprintf(&s, "A fork storm (a tenant forking processes that exit at once, as fast as the host lets it: %d forks, three times, sized to about 2 s a round here) beside a hog on the GPU; the daemon's CPU in cores over the storm:\n\n", forks)
	s.WriteString("| storm | time | × alone | daemon CPU |\n|---|---|---|---|\n")
	fmt.Fprintf(&s, "| without the daemon | %.2f s | 1.00 | — |\n", alone.Took.Seconds())
	for _, r := range []struct {
		name string
		run  lab.StormRun
	}{{"beside the daemon, not a tenant of it", beside}, {"a pid tenant, every fork followed", followed}} {
		fmt.Fprintf(&s, "| %s | %.2f s | %.2f | %.1f%% |\n", r.name, r.run.Took.Seconds(), float64(r.run.Took)/float64(alone.Took), 100*r.run.CPU)
	}
	return s.String(), nil
}

// gateLatency measures stopping and resuming a busy process: a cgroup v2
// freeze until cgroup.events says frozen, a thaw, SIGSTOP until the
// process is stopped, SIGCONT until it runs.
func gateLatency(ctx context.Context, quick bool) (string, error) {
	n := 50
	if quick {
		n = 10
	}
	cg, err := lab.NewCgroup(cgroupParent, "gate")
	if err != nil {
		return "", err
	}
	defer lab.RemoveCgroup(cg.Path)
	p, err := lab.Start(exec.Command("sh", "-c", "while :; do :; done"), cg.Path)
	if err != nil {
		return "", err
	}
	defer p.Stop()
	mount, err := cgroup.UnifiedMount()
	if err != nil {
		return "", err
	}
	gate, err := cgroup.NewV2Gate(mount, cg.Rel)
	if err != nil {
		return "", err
	}
	pid := p.Cmd.Process.Pid
	var freeze, thaw, stop, cont []float64
	timed := func(xs *[]float64, f func() error) error {
		t := time.Now()
		err := f()
		*xs = append(*xs, float64(time.Since(t).Microseconds()))
		return err
	}
	until := func(cond func() bool) error {
		deadline := time.Now().Add(time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				return fmt.Errorf("pid %d: state not reached in 1 s", pid)
			}
		}
		return nil
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		if err := timed(&freeze, gate.Freeze); err != nil {
			return "", err
		}
		if err := timed(&thaw, gate.Thaw); err != nil {
			return "", err
		}
		if err := timed(&stop, func() error {
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				return err
			}
			return until(func() bool { return cgroup.Stopped(pid) })
		}); err != nil {
			return "", err
		}
		if err := timed(&cont, func() error {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				return err
			}
			return until(func() bool { return !cgroup.Stopped(pid) })
		}); err != nil {
			return "", err
		}
		time.Sleep(10 * time.Millisecond)
	}
	var s strings.Builder
	fmt.Fprintf(&s, "Stopping and resuming a busy process (%d times each; µs):\n\n| operation | median | p99 |\n|---|---|---|\n", n)
	for _, r := range []struct {
		name string
		xs   []float64
	}{
		{"cgroup v2 freeze, until cgroup.events reads frozen 1", freeze}, {"cgroup v2 thaw", thaw},
		{"SIGSTOP, until /proc says stopped (how the launch gate and pid tenants hold)", stop}, {"SIGCONT, until running", cont},
	} {
		fmt.Fprintf(&s, "| %s | %.0f | %.0f |\n", r.name, lab.Median(r.xs), lab.Percentile(r.xs, 99))
	}
	return s.String(), nil
}

// benchConservation collects the GPU utilisation of the scenarios above.
func benchConservation(_ context.Context, b *bench) (string, error) {
	var s strings.Builder
	s.WriteString("How busy the GPU was (median over the measured windows) in the scenarios above, without and with gpuarb; the bar is that gpuarb keeps a GPU with work busy (one tenant alone without a limit gets ≥ 95%: `TestArbiterLimitAndWorkConservation`).\n\n")
	if len(b.busy) == 0 {
		s.WriteString("(No scenario ran: run the fairness, weights, latency or frames sections with this one.)\n")
		return s.String(), nil
	}
	s.WriteString("| scenario | without gpuarb | with gpuarb |\n|---|---|---|\n")
	for _, f := range b.busy {
		fmt.Fprintf(&s, "| %s | %s | %s |\n", f.scenario, pct(f.without), pct(f.with))
	}
	s.WriteString("\nWhere the latency SLO forces it, gpuarb trades utilisation for the latency tenant (section 5, the 3 ms row); elsewhere timeslices only divide the GPU's time, they leave none of it idle, and a tenant paused for a limit or a deprived tenant leaves its time to the others.\n")
	return s.String(), nil
}
