package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/ioctlspy"
)

func traceCommand() *cli.Command {
	return &cli.Command{
		Name:  "trace",
		Usage: "load the probes and print every GPU event, one per line",
		Description: `trace loads gpuarb's eBPF probes on its own (no daemon needed, nothing is
pinned) and prints one decoded event per line: nvidia, nvidia-uvm and nouveau
ioctls, and libcuda calls (launches, graph launches, copies, syncs, contexts,
memory). GPU devices come from /proc/devices; --device adds others, such as the
simulated GPU's control node. libcuda copies are found in the linker cache and
by what running processes map, and as processes set up their GPUs (their
executable mappings, by inode, whatever their names); --libcuda adds one.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "one JSON object per line"},
			&cli.DurationFlag{Name: "duration", Usage: "stop after `DURATION` (30s, 5m; default: until Ctrl-C)"},
			&cli.StringSliceFlag{Name: "device", Usage: "treat char device `MAJ:MIN=KIND` as a GPU (KIND: nvidia, nvidia-ctl, nvidia-gpu, nvidia-uvm, drm; MIN may be *)"},
			&cli.StringSliceFlag{Name: "libcuda", Usage: "also probe the libcuda at `PATH`"},
			&cli.BoolFlag{Name: "no-host-devices", Usage: "do not add the GPU devices of /proc/devices"},
			&cli.UintFlag{Name: "ring-size", Value: bpf.DefaultRingSize, Usage: "ring buffer size in `BYTES` (power of two)", Hidden: true},
		},
		Action: runTrace,
	}
}

func runTrace(c *cli.Context) error {
	devices, err := deviceTable(c.StringSlice("device"), !c.Bool("no-host-devices"))
	if err != nil {
		return err
	}
	if err := requireRoot("trace"); err != nil {
		return err
	}
	if _, err := bpf.EnsureFilesystems(); err != nil {
		return err
	}
	probes, err := bpf.Load(bpf.Options{Devices: devices, RingSize: uint32(c.Uint("ring-size"))})
	if err != nil {
		return err
	}
	defer probes.Close()

	for _, p := range c.StringSlice("libcuda") {
		if _, err := probes.AttachLibcuda(p); err != nil {
			return err
		}
	}
	if err := probes.AttachHost(); err != nil {
		fmt.Fprintln(c.App.ErrWriter, "gpuarb: warning:", err)
	}

	spy, err := ioctlspy.NewSpy(probes)
	if err != nil {
		return err
	}
	defer spy.Close()
	spy.OnError = func(err error) { fmt.Fprintln(c.App.ErrWriter, "gpuarb: warning:", err) }

	ctx, cancel := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if d := c.Duration("duration"); d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}

	var resolver *cgroup.Resolver
	if root, err := cgroup.UnifiedMount(); err == nil {
		resolver = cgroup.NewResolver(root)
	}
	out := newEventPrinter(c.App.Writer, c.Bool("json"), resolver)
	fmt.Fprintf(c.App.ErrWriter, "gpuarb: tracing %d device(s), %d libcuda(s); Ctrl-C to stop\n",
		len(devices), len(probes.Libcudas()))
	var count uint64
	if err := spy.Run(ctx, func(ev ioctlspy.Event) {
		count++
		out.print(ev)
	}); err != nil {
		return err
	}
	lost, err := probes.Lost()
	if err != nil {
		return err
	}
	_, failed := spy.Counts()
	fmt.Fprintf(c.App.ErrWriter, "gpuarb: %d events, %d lost, %d undecodable\n", count, lost, failed)
	return nil
}

// deviceTable joins the host's GPU devices with the ones given on the
// command line, which win on conflict.
func deviceTable(flags []string, host bool) ([]bpf.Device, error) {
	var devs []bpf.Device
	if host {
		hd, err := bpf.HostDevices()
		if err != nil {
			return nil, err
		}
		devs = append(devs, hd...)
	}
	for _, f := range flags {
		d, err := bpf.ParseDevice(f)
		if err != nil {
			return nil, fmt.Errorf("--device: %w", err)
		}
		devs = append(devs, d)
	}
	return devs, nil
}

type eventPrinter struct {
	w        io.Writer
	json     bool
	resolver *cgroup.Resolver
	enc      *json.Encoder
	t0       uint64
}

func newEventPrinter(w io.Writer, asJSON bool, r *cgroup.Resolver) *eventPrinter {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return &eventPrinter{w: w, json: asJSON, resolver: r, enc: json.NewEncoder(w), t0: uint64(ts.Nano())}
}

func (p *eventPrinter) print(ev ioctlspy.Event) {
	h := ev.Hdr()
	if p.resolver != nil {
		h.Cgroup = p.resolver.Path(h.CgroupID)
	}
	if p.json {
		_ = p.enc.Encode(ev)
		return
	}
	rel := time.Duration(int64(h.End) - int64(p.t0))
	cg := h.Cgroup
	if cg == "" {
		cg = fmt.Sprintf("cgroup:%d", h.CgroupID)
	}
	fmt.Fprintf(p.w, "%10.6f %7d %-15s %-24s %-18s %s\n", rel.Seconds(), h.PID, shown(h.Comm), shown(cg), h.Type, shown(ev.String()))
}
