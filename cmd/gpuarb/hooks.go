package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuarb/gpuarb/api"
	libvirthook "github.com/gpuarb/gpuarb/libvirt-hook"
	ocihook "github.com/gpuarb/gpuarb/oci-hook"
)

func ociHookCommand() *cli.Command {
	return &cli.Command{
		Name:      "oci-hook",
		Usage:     "OCI runtime hook: register a container with the daemon (run by the runtime)",
		ArgsUsage: "createRuntime|prestart|poststart|poststop",
		Description: `Called by the container runtime with the container's state on stdin.
createRuntime, prestart and poststart register the container's cgroup as a
tenant (named by the gpuarb.io/name annotation or the container id) with the
policy from its annotations:

  gpuarb.io/weight=300  gpuarb.io/limit=30%  gpuarb.io/priority=latency
  gpuarb.io/slo-p99-ms=20  gpuarb.io/slo-fps=60

The policy file's admission rules bound what annotations may ask for (a
weight over the cap is lowered, latency dropped unless allowed), and a
name that belongs to the policy file or to another tenant is refused: the
container is then registered under its id. Each change is printed as a
warning. poststop unregisters it. The hook returns within 1 s. If the daemon is down
or slow the container starts anyway and a warning is printed, unless
--fail-closed. Invalid annotations fail the hook unless
--default-on-bad-policy. Install it with 'gpuarb hooks install'.`,
		Flags: []cli.Flag{
			socketFlag(),
			&cli.DurationFlag{Name: "timeout", Value: 800 * time.Millisecond, Usage: "bound on the exchange with the daemon"},
			&cli.BoolFlag{Name: "fail-closed", Usage: "refuse the container when the daemon cannot register it"},
			&cli.BoolFlag{Name: "default-on-bad-policy", Usage: "register containers with invalid gpuarb.io annotations with the default policy"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("gpuarb oci-hook: give the stage: createRuntime, prestart, poststart or poststop", 2)
			}
			stage, err := ocihook.ParseStage(c.Args().First())
			if err != nil {
				return cli.Exit("gpuarb oci-hook: "+err.Error(), 2)
			}
			act, err := ocihook.Run(c.Context, stage, os.Stdin, ocihook.Options{
				Socket: c.String("socket"), Timeout: c.Duration("timeout"),
				FailClosed: c.Bool("fail-closed"), DefaultOnBadPolicy: c.Bool("default-on-bad-policy"),
			})
			for _, w := range act.Warnings {
				fmt.Fprintf(c.App.ErrWriter, "gpuarb oci-hook %s %s: warning: %s\n", stage, act.Tenant.Name, w)
			}
			if err != nil {
				return cli.Exit(fmt.Sprintf("gpuarb oci-hook %s: %v", stage, err), 1)
			}
			return nil
		},
	}
}

func libvirtHookCommand() *cli.Command {
	return &cli.Command{
		Name:      "libvirt-hook",
		Usage:     "libvirt qemu hook: register a VM with the daemon (run by libvirtd)",
		ArgsUsage: "DOMAIN OPERATION [SUB-OPERATION EXTRA]",
		Description: `Called by libvirtd with the domain XML on stdin. On started, reconnect and
attach it finds the domain's QEMU process (libvirt's pid file, else the
process whose command line carries the domain's -uuid), and registers the
VM's cgroup (the machine.slice scope, or its cgroupfs equivalent) as a
tenant named vm-DOMAIN, with the policy in the domain's metadata:

  <metadata>
    <gpuarb:policy xmlns:gpuarb="https://gpuarb.io/libvirt/1"
                   weight="300" limit="30%" priority="normal"/>
  </metadata>

(attributes: name, weight, limit, priority, slo-p99-ms, slo-fps), bounded
by the policy file's admission rules as a container's annotations are. On
stopped and release it removes the tenant; other operations do nothing.
A daemon that is down or slow only yields a warning (the VM runs
unarbitrated). Install it with 'gpuarb hooks install --runtime libvirt'.`,
		Flags: []cli.Flag{
			socketFlag(),
			&cli.DurationFlag{Name: "timeout", Value: 800 * time.Millisecond, Usage: "bound on the exchange with the daemon"},
			&cli.BoolFlag{Name: "default-on-bad-policy", Usage: "register domains with an invalid <gpuarb:policy> with the default policy"},
			&cli.StringFlag{Name: "pid-dir", Value: "/run/libvirt/qemu", Usage: "where libvirt writes DOMAIN.pid"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() < 2 {
				return cli.Exit("gpuarb libvirt-hook: want DOMAIN OPERATION (libvirtd passes them)", 2)
			}
			domain, op := c.Args().Get(0), libvirthook.Operation(c.Args().Get(1))
			act, err := libvirthook.Run(c.Context, domain, op, os.Stdin, libvirthook.Options{
				Socket: c.String("socket"), Timeout: c.Duration("timeout"),
				DefaultOnBadPolicy: c.Bool("default-on-bad-policy"), PIDDir: c.String("pid-dir"),
			})
			for _, w := range act.Warnings {
				fmt.Fprintf(c.App.ErrWriter, "gpuarb libvirt-hook %s %s: warning: %s\n", domain, op, w)
			}
			if err != nil {
				return cli.Exit(fmt.Sprintf("gpuarb libvirt-hook %s %s: %v", domain, op, err), 1)
			}
			return nil
		},
	}
}

// DefaultHooksDir is where CRI-O and podman read OCI hook configs.
const DefaultHooksDir = "/etc/containers/oci/hooks.d"

func hooksCommand() *cli.Command {
	common := []cli.Flag{
		&cli.StringFlag{Name: "runtime", Required: true, Usage: "the container runtime: " + hookRuntimes},
		&cli.StringFlag{Name: "dir", Usage: "crio, podman: the OCI hooks.d directory (default " + DefaultHooksDir + "); libvirt: the qemu hooks directory (default " + libvirthook.DefaultHooksDir + ")"},
		&cli.StringFlag{Name: "base", Usage: "containerd: the base runtime spec to edit in place (else the hooks are printed)"},
		&cli.StringFlag{Name: "bundle", Usage: "runc, crun: the bundle whose config.json to edit (else the hooks are printed)"},
	}
	return &cli.Command{
		Name:  "hooks",
		Usage: "install or remove the OCI hook in a container runtime's configuration",
		Subcommands: []*cli.Command{
			{
				Name:  "install",
				Usage: "make the runtime call 'gpuarb oci-hook' for its containers",
				Description: `crio, podman: writes gpuarb-register.json and gpuarb-unregister.json into
the hooks.d directory (--dir), read by both at container start.
containerd 1.6 and 1.7 without NRI (containerd 2.x: the daemon registers
pods through NRI, install nothing): adds the hooks to the base runtime spec
given by --base, which must be a full spec (` + "`ctr oci spec`" + `), drops its
process.rlimits (containerd would give them to every pod), and prints the
config.toml lines left to add (base_runtime_spec and pod_annotations, per
runtime handler) and the restart; without --base prints the hooks to merge.
runc, crun: adds the hooks to a bundle's config.json (--bundle); without
--bundle prints the "hooks" member to merge.
libvirt: writes an executable 'gpuarb' into /etc/libvirt/hooks/qemu.d
(--dir) that runs 'gpuarb libvirt-hook'; restart libvirtd once after the
first install. See docs/deploy.md.`,
				Flags: append(common,
					&cli.StringFlag{Name: "binary", Usage: "path of the gpuarb binary the runtime runs (default: this one)"},
					socketFlag(),
					&cli.BoolFlag{Name: "fail-closed", Usage: "refuse containers the daemon cannot register"},
					&cli.BoolFlag{Name: "default-on-bad-policy", Usage: "register containers with invalid annotations with the default policy"},
					&cli.BoolFlag{Name: "annotated-only", Usage: "crio, podman: call the hook only for containers with gpuarb.io/* annotations"},
				),
				Action: hooksInstall,
			},
			{
				Name:  "setup",
				Usage: "pick the integration the node's container runtime takes and install it (the DaemonSet's init container runs this)",
				Description: `Looks at the host whose root is mounted at --host:
- an NRI socket (/var/run/nri/nri.sock: containerd 2.x, CRI-O 1.30 and
  later, or older ones with NRI enabled): the daemon registers the pods
  itself as an NRI plugin; no hook is installed, and gpuarb hooks files an
  earlier install left in CRI-O's and podman's hooks directories are
  removed (the plugin registers those containers already);
- CRI-O without NRI: the OCI hook files are written into the first
  directory of CRI-O's hooks_dir (/etc/crio/crio.conf and crio.conf.d), or
  its default ` + ocihook.CRIOHooksDir + `;
- containerd without NRI, or no runtime: fails, saying what to do (the
  hook on containerd 1.x needs a base runtime spec and a restart: see
  docs/deploy.md).`,
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "host", Value: "/", Usage: "where the host's root is mounted (`DIR`)"},
					&cli.StringFlag{Name: "binary", Usage: "path of the gpuarb binary on the host, for the hooks (default: this one)"},
					socketFlag(),
				},
				Action: hooksSetup,
			},
			{
				Name:   "uninstall",
				Usage:  "remove what 'hooks install' added",
				Flags:  common,
				Action: hooksUninstall,
			},
		},
	}
}

// containerdSteps is what is left to do by hand after the hook went into
// a base runtime spec (%q: its path).
const containerdSteps = `containerd ≥ 2.0 (and 1.7 with NRI enabled) needs none of this: the daemon registers pods through NRI.
On containerd 1.6 and 1.7, for every runtime handler pods use (runc, and nvidia where the GPU operator added it),
in /etc/containerd/config.toml (in the handler's table itself: containerd ignores these under .options):
  version = 2 (containerd 1.x):
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      base_runtime_spec = %q
      pod_annotations = ["gpuarb.io/*"]
then restart containerd; running containers keep the spec they started with.
`

// hookRuntimes are the runtimes 'gpuarb hooks' configures.
const hookRuntimes = "crio, podman, containerd, runc, crun or libvirt"

// hooksDir is --dir, or the runtime's default hooks directory.
func hooksDir(c *cli.Context, runtime string) string {
	if d := c.String("dir"); d != "" {
		return d
	}
	if runtime == "libvirt" {
		return libvirthook.DefaultHooksDir
	}
	return DefaultHooksDir
}

// specFile is the runtime spec that 'hooks install|uninstall' edits for
// containerd (--base) or runc and crun (--bundle's config.json); "" when
// none was given.
func specFile(c *cli.Context, runtime string) string {
	if runtime == "containerd" {
		return c.String("base")
	}
	if b := c.String("bundle"); b != "" {
		return filepath.Join(b, "config.json")
	}
	return ""
}

func hookCommandFrom(c *cli.Context) (ocihook.HookCommand, error) {
	bin := c.String("binary")
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return ocihook.HookCommand{}, fmt.Errorf("find this binary: %w (give --binary)", err)
		}
		bin = exe
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return ocihook.HookCommand{}, err
	}
	socket := c.String("socket")
	if socket == api.DefaultSocket {
		socket = ""
	}
	return ocihook.HookCommand{Binary: abs, Socket: socket, FailClosed: c.Bool("fail-closed"),
		DefaultOnBadPolicy: c.Bool("default-on-bad-policy")}, nil
}

func hooksInstall(c *cli.Context) error {
	h, err := hookCommandFrom(c)
	if err != nil {
		return cli.Exit("gpuarb hooks install: "+err.Error(), 1)
	}
	w := c.App.Writer
	switch rt := strings.ToLower(c.String("runtime")); rt {
	case "crio", "cri-o", "podman":
		files, err := h.InstallHooksD(hooksDir(c, rt), c.Bool("annotated-only"))
		if err != nil {
			return cli.Exit("gpuarb hooks install: "+err.Error(), 1)
		}
		for _, f := range files {
			fmt.Fprintf(w, "wrote %s\n", f)
		}
		fmt.Fprintf(w, "%s reads %s for every new container; nothing to restart\n", rt, hooksDir(c, rt))
	case "libvirt":
		path, err := libvirthook.InstallScript(hooksDir(c, rt), h.Binary, h.Socket)
		if err != nil {
			return cli.Exit("gpuarb hooks install: "+err.Error(), 1)
		}
		fmt.Fprintf(w, "wrote %s\nlibvirtd reads its hooks when it starts: restart it once (systemctl restart libvirtd)\n", path)
	case "containerd", "runc", "crun":
		target := specFile(c, rt)
		if target == "" {
			hooks := map[string]any{"prestart": []any{h.Hook(ocihook.RegisterStage)}, "poststop": []any{h.Hook(ocihook.Poststop)}}
			b, _ := json.MarshalIndent(map[string]any{"hooks": hooks}, "", "  ")
			fmt.Fprintf(w, "%s\n", b)
			return nil
		}
		edit, dropped := h.AddToSpec, ""
		if rt == "containerd" {
			edit = func(doc []byte) (out []byte, err error) {
				out, dropped, err = h.AddToBaseSpec(doc)
				return out, err
			}
		}
		if err := ocihook.EditSpecFile(target, edit); err != nil {
			return cli.Exit("gpuarb hooks install: "+err.Error(), 1)
		}
		fmt.Fprintf(w, "added the gpuarb hooks to %s\n", target)
		if dropped != "" {
			fmt.Fprintf(w, "dropped process.rlimits %s: containerd would give them to every pod; without them pods keep containerd's own\n", dropped)
		}
		if rt == "containerd" {
			fmt.Fprintf(w, containerdSteps, target)
		}
	default:
		return cli.Exit(fmt.Sprintf("gpuarb hooks install: --runtime %q: want %s", rt, hookRuntimes), 2)
	}
	return nil
}

func hooksSetup(c *cli.Context) error {
	root := c.String("host")
	in, err := ocihook.DetectIntegration(root)
	if err != nil {
		return cli.Exit("gpuarb hooks setup: "+err.Error(), 1)
	}
	w := c.App.Writer
	runtime := cmp.Or(in.Runtime, "the container runtime")
	if in.NRISocket != "" {
		fmt.Fprintf(w, "%s serves NRI at %s: the daemon registers its pods as an NRI plugin; no hook installed\n", runtime, in.NRISocket)
		for _, dir := range []string{ocihook.CRIOHooksDir, DefaultHooksDir} {
			files, err := ocihook.UninstallHooksD(filepath.Join(root, dir))
			for _, f := range files {
				fmt.Fprintf(w, "removed %s, which an earlier install left\n", f)
			}
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				fmt.Fprintf(c.App.ErrWriter, "gpuarb hooks setup: %v\n", err)
			}
		}
		return nil
	}
	h, err := hookCommandFrom(c)
	if err != nil {
		return cli.Exit("gpuarb hooks setup: "+err.Error(), 1)
	}
	files, err := h.InstallHooksD(filepath.Join(root, in.HooksDir), false)
	if err != nil {
		return cli.Exit(fmt.Sprintf("gpuarb hooks setup: %s without NRI reads hooks from %s: %v", runtime, in.HooksDir, err), 1)
	}
	for _, f := range files {
		fmt.Fprintf(w, "wrote %s\n", f)
	}
	fmt.Fprintf(w, "%s serves no NRI: it calls the OCI hook from %s for every new container\n", runtime, in.HooksDir)
	return nil
}

func hooksUninstall(c *cli.Context) error {
	w := c.App.Writer
	switch rt := strings.ToLower(c.String("runtime")); rt {
	case "crio", "cri-o", "podman":
		files, err := ocihook.UninstallHooksD(hooksDir(c, rt))
		for _, f := range files {
			fmt.Fprintf(w, "removed %s\n", f)
		}
		if err != nil {
			return cli.Exit("gpuarb hooks uninstall: "+err.Error(), 1)
		}
		if len(files) == 0 {
			fmt.Fprintf(w, "no gpuarb hooks in %s\n", hooksDir(c, rt))
		}
	case "libvirt":
		removed, err := libvirthook.UninstallScript(hooksDir(c, rt))
		if err != nil {
			return cli.Exit("gpuarb hooks uninstall: "+err.Error(), 1)
		}
		if removed {
			fmt.Fprintf(w, "removed the gpuarb hook from %s\n", hooksDir(c, rt))
		} else {
			fmt.Fprintf(w, "no gpuarb hook in %s\n", hooksDir(c, rt))
		}
	case "containerd", "runc", "crun":
		target := specFile(c, rt)
		if target == "" {
			return cli.Exit("gpuarb hooks uninstall: give --base (containerd) or --bundle (runc, crun)", 2)
		}
		if err := ocihook.EditSpecFile(target, ocihook.RemoveFromSpec); err != nil {
			return cli.Exit("gpuarb hooks uninstall: "+err.Error(), 1)
		}
		fmt.Fprintf(w, "removed the gpuarb hooks from %s\n", target)
	default:
		return cli.Exit(fmt.Sprintf("gpuarb hooks uninstall: --runtime %q: want %s", rt, hookRuntimes), 2)
	}
	return nil
}
