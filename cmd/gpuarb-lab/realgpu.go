package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpuarb/gpuarb/lab/realgpu"
)

func realgpuCommand() *cli.Command {
	return &cli.Command{
		Name:  "realgpu",
		Usage: "the real-GPU check: what the driver lets gpuarb steer, what the probes see, the meter against NVML",
		Description: `realgpu runs the check of docs/driver.md §4 on a host with an NVIDIA GPU,
CUDA and PyTorch, in at most 10 minutes and without network: pidfd_getfd of a
CUDA process's control file and the driver's answers through it and through a
fresh open; the effect of per-group timeslices, channel disable and preempt on
three saturating PyTorch processes it starts, and what a channel-group switch
costs (their throughput at timeslices of 4096 down to 50 µs); how long
pausing and resuming two of them takes the driver (a latency hold); the p99
of an inference-shaped probe beside them at their default timeslice and at
1024, 512 and 200 µs, against alone; what 1:3 timeslices give two equal
loops of shorter kernels, by their iterations and by NVML; which libcuda
entry points the probes see under PyTorch eager and CUDA-graph replay;
gpuarb's shares against NVML's per-process utilization; the probes' cost per
launch; the daemon arbitrating two equal loops weighted 1:3, by their
iterations and by NVML; and the daemon serving the probe as a latency tenant
beside two burners under each --latency-holds mode. It writes report.md and report.json into
--out, with the meter's recording of that last step's run without holds
(latency-with-gpuarb-off-meter.jsonl.gz, for replay-meter); --only runs chosen steps. On a host without an NVIDIA GPU it says so
and exits with status 2; it exits with 1 when a step failed.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Value: "e2e/realgpu", Usage: "write report.md and report.json into `DIR`"},
			&cli.StringFlag{Name: "python", Value: "python3", Usage: "the `PYTHON` with PyTorch that runs the CUDA workloads"},
			&cli.StringSliceFlag{Name: "only", Usage: "run only the step `NAME` (repeatable; one of: " + strings.Join(realgpu.StepNames(), ", ") + ")"},
		},
		Action: runRealGPU,
	}
}

func runRealGPU(c *cli.Context) error {
	only := c.StringSlice("only")
	for _, name := range only {
		if !slices.Contains(realgpu.StepNames(), name) {
			return cli.Exit(fmt.Sprintf("realgpu: no step %q (the steps: %s)", name, strings.Join(realgpu.StepNames(), ", ")), 2)
		}
	}
	host, err := realgpu.Detect(c.Context, c.String("python"))
	if errors.Is(err, realgpu.ErrNoGPU) {
		return cli.Exit(fmt.Sprintf("realgpu: %v: the check needs an NVIDIA GPU, its driver, CUDA and PyTorch (make demo and make bench run on the simulated GPU)", err), 2)
	}
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("realgpu needs root (eBPF, pidfd_getfd of other processes' files, cgroups)")
	}
	bins, err := binDir(c)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "gpuarb-realgpu-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	logf := func(format string, args ...any) { fmt.Fprintf(c.App.ErrWriter, format+"\n", args...) }
	r, err := realgpu.Run(c.Context, host, realgpu.Options{Bin: bins, Python: c.String("python"), Work: work, Keep: c.String("out"), Only: only, Logf: logf})
	if err != nil {
		return err
	}
	if err := r.Write(c.String("out")); err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "report in %s/report.md\n", c.String("out"))
	if n := r.Failed(); n > 0 {
		return cli.Exit(fmt.Sprintf("realgpu: %d of %d steps failed (see the report)", n, len(r.Steps)), 1)
	}
	return nil
}
