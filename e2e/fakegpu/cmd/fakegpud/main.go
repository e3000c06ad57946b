// Command fakegpud is the simulated GPU: `fakegpud serve` runs the device,
// `fakegpud stats` prints its ground truth.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/gpuarb/gpuarb/e2e/fakegpu"
)

func main() {
	socketFlag := &cli.StringFlag{Name: "socket", Value: fakegpu.DefaultSocket, EnvVars: []string{"FAKEGPU_SOCKET"}, Usage: "setup socket `PATH`"}
	app := &cli.App{
		Name:  "fakegpud",
		Usage: "a simulated kernel-bypass GPU for gpuarb's demo and tests",
		Commands: []*cli.Command{
			{
				Name:  "serve",
				Usage: "run the simulated GPUs",
				Description: `serve runs the GPUs until SIGINT or SIGTERM. Clients (libcuda.so.1) find it
through FAKEGPU_SOCKET. Beside the socket it creates the control nodes that
libcuda issues its nvidia ioctls on (nvidiactl, char 1:7) and, in nouveau
mode, its DRM ioctls on (renderD128, char 1:3): run gpuarb with
--device 1:7=nvidia --device 1:3=drm.`,
				Flags: []cli.Flag{
					socketFlag,
					&cli.IntFlag{Name: "gpus", Value: 1, Usage: "number of GPUs"},
					&cli.DurationFlag{Name: "timeslice", Value: fakegpu.DefaultTimeslice, Usage: "runlist timeslice"},
					&cli.BoolFlag{Name: "no-preempt", Usage: "run each kernel to completion (a non-preemptible GPU)"},
					&cli.DurationFlag{Name: "ctxsw", Value: fakegpu.DefaultContextSwitch, Usage: "cost of a channel-group switch"},
					&cli.Uint64Flag{Name: "copy-bandwidth", Value: 25e9, Usage: "copy engine `BYTES` per second"},
					&cli.Uint64Flag{Name: "memory", Value: 80 << 30, Usage: "device memory per GPU in `BYTES`"},
					&cli.Uint64Flag{Name: "ctx-memory", Usage: "device memory each context holds from its creation, outside any allocation (the driver's own buffers), in `BYTES`"},
					&cli.BoolFlag{Name: "realism", Usage: "turn on what real GPUs do and a meter cannot know: the defaults of the four flags below and a libcuda that sets 2048µs on every other context"},
					&cli.Float64Flag{Name: "jitter", Usage: "relative spread of kernel durations (0.1: ±10%)"},
					&cli.Float64Flag{Name: "contention", Usage: "slowdown of a kernel per other channel group with work (0.03: 3%)"},
					&cli.BoolFlag{Name: "wave-preempt", Usage: "preempt kernels only between waves of " + fmt.Sprint(fakegpu.SMs) + " blocks"},
					&cli.Float64Flag{Name: "ctxsw-spread", Usage: "vary each context switch's cost by up to this fraction (0.5: ±50%)"},
					&cli.Uint64Flag{Name: "seed", Usage: "seed of the realism's randomness (default: the clock)"},
				},
				Action: serve,
			},
			{
				Name:  "stats",
				Usage: "print the ground truth: GPU time per GPU and per context",
				Flags: []cli.Flag{
					socketFlag,
					&cli.BoolFlag{Name: "json", Usage: "print JSON"},
					&cli.BoolFlag{Name: "reset", Usage: "zero the counters after reading"},
				},
				Action: stats,
			},
		},
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "fakegpud:", err)
		os.Exit(1)
	}
}

func serve(c *cli.Context) error {
	cfg := fakegpu.Config{
		GPUs:          c.Int("gpus"),
		Timeslice:     c.Duration("timeslice"),
		NoPreempt:     c.Bool("no-preempt"),
		ContextSwitch: c.Duration("ctxsw"),
		CopyBandwidth: c.Uint64("copy-bandwidth"),
		Memory:        c.Uint64("memory"),
		ContextMemory: c.Uint64("ctx-memory"),
	}
	if c.Bool("realism") {
		cfg.Realism = fakegpu.RealisticDefaults()
	}
	for _, f := range []struct {
		name string
		dst  *float64
	}{{"jitter", &cfg.Realism.Jitter}, {"contention", &cfg.Realism.Contention}, {"ctxsw-spread", &cfg.Realism.SwitchSpread}} {
		if !c.IsSet(f.name) {
			continue
		}
		if v := c.Float64(f.name); v < 0 || v > 1 {
			return fmt.Errorf("--%s %g: want 0 to 1", f.name, v)
		}
		*f.dst = c.Float64(f.name)
	}
	if c.IsSet("wave-preempt") {
		cfg.Realism.WavePreempt = c.Bool("wave-preempt")
	}
	cfg.Realism.Seed = c.Uint64("seed")
	if cfg.GPUs < 1 || cfg.GPUs > 64 {
		return fmt.Errorf("--gpus %d: want 1-64", cfg.GPUs)
	}
	if cfg.Timeslice <= 0 {
		return fmt.Errorf("--timeslice %s: want > 0", cfg.Timeslice)
	}
	if cfg.ContextSwitch == 0 {
		cfg.ContextSwitch = -1 // an explicit zero
	}
	srv, err := fakegpu.NewServer(cfg, c.String("socket"))
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		srv.Close()
	}()
	mode := "preemptive"
	if cfg.NoPreempt {
		mode = "run-to-completion"
	}
	if r := cfg.Realism; r.On() {
		mode += fmt.Sprintf(", realism (jitter %g, contention %g, wave preemption %v, context switch ±%g, driver timeslices %v)",
			r.Jitter, r.Contention, r.WavePreempt, r.SwitchSpread, r.DriverTimeslices)
	}
	fmt.Fprintf(os.Stderr, "fakegpud: %d GPU(s), %s, timeslice %s, serving %s\n", cfg.GPUs, mode, cfg.Timeslice, srv.Socket())
	if err := srv.Serve(); err != nil {
		srv.Close()
		return err
	}
	return srv.Close()
}

func stats(c *cli.Context) error {
	st, err := fakegpu.ReadStats(c.String("socket"), c.Bool("reset"))
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return json.NewEncoder(os.Stdout).Encode(st)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	elapsed := float64(st.ElapsedNS)
	for _, g := range st.GPUs {
		fmt.Fprintf(w, "GPU %d\tbusy %.1f%%\tcopy %.1f%%\tmemory %d MiB\n", g.Index,
			100*float64(g.BusyNS)/elapsed, 100*float64(g.CopyBusyNS)/elapsed, g.MemUsed>>20)
		fmt.Fprintln(w, "  CTX\tPID\tCGROUP\tSHARE\tBUSY ms\tKERNELS\tQUEUE ms\tMEM MiB\tALIVE")
		for _, x := range g.Contexts {
			fmt.Fprintf(w, "  %d\t%d\t%s\t%.1f%%\t%.1f\t%d\t%.1f\t%d\t%v\n", x.ID, x.PID, x.Cgroup,
				100*float64(x.BusyNS)/elapsed, float64(x.BusyNS)/1e6, x.Kernels, float64(x.QueueNS)/1e6, x.MemBytes>>20, x.Alive)
		}
	}
	return w.Flush()
}
