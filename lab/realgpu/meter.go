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
	names := []string{"large", "small"}
	sizes := []string{"4096", "1024"}
	cgs := make([]*lab.Cgroup, len(names))
	policy := "tenants:\n"
	for i, n := range names {
		cg, err := lab.NewCgroup("gpuarb-realgpu", n)
		if err != nil {
			return err
		}
		c.cgroups = append(c.cgroups, cg)
		cgs[i] = cg
		policy += fmt.Sprintf("  - {name: %s, cgroup: %s}\n", n, cg.Rel)
	}
	policyPath := filepath.Join(c.o.Work, "policy.yaml")
	if err := os.WriteFile(policyPath, []byte(policy), 0o644); err != nil {
		return err
	}
	c.socket = filepath.Join(c.o.Work, "gpuarb.sock")
	p, err := lab.Start(exec.Command(filepath.Join(c.o.Bin, "gpuarb"), "daemon", "--socket", c.socket, "--pin-path", pinPath,
		"--policy", policyPath, "--observe-only"), "")
	if err != nil {
		return err
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
		return fmt.Errorf("start the daemon: %w", err)
	}
	pids := make([]int, len(names))
	for i := range names {
		lp, err := lab.Start(c.python(ctx, "eager.py", "120", sizes[i]), cgs[i].Path)
		if err != nil {
			return err
		}
		defer lp.Stop()
		pids[i] = lp.Cmd.Process.Pid
	}
	shares := func() (map[string]float64, error) {
		st, err := client.Status(ctx)
		if err != nil {
			return nil, err
		}
		out := map[string]float64{}
		for _, t := range st.Tenants {
			out[t.Name] = t.Share
		}
		return out, nil
	}
	if err := waitFor(ctx, 90*time.Second, func() (bool, error) {
		sh, err := shares()
		return err == nil && sh["large"] > 0 && sh["small"] > 0, err
	}); err != nil {
		return fmt.Errorf("both loops metered: %w", err)
	}
	if err := lab.Sleep(ctx, 3*time.Second); err != nil {
		return err
	}
	pmon := exec.CommandContext(ctx, "nvidia-smi", "pmon", "-s", "u", "-d", "1", "-c", strconv.Itoa(meterWindows))
	var pmonOut strings.Builder
	pmon.Stdout = &pmonOut
	if err := pmon.Start(); err != nil {
		return fmt.Errorf("nvidia-smi pmon: %w", err)
	}
	gpuarb := map[string][]float64{}
	for i := 0; i < meterWindows; i++ {
		if err := lab.Sleep(ctx, time.Second); err != nil {
			return err
		}
		sh, err := shares()
		if err != nil {
			return err
		}
		for _, n := range names {
			gpuarb[n] = append(gpuarb[n], sh[n])
		}
	}
	if err := pmon.Wait(); err != nil {
		return fmt.Errorf("nvidia-smi pmon: %w", err)
	}
	nvml := parsePmon(pmonOut.String())
	s.Values["pmon"] = pmonOut.String()
	var parts []string
	for i, n := range names {
		ours, theirs := gpuarb[n], nvml[pids[i]]
		if len(theirs) == 0 {
			return fmt.Errorf("nvidia-smi pmon shows nothing of pid %d", pids[i])
		}
		var errs []float64
		for w := 0; w < min(len(ours), len(theirs)); w++ {
			errs = append(errs, math.Abs(ours[w]-theirs[w]))
		}
		whole := math.Abs(lab.Mean(ours) - lab.Mean(theirs))
		s.Values[n] = map[string]any{"pid": pids[i], "gpuarb": ours, "nvml_sm": theirs, "window_errors": errs, "whole_run_error": whole}
		parts = append(parts, fmt.Sprintf("%s: gpuarb %.1f%%, NVML %.1f%% over %d s (off %.1f pp; 1 s windows median off %.1f pp)",
			n, 100*lab.Mean(ours), 100*lab.Mean(theirs), meterWindows, 100*whole, 100*lab.Median(errs)))
	}
	s.Summary = strings.Join(parts, "; ")
	return nil
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
