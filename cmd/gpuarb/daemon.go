package main

import (
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/daemon"
)

func daemonCommand() *cli.Command {
	return &cli.Command{
		Name:  "daemon",
		Usage: "run the gpuarb daemon: probes, meter and the local API",
		Description: `The daemon loads and pins the probes (maps under --pin-path, readable with
bpftool), measures GPU time per tenant (cgroup) and serves the status on a
Unix socket (mode 0660) for gpuarb status, top and the hooks. It observes
only: enforcing shares comes with the arbiter. One daemon runs per host.
SIGINT or SIGTERM stop it cleanly (pins, socket and lock removed).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Value: api.DefaultSocket, Usage: "API socket `PATH`"},
			&cli.StringFlag{Name: "pin-path", Value: bpf.DefaultPinPath, Usage: "bpffs `DIR` for the pinned maps"},
			&cli.StringSliceFlag{Name: "device", Usage: "treat char device `MAJ:MIN=KIND` as a GPU (the simulated GPU: 1:7=nvidia)"},
			&cli.StringSliceFlag{Name: "libcuda", Usage: "also probe the libcuda at `PATH`"},
			&cli.BoolFlag{Name: "no-host-devices", Usage: "do not add the GPU devices of /proc/devices"},
			&cli.DurationFlag{Name: "window", Value: defaultWindow, Usage: "metering window"},
		},
		Action: func(c *cli.Context) error {
			devices, err := deviceTable(c.StringSlice("device"), !c.Bool("no-host-devices"))
			if err != nil {
				return err
			}
			if err := requireRoot("daemon"); err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(c.App.ErrWriter, nil))
			d, err := daemon.Start(daemon.Config{
				Socket: c.String("socket"), PinPath: c.String("pin-path"), Devices: devices,
				Libcudas: c.StringSlice("libcuda"), Window: c.Duration("window"), Version: version, Log: log,
			})
			if errors.Is(err, daemon.ErrAlreadyRunning) {
				return cli.Exit("gpuarb: "+err.Error(), 3)
			}
			if err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer cancel()
			err = d.Run(ctx)
			log.Info("gpuarb daemon stopped")
			return err
		},
	}
}
