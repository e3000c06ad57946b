// Command gpuarb-lab runs gpuarb on the simulated GPU for people: `demo`
// shows what gpuarb does in one command (make demo), `bench` measures it
// beside the unarbitrated baseline and writes BENCHMARKS.md with its
// charts (make bench), `fuzz` runs random scenarios against their targets,
// `replay-meter` replays a recording of the meter's inputs, and `realgpu`
// is the check on a host with a real NVIDIA GPU (make realgpu). All but
// replay-meter need root (eBPF, cgroups, runc) and stop everything they
// started on exit or Ctrl-C.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v2"
)

func main() {
	app := &cli.App{
		Name:  "gpuarb-lab",
		Usage: "gpuarb on the simulated GPU (the demo, the benchmarks, the fuzzer) and the real-GPU check",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "bin", Usage: "`DIR` with gpuarb, fakegpud, gpuwork and libcuda.so.1 (default: beside this program)"},
		},
		Commands:       []*cli.Command{demoCommand(), benchCommand(), fuzzCommand(), replayMeterCommand(), realgpuCommand()},
		ExitErrHandler: func(*cli.Context, error) {},
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := app.RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "gpuarb-lab:", err)
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}

// binDir is --bin, or the directory of this executable.
func binDir(c *cli.Context) (string, error) {
	if d := c.String("bin"); d != "" {
		return d, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the binaries: %w (give --bin)", err)
	}
	dir := filepath.Dir(exe)
	for _, name := range []string{"gpuarb", "fakegpud", "gpuwork", "libcuda.so.1"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("%s not found beside %s: run make build, or give --bin", name, exe)
		}
	}
	return dir, nil
}

// requireRoot explains why the lab needs root.
func requireRoot() error {
	if os.Geteuid() != 0 {
		return cli.Exit("gpuarb-lab: run as root (sudo): it loads eBPF programs, makes cgroups and runs runc containers", 1)
	}
	return nil
}
