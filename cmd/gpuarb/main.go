// Command gpuarb is the GPU-sharing layer's CLI: it traces GPU work with
// eBPF, reports what the host supports and shows the pinned maps.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	err := newApp().Run(os.Args)
	if err == nil {
		return
	}
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		// Exit errors carry their own context and exit code.
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(os.Stderr, msg)
		}
		os.Exit(ec.ExitCode())
	}
	fmt.Fprintln(os.Stderr, "gpuarb:", err)
	os.Exit(1)
}

func newApp() *cli.App {
	return &cli.App{
		Name:    "gpuarb",
		Usage:   "share GPUs fairly between containers, VMs and processes, measured with eBPF",
		Version: version,
		Commands: []*cli.Command{
			daemonCommand(),
			statusCommand(),
			topCommand(),
			traceCommand(),
			mapsCommand(),
			attachCommand(),
			detachCommand(),
			policyCommand(),
			thawCommand(),
			ociHookCommand(),
			libvirtHookCommand(),
			hooksCommand(),
			doctorCommand(),
			guardianCommandDef(),
			{
				Name:  "version",
				Usage: "print the version",
				Action: func(c *cli.Context) error {
					fmt.Fprintf(c.App.Writer, "gpuarb %s\n", version)
					return nil
				},
			},
		},
		EnableBashCompletion: true,
		// main reports errors and exits; the app never exits by itself.
		ExitErrHandler: func(*cli.Context, error) {},
	}
}

// requireRoot fails with a clear reason when not running as root.
func requireRoot(what string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN): run it with sudo", what)
	}
	return nil
}
