package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/daemon"
	"github.com/gpuarb/gpuarb/enforce"
	nriplugin "github.com/gpuarb/gpuarb/nri-plugin"
	"github.com/gpuarb/gpuarb/policy"
	"github.com/gpuarb/gpuarb/tuning"
)

// ledgerPath is --ledger, or the ledger beside --socket.
func ledgerPath(c *cli.Context) string {
	if l := c.String("ledger"); l != "" {
		return l
	}
	return daemon.LedgerBeside(c.String("socket"))
}

// guardianCommand runs this executable's hidden guardian command.
// defaultGuardianCgroup is where the thaw guardian runs unless told
// otherwise: beside, not inside, the daemon's cgroup.
const defaultGuardianCgroup = "/gpuarb-guardian"

func guardianCommand(ledger, pinPath string) []string {
	exe, err := os.Executable()
	if err != nil {
		return nil
	}
	start, err := cgroup.StartTime(os.Getpid())
	if err != nil {
		return nil
	}
	return []string{exe, "guardian", "--ledger", ledger, "--pin-path", pinPath,
		"--daemon-pid", strconv.Itoa(os.Getpid()), "--daemon-start", strconv.FormatUint(start, 10)}
}

func guardianCommandDef() *cli.Command {
	return &cli.Command{
		Name:   "guardian",
		Usage:  "resume every tenant in the ledger and every process held at a launch gate when the daemon's pipe (fd 3) closes",
		Hidden: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "ledger", Required: true},
			&cli.StringFlag{Name: "pin-path", Value: bpf.DefaultPinPath},
			&cli.IntFlag{Name: "daemon-pid", Required: true},
			&cli.Uint64Flag{Name: "daemon-start", Required: true},
		},
		Action: func(c *cli.Context) error {
			_, err := enforce.Guard(os.NewFile(3, "daemon-pipe"), c.Int("daemon-pid"), c.Uint64("daemon-start"),
				c.String("ledger"), c.String("pin-path"))
			return err
		},
	}
}

func daemonCommand() *cli.Command {
	return &cli.Command{
		Name:  "daemon",
		Usage: "run the gpuarb daemon: probes, meter and the local API",
		Description: `The daemon loads and pins the probes (maps under --pin-path, readable with
bpftool), measures GPU time per tenant (cgroup) and serves the status on a
Unix socket (mode 0660; changes require root) for gpuarb status, top, attach
and the hooks. It enforces the policy (--policy, reloaded on SIGHUP and
whenever its content changes; a bad file keeps the last good policy). Where the driver lets a root daemon steer
the GPU's own scheduler (--gpu-scheduler auto), tenants get timeslices in
proportion to their targets on their channel groups, and are paused (their
queued work included) when a limit or another tenant's SLO needs it;
elsewhere their launches are paced at a launch gate (SIGSTOP before the
launch runs), or their cgroups frozen where no launch is visible.

Nothing is left stopped: a guardian process resumes every tenant (frozen,
held at a launch or paused) within milliseconds if the daemon is killed, a
restarted daemon resumes what an earlier one left, and 'gpuarb thaw --all'
does it by hand. The guardian runs in a cgroup of its own (--guardian-cgroup),
so that what kills the daemon's cgroup (systemd after a stop timeout, a
container's restart) does not kill it; the systemd unit still runs
ExecStopPost=gpuarb thaw --all. One daemon runs per host.
SIGINT or SIGTERM stop it cleanly (tenants resumed, their own timeslices
restored; pins, socket and lock removed).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Value: api.DefaultSocket, Usage: "API socket `PATH`"},
			&cli.StringFlag{Name: "pin-path", Value: bpf.DefaultPinPath, Usage: "bpffs `DIR` for the pinned maps"},
			&cli.StringSliceFlag{Name: "device", Usage: "treat char device `MAJ:MIN=KIND` as a GPU (the simulated GPU: 1:7=nvidia)"},
			&cli.StringSliceFlag{Name: "libcuda", Usage: "also probe the libcuda at `PATH`"},
			&cli.BoolFlag{Name: "no-host-devices", Usage: "do not add the GPU devices of /proc/devices"},
			&cli.DurationFlag{Name: "window", Value: defaultWindow, Usage: "metering window"},
			&cli.StringFlag{Name: "policy", Value: policy.DefaultPath, Usage: "policy `FILE` (YAML; missing: defaults)"},
			&cli.BoolFlag{Name: "watch-policy", Value: true, Usage: "reload the policy file whenever its content changes (looked at once a window: an edit, a Kubernetes ConfigMap update), besides on SIGHUP; a bad file keeps the last good policy"},
			&cli.StringFlag{Name: "ledger", Usage: "thaw ledger `FILE` (default: gated.json beside the socket)"},
			&cli.BoolFlag{Name: "observe-only", Usage: "measure, never throttle"},
			&cli.StringFlag{Name: "gpu-scheduler", Value: "auto", Usage: "steer the GPUs' own schedulers where the driver allows it (`auto`), or never (off: pace at the launch gate)"},
			&cli.StringFlag{Name: "fakegpu-socket", Usage: "steer the simulated GPU listening on `PATH` (its control node given with --device): the channel groups of a control file that is no nvidia node are steered through it; without it only the nvidia driver is steered"},
			&cli.StringFlag{Name: "latency-holds", Value: "evict", Usage: "how a latency tenant's launch takes the other tenants off a GPU whose scheduler gpuarb steers: `evict` them at once, while that starts sooner than their slices bound its wait; deschedule them at every launch (what runs of them finishes its slice: shorter waits where the driver is slow to evict, as on a real H200, at the cost of the others' GPU time); or off"},
			&cli.StringFlag{Name: "guardian-cgroup", Value: defaultGuardianCgroup, Usage: "run the thaw guardian in cgroup v2 `PATH` (made if missing), apart from the daemon's cgroup, so that what kills that cgroup (systemd after a stop timeout, a container's restart) does not kill it; empty: the daemon's cgroup"},
			&cli.UintFlag{Name: "ring-size", Usage: "the probes' ring buffer in `BYTES` (a power of two; default 4 MiB)", Hidden: true},
			&cli.StringFlag{Name: "record-meter", Usage: "record every input of the meter (events, pauses, timeslices) to `FILE`, JSON lines of about 0.3 KB an event, for a misreading to be replayed offline (gpuarb-lab replay-meter)"},
			&cli.StringFlag{Name: "nri-socket", Value: nriplugin.DefaultSocket, Usage: "register the pods of the container runtime (containerd ≥ 2.0, CRI-O ≥ 1.30) as an NRI plugin on its socket `PATH`, from their gpuarb.io/* annotations, connecting whenever the runtime is there; empty: no plugin (use the OCI hooks)"},
			&cli.StringFlag{Name: "nri-tenancy", Value: "container", Usage: "what one tenant is among the pods NRI registers: each `container`, or each pod (its cgroup, named by gpuarb.io/name, else NAMESPACE:POD)"},
			&cli.StringSliceFlag{Name: "tune", Usage: "set one of the control constants that are not policy, `NAME=DURATION` (repeatable); --tune help lists them with their defaults, bounds and why"},
			&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics on `ADDR` (e.g. :9400, which listens on 127.0.0.1 only; give a host to listen elsewhere); off when empty"},
		},
		Action: func(c *cli.Context) error {
			var tunables tuning.Tunables
			for _, spec := range c.StringSlice("tune") {
				if spec == "help" {
					fmt.Fprint(c.App.Writer, tuning.Help())
					return nil
				}
				if err := tunables.Set(spec); err != nil {
					return fmt.Errorf("--tune: %w", err)
				}
			}
			devices, err := deviceTable(c.StringSlice("device"), !c.Bool("no-host-devices"))
			if err != nil {
				return err
			}
			if err := requireRoot("daemon"); err != nil {
				return err
			}
			sched := c.String("gpu-scheduler")
			if sched != "auto" && sched != "off" {
				return fmt.Errorf("--gpu-scheduler %q: want auto or off", sched)
			}
			tenancy := c.String("nri-tenancy")
			if tenancy != "container" && tenancy != "pod" {
				return fmt.Errorf("--nri-tenancy %q: want container or pod", tenancy)
			}
			holds, err := enforce.ParseHoldMode(c.String("latency-holds"))
			if err != nil {
				return fmt.Errorf("--latency-holds: %w", err)
			}
			log := slog.New(slog.NewTextHandler(c.App.ErrWriter, nil))
			d, err := daemon.Start(daemon.Config{
				Socket: c.String("socket"), PinPath: c.String("pin-path"), Devices: devices,
				Libcudas: c.StringSlice("libcuda"), Window: c.Duration("window"), Version: version, Log: log,
				PolicyPath: c.String("policy"), Ledger: ledgerPath(c), ObserveOnly: c.Bool("observe-only"),
				NoGPUScheduler: sched == "off", FakeGPUSocket: c.String("fakegpu-socket"), LatencyHolds: holds,
				RingSize:       uint32(c.Uint("ring-size")),
				MetricsAddr:    c.String("metrics-addr"),
				RecordMeter:    c.String("record-meter"),
				Guardian:       guardianCommand(ledgerPath(c), c.String("pin-path")),
				GuardianCgroup: c.String("guardian-cgroup"),
				NRISocket:      c.String("nri-socket"),
				NRIPerPod:      tenancy == "pod",
				WatchPolicy:    c.Bool("watch-policy"),
				Tuning:         tunables,
			})
			if errors.Is(err, daemon.ErrAlreadyRunning) {
				return cli.Exit("gpuarb: "+err.Error(), 3)
			}
			if err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer cancel()
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			go func() {
				for range hup {
					_ = d.Reload() // logged; a bad file keeps the policy in force
				}
			}()
			err = d.Run(ctx)
			log.Info("gpuarb daemon stopped")
			return err
		},
	}
}
