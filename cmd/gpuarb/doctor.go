package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	ocihook "github.com/gpuarb/gpuarb/oci-hook"
)

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "report what this host supports and what gpuarb will use",
		Description: `doctor probes the kernel for real (loads and attaches trivial programs): BTF,
ring buffers, tracepoints, uprobes, kprobes, fentry, DRM scheduler and
dma_fence tracepoints, lockdown, the cgroup mode and freezers, bpffs and
tracefs, GPU devices in /proc/devices, the libcuda copies found, which
integration the container runtime takes (NRI or OCI hooks) and, when a
daemon answers on --socket, whether its NRI plugin is connected. It mounts
bpffs and tracefs when absent. It exits non-zero, naming the reason, when
gpuarb cannot run here.

With --libcuda PATH it reads that library instead (no root needed): every
CUDA driver entry point it exports, what gpuarb makes of it (launch, sync,
completion query, ...), and whether gpuarb probes it; it exits non-zero when
the library exports no launch entry point, or one gpuarb must see and does
not probe.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
			&cli.StringFlag{Name: "libcuda", Usage: "report on the libcuda at `PATH` instead of the host"},
			socketFlag(),
		},
		Action: runDoctor,
	}
}

// libcudaReport prints what gpuarb makes of a libcuda's exports.
func libcudaReport(c *cli.Context, path string) error {
	exports, err := bpf.LibcudaExports(path)
	if err != nil {
		return cli.Exit(fmt.Sprintf("gpuarb doctor: %v", err), 2)
	}
	var probed, launches int
	var unprobed []string
	for _, x := range exports {
		if x.Probed {
			probed++
		}
		if x.Class == bpf.ClassLaunch.String() {
			launches++
		}
		if x.Metered && !x.Probed {
			unprobed = append(unprobed, x.Symbol)
		}
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		if err := enc.Encode(exports); err != nil {
			return err
		}
	} else {
		w := c.App.Writer
		fmt.Fprintf(w, "%-34s %-18s %s\n", "ENTRY POINT", "CLASS", "PROBED")
		for _, x := range exports {
			mark := "-"
			if x.Probed {
				mark = "yes"
			}
			fmt.Fprintf(w, "%-34s %-18s %s\n", x.Symbol, orDash(x.Class), mark)
		}
		fmt.Fprintf(w, "%d cu* entry points exported, %d probed\n", len(exports), probed)
	}
	switch {
	case launches == 0:
		return cli.Exit(fmt.Sprintf("gpuarb doctor: %s exports no kernel launch entry point: not a libcuda", path), 2)
	case len(unprobed) > 0:
		return cli.Exit(fmt.Sprintf("gpuarb doctor: %s exports entry points gpuarb must see but does not probe: %s",
			path, strings.Join(unprobed, " ")), 2)
	}
	return nil
}

type doctorReport struct {
	Kernel   string        `json:"kernel"`
	Root     bool          `json:"root"`
	Lockdown string        `json:"lockdown"`
	Mounted  []string      `json:"mounted_now,omitempty"`
	BPFFS    bool          `json:"bpffs"`
	Tracefs  bool          `json:"tracefs"`
	Features []bpf.Feature `json:"features"`
	Cgroup   cgroup.Mode   `json:"cgroup"`
	Devices  []string      `json:"gpu_devices"`
	Libcudas []string      `json:"libcudas"`
	// Containers says how this host's container runtime hands its
	// containers to gpuarb (ocihook.DetectIntegration).
	Containers string `json:"containers"`
	// DaemonNRI is the running daemon's NRI plugin, when a daemon answers
	// on --socket.
	DaemonNRI string   `json:"daemon_nri,omitempty"`
	Blockers  []string `json:"blockers,omitempty"`
}

// daemonNRIReport says what the running daemon's NRI plugin does.
func daemonNRIReport(n *api.NRIStatus) string {
	switch {
	case n == nil:
		return "off (--nri-socket empty): pods attach through the OCI hooks"
	case n.Connected:
		return fmt.Sprintf("connected to %s %s at %s since %s, %d containers registered", n.Runtime, n.RuntimeVersion, n.Socket, n.Since.Format(time.RFC3339), n.Registered)
	default:
		return fmt.Sprintf("not connected to %s: %s", n.Socket, cmp.Or(n.LastError, "no runtime answered yet"))
	}
}

// containersReport says which integration the host's runtime takes.
func containersReport() string {
	in, err := ocihook.DetectIntegration("/")
	switch {
	case errors.Is(err, ocihook.ErrNoIntegration) && in.Runtime == "":
		return "no container runtime found (containers attach through the OCI hooks by hand: gpuarb hooks install)"
	case err != nil:
		return err.Error()
	case in.NRISocket != "":
		return fmt.Sprintf("%s serves NRI at %s: the daemon registers its pods (--nri-socket)", cmp.Or(in.Runtime, "a runtime"), in.NRISocket)
	default:
		return fmt.Sprintf("%s without NRI reads OCI hooks from %s: gpuarb hooks setup installs them there", in.Runtime, in.HooksDir)
	}
}

func runDoctor(c *cli.Context) error {
	if p := c.String("libcuda"); p != "" {
		return libcudaReport(c, p)
	}
	var rep doctorReport
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		rep.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	rep.Root = os.Geteuid() == 0
	if !rep.Root {
		rep.Blockers = append(rep.Blockers, "not root: loading eBPF programs needs root")
	} else if m, err := bpf.EnsureFilesystems(); err != nil {
		rep.Blockers = append(rep.Blockers, err.Error())
	} else {
		rep.Mounted = m
	}
	rep.Lockdown = bpf.Lockdown()
	rep.BPFFS = bpf.FilesystemMounted(bpf.BPFFSPath, unix.BPF_FS_MAGIC)
	rep.Tracefs = bpf.FilesystemMounted(bpf.TracefsPath, unix.TRACEFS_MAGIC)
	if rep.Root {
		rep.Features = bpf.ProbeFeatures()
		for _, f := range rep.Features {
			if f.Required && !f.OK {
				rep.Blockers = append(rep.Blockers, fmt.Sprintf("%s: %s", f.Name, f.Detail))
			}
		}
	}
	rep.Cgroup = cgroup.DetectMode()
	if !rep.Cgroup.Freeze && !rep.Cgroup.V1Freezer {
		rep.Blockers = append(rep.Blockers, "no cgroup freezer (neither cgroup v2 cgroup.freeze nor the v1 freezer)")
	}
	devs, err := bpf.HostDevices()
	if err != nil {
		rep.Blockers = append(rep.Blockers, err.Error())
	}
	for _, d := range devs {
		rep.Devices = append(rep.Devices, d.String())
	}
	rep.Libcudas = append(bpf.LinkerCacheLibcudas(), bpf.RunningLibcudas()...)
	rep.Containers = containersReport()
	ctx, cancel := context.WithTimeout(c.Context, time.Second)
	defer cancel()
	if st, err := api.NewClient(c.String("socket")).Status(ctx); err == nil {
		rep.DaemonNRI = daemonNRIReport(st.NRI)
	}

	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printDoctor(c, rep)
	}
	if len(rep.Blockers) > 0 {
		return cli.Exit(fmt.Sprintf("gpuarb cannot run here: %s", strings.Join(rep.Blockers, "; ")), 2)
	}
	return nil
}

func printDoctor(c *cli.Context, r doctorReport) {
	w := c.App.Writer
	mark := func(ok bool) string {
		if ok {
			return "ok "
		}
		return "no "
	}
	fmt.Fprintf(w, "kernel       %s\n", r.Kernel)
	fmt.Fprintf(w, "root         %v\n", r.Root)
	fmt.Fprintf(w, "lockdown     %s\n", orDash(r.Lockdown))
	fmt.Fprintf(w, "bpffs        %s%s\n", mark(r.BPFFS), bpf.BPFFSPath)
	fmt.Fprintf(w, "tracefs      %s%s\n", mark(r.Tracefs), bpf.TracefsPath)
	for _, m := range r.Mounted {
		fmt.Fprintf(w, "             (mounted %s now)\n", m)
	}
	for _, f := range r.Features {
		use := "optional"
		if f.Required {
			use = "required"
		}
		fmt.Fprintf(w, "%-22s %s%-8s %s\n", f.Name, mark(f.OK), use, f.Detail)
	}
	fmt.Fprintf(w, "cgroup       %s (v2 at %s), cgroup.freeze %s, v1 freezer %s\n",
		r.Cgroup.Name, orDash(r.Cgroup.UnifiedMount), mark(r.Cgroup.Freeze), mark(r.Cgroup.V1Freezer))
	fmt.Fprintf(w, "gpu devices  %s\n", orDash(strings.Join(r.Devices, " ")))
	fmt.Fprintf(w, "libcuda      %s\n", orDash(strings.Join(r.Libcudas, " ")))
	fmt.Fprintf(w, "containers   %s\n", r.Containers)
	if r.DaemonNRI != "" {
		fmt.Fprintf(w, "daemon NRI   %s\n", r.DaemonNRI)
	}
	switch {
	case len(r.Blockers) > 0:
	case len(r.Devices) == 0:
		fmt.Fprintln(w, "verdict      gpuarb can run here, but this host has no GPU device: `make demo` runs it on the simulated GPU (e2e/fakegpu)")
	default:
		fmt.Fprintln(w, "verdict      gpuarb can run here")
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
