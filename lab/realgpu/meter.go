package realgpu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/lab"
)

// pinPath is where the check's daemon pins its maps.
const pinPath = "/sys/fs/bpf/gpuarb-realgpu"

// meterWindows is how many 1 s windows the meter step compares.
const meterWindows = 10

// meter runs the daemon (observe-only) with two PyTorch loops of different
// sizes in two cgroups and compares its shares with NVML's per-process SM
// utilization (nvidia-smi pmon) over 1 s windows and over the whole run.
func (c *check) meter(ctx context.Context, s *Step) error {
	names, sizes := []string{"large", "small"}, []string{"4096", "1024"}
	run, err := c.runLoops(ctx, names, sizes, []int{100, 100}, "--observe-only")
	if err != nil {
		return err
	}
	s.Values["pmon"] = run.pmon
	var parts []string
	for i, n := range names {
		ours, theirs := run.gpuarb[n], run.nvml[i]
		var errs []float64
		for w := 0; w < min(len(ours), len(theirs)); w++ {
			errs = append(errs, math.Abs(ours[w]-theirs[w]))
		}
		whole := math.Abs(lab.Mean(ours) - lab.Mean(theirs))
		s.Values[n] = map[string]any{"pid": run.pids[i], "gpuarb": ours, "nvml_sm": theirs, "window_errors": errs, "whole_run_error": whole}
		parts = append(parts, fmt.Sprintf("%s: gpuarb %.1f%%, NVML %.1f%% over %d s (off %.1f pp; 1 s windows median off %.1f pp)",
			n, 100*lab.Mean(ours), 100*lab.Mean(theirs), meterWindows, 100*whole, 100*lab.Median(errs)))
	}
	s.Summary = strings.Join(parts, "; ")
	return nil
}

// arbitrationWeights are the arbitration step's two tenants' weights: a
// target of 25% and 75%, the 1:3 bar.
var arbitrationWeights = []int{100, 300}

// arbitrationTolerance is how far from its target a tenant's part of the
// two loops' iterations may be before the arbitration step fails: the
// simulated GPU's bar is 2 pp; the real GPU's switches and preemptions
// are the simulator's only as far as the check's figures go.
const arbitrationTolerance = 0.05

// arbitration runs the daemon arbitrating (the GPU's own scheduler
// steered) between two equal PyTorch loops weighted 1:3 in two cgroups,
// and compares their parts of the two's iterations over meterWindows
// seconds (their GPU time's, the loops being equal) with the targets,
// beside NVML's shares and gpuarb's, and each second's decisions.
func (c *check) arbitration(ctx context.Context, s *Step) error {
	defer func() {
		if c.daemon != nil {
			_, stderr := c.daemon.Output()
			s.Values["daemon_log"] = lastLines(stderr, 40)
		}
		c.stopDaemon()
	}()
	names := []string{"light", "heavy"}
	run, err := c.runLoops(ctx, names, []string{"4096", "4096"}, arbitrationWeights)
	if err != nil {
		return err
	}
	s.Values["pmon"], s.Values["status"] = run.pmon, run.status
	light, heavy := lab.Mean(run.nvml[0]), lab.Mean(run.nvml[1])
	nvmlShare := heavy / max(light+heavy, 1e-9)
	// The loops are equal: the heavy one's part of their iterations is its
	// part of their GPU time.
	share := run.rates[1] / max(run.rates[0]+run.rates[1], 1e-9)
	target := float64(arbitrationWeights[1]) / float64(arbitrationWeights[0]+arbitrationWeights[1])
	s.Values["rates"], s.Values["heavy_share"] = run.rates, share
	s.Values["nvml_light"], s.Values["nvml_heavy"], s.Values["nvml_heavy_share"] = light, heavy, nvmlShare
	s.Values["gpuarb_light"], s.Values["gpuarb_heavy"] = lab.Mean(run.gpuarb["light"]), lab.Mean(run.gpuarb["heavy"])
	last := run.status[len(run.status)-1]
	s.Summary = fmt.Sprintf("weights 1:3 between two equal 4096² matrix-multiply loops over %d s: iterations/s %.1f / %.1f, the heavy one %.1f%% of their GPU time for a target of %.0f%%; NVML SM %.1f%% / %.1f%% (heavy %.1f%% of their sum); gpuarb read %.1f%% / %.1f%%; last step: %s",
		meterWindows, run.rates[0], run.rates[1], 100*share, 100*target, 100*light, 100*heavy, 100*nvmlShare,
		100*lab.Mean(run.gpuarb["light"]), 100*lab.Mean(run.gpuarb["heavy"]), last)
	if math.Abs(share-target) > arbitrationTolerance {
		return fmt.Errorf("the heavy tenant took %.1f%% of the two's GPU time (by their iterations) for a target of %.0f%%", 100*share, 100*target)
	}
	return nil
}

// loopRun is what runLoops measured: per tenant (in the order named) its
// pid and NVML SM utilization per 1 s sample, by name gpuarb's shares per
// second, and each second's decisions as status printed them.
type loopRun struct {
	pids []int
	// rates are the loops' iterations per second over the sampled
	// seconds: with equal sizes, their ratio is their GPU time's.
	rates  []float64
	nvml   [][]float64
	gpuarb map[string][]float64
	status []string
	pmon   string
}

// runLoops starts the daemon (with extra flags) over one tenant per name,
// each a cgroup with its weight and a PyTorch loop of matrix multiplies of
// its size, waits until both are metered and 3 s more, then samples NVML
// and gpuarb's status for meterWindows seconds. The loops stop before it
// returns; the daemon runs on until stopDaemon (the cost step times
// launches under it).
func (c *check) runLoops(ctx context.Context, names, sizes []string, weights []int, extra ...string) (*loopRun, error) {
	cgs, err := c.tenantCgroups(names...)
	if err != nil {
		return nil, err
	}
	policy := "tenants:\n"
	for i, n := range names {
		policy += fmt.Sprintf("  - {name: %s, cgroup: %s, weight: %d}\n", n, cgs[i].Rel, weights[i])
	}
	client, err := c.startDaemon(ctx, policy, extra...)
	if err != nil {
		return nil, err
	}
	run := &loopRun{gpuarb: map[string][]float64{}}
	var loops []*lab.Proc
	for i := range names {
		lp, err := lab.Start(c.python(ctx, "eager.py", "120", sizes[i]), cgs[i].Path)
		if err != nil {
			return nil, err
		}
		defer lp.Stop()
		loops = append(loops, lp)
		run.pids = append(run.pids, lp.Cmd.Process.Pid)
	}
	if err := waitFor(ctx, 90*time.Second, func() (bool, error) {
		st, err := tenantsByName(ctx, client)
		return err == nil && st[names[0]].Share > 0 && st[names[1]].Share > 0, err
	}); err != nil {
		return nil, fmt.Errorf("both loops metered: %w", err)
	}
	if err := lab.Sleep(ctx, 3*time.Second); err != nil {
		return nil, err
	}
	pm, err := startPmon(ctx, meterWindows)
	if err != nil {
		return nil, err
	}
	from := monotonic()
	for i := 0; i < meterWindows; i++ {
		if err := lab.Sleep(ctx, time.Second); err != nil {
			return nil, err
		}
		st, err := tenantsByName(ctx, client)
		if err != nil {
			return nil, err
		}
		var line []string
		for _, n := range names {
			t := st[n]
			run.gpuarb[n] = append(run.gpuarb[n], t.Share)
			line = append(line, fmt.Sprintf("%s %.1f%% target %.1f%% %s %dµs duty %.2f (%s)",
				n, 100*t.Share, 100*t.TargetShare, t.Actuator, t.TimesliceUS, t.Duty, t.Reason))
		}
		run.status = append(run.status, strings.Join(line, "; "))
	}
	to := monotonic()
	for _, lp := range loops {
		run.rates = append(run.rates, rateOf(progressLines(lp), from, to))
	}
	nvml, text, err := pm.wait()
	if err != nil {
		return nil, err
	}
	run.pmon = text
	for _, pid := range run.pids {
		if len(nvml[pid]) == 0 {
			return nil, fmt.Errorf("nvidia-smi pmon shows nothing of pid %d", pid)
		}
		run.nvml = append(run.nvml, nvml[pid])
	}
	return run, nil
}

// pmonRun is a running nvidia-smi pmon -s u of one sample a second.
type pmonRun struct {
	cmd *exec.Cmd
	out strings.Builder
}

// startPmon starts sampling NVML's per-process utilization once a second
// for n seconds.
func startPmon(ctx context.Context, n int) (*pmonRun, error) {
	pm := &pmonRun{cmd: exec.CommandContext(ctx, "nvidia-smi", "pmon", "-s", "u", "-d", "1", "-c", strconv.Itoa(n))}
	pm.cmd.Stdout = &pm.out
	if err := pm.cmd.Start(); err != nil {
		return nil, fmt.Errorf("nvidia-smi pmon: %w", err)
	}
	return pm, nil
}

// wait returns the samples per pid (parsePmon) and the text.
func (pm *pmonRun) wait() (map[int][]float64, string, error) {
	if err := pm.cmd.Wait(); err != nil {
		return nil, "", fmt.Errorf("nvidia-smi pmon: %w", err)
	}
	return parsePmon(pm.out.String()), pm.out.String(), nil
}

// parsePmon reads nvidia-smi pmon -s u: per pid, its SM utilization
// (0..1) per sample, in order ("-" is 0).
func parsePmon(out string) map[int][]float64 {
	m := map[int][]float64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || strings.HasPrefix(f[0], "#") {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		sm, _ := strconv.ParseFloat(f[3], 64)
		m[pid] = append(m[pid], sm/100)
	}
	return m
}

// tenantCgroups makes one cgroup per name under the check's parent,
// removed at its end.
func (c *check) tenantCgroups(names ...string) ([]*lab.Cgroup, error) {
	var cgs []*lab.Cgroup
	for _, n := range names {
		cg, err := lab.NewCgroup("gpuarb-realgpu", n)
		if err != nil {
			return nil, err
		}
		c.cgroups = append(c.cgroups, cg)
		cgs = append(cgs, cg)
	}
	return cgs, nil
}

// startDaemon starts the daemon (with extra flags) under policy, an
// earlier step's stopped first, and returns a client once it answers.
func (c *check) startDaemon(ctx context.Context, policy string, extra ...string) (*api.Client, error) {
	c.stopDaemon()
	policyPath := filepath.Join(c.o.Work, "policy.yaml")
	if err := os.WriteFile(policyPath, []byte(policy), 0o644); err != nil {
		return nil, err
	}
	c.socket = filepath.Join(c.o.Work, "gpuarb.sock")
	args := append([]string{"daemon", "--socket", c.socket, "--pin-path", pinPath, "--policy", policyPath}, extra...)
	p, err := lab.Start(exec.Command(filepath.Join(c.o.Bin, "gpuarb"), args...), "")
	if err != nil {
		return nil, err
	}
	c.daemon = p
	client := api.NewClient(c.socket)
	if err := waitFor(ctx, 30*time.Second, func() (bool, error) {
		if p.Done() {
			_, stderr := p.Output()
			return false, fmt.Errorf("the daemon exited: %s", lastLine(stderr))
		}
		_, err := client.Status(ctx)
		return err == nil, nil
	}); err != nil {
		return nil, fmt.Errorf("start the daemon: %w", err)
	}
	return client, nil
}

func waitFor(ctx context.Context, limit time.Duration, done func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	var last error
	for {
		ok, err := done()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("not within %v", limit), last)
		}
		if err := lab.Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}
