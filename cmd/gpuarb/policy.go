package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/daemon"
	"github.com/gpuarb/gpuarb/policy"
)

func attachCommand() *cli.Command {
	return &cli.Command{
		Name:      "attach",
		Usage:     "register a tenant with its policy",
		ArgsUsage: " ",
		Description: `Names a cgroup (as in /proc/PID/cgroup, e.g. /kubepods/pod1/ctr, or a full
path under the cgroup mount) or a process tree (--pid, throttled with
SIGSTOP/SIGCONT) as a tenant. Re-attaching a name replaces its rules.
Examples:
  gpuarb attach --cgroup /gpu/train --name train --weight 300
  gpuarb attach --pid 4242 --limit 30%
  gpuarb attach --cgroup /gpu/infer --priority latency --slo-p99-ms 20`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "cgroup", Usage: "cgroup `PATH`"},
			&cli.IntFlag{Name: "pid", Usage: "process `PID` (and its descendants)"},
			&cli.StringFlag{Name: "name", Usage: "tenant `NAME` (default: from the cgroup or pid)"},
			&cli.IntFlag{Name: "weight", Usage: "relative share `W`, 1–10000 (default 100)"},
			&cli.StringFlag{Name: "limit", Usage: "hard maximum share `P` of a GPU: 0.3 or 30%"},
			&cli.StringFlag{Name: "priority", Usage: "`CLASS`: latency | normal | batch (default normal)"},
			&cli.Float64Flag{Name: "slo-p99-ms", Usage: "latency SLO: p99 sync wait ≤ `X` ms (needs --priority latency)"},
			&cli.Float64Flag{Name: "slo-fps", Usage: "frame-loop SLO: at least `F` frames/s (needs --priority latency)"},
			socketFlag(),
		},
		Action: func(c *cli.Context) error {
			t := policy.Tenant{Name: c.String("name"), Selector: policy.Selector{Cgroup: c.String("cgroup"), PID: c.Int("pid")}}
			if (t.Cgroup == "") == (t.PID == 0) {
				return cli.Exit("gpuarb attach: give exactly one of --cgroup PATH or --pid PID", 2)
			}
			if t.Name == "" {
				if t.PID != 0 {
					t.Name = fmt.Sprintf("pid-%d", t.PID)
				} else {
					t.Name = strings.Trim(strings.ReplaceAll(t.Cgroup, "/", "-"), "-")
				}
				if t.Name == "" {
					t.Name = "root"
				}
			}
			if c.IsSet("weight") {
				if w := c.Int("weight"); w < policy.MinWeight || w > policy.MaxWeight {
					return cli.Exit(fmt.Sprintf("gpuarb attach: --weight %d out of range 1–10000", w), 2)
				}
				t.Weight = policy.Weight(c.Int("weight"))
			}
			if c.IsSet("limit") {
				l, err := policy.ParseShare(c.String("limit"))
				if err != nil {
					return cli.Exit("gpuarb attach: --limit: "+err.Error(), 2)
				}
				t.Limit = l
			}
			t.Priority = policy.Priority(c.String("priority"))
			t.SLO = policy.SLO{P99SyncMS: c.Float64("slo-p99-ms"), FPS: c.Float64("slo-fps")}
			if (t.SLO.P99SyncMS > 0 || t.SLO.FPS > 0) && t.Priority == "" {
				t.Priority = policy.Latency
			}
			body, err := json.Marshal(t)
			if err != nil {
				return err
			}
			if err := api.NewClient(c.String("socket")).Attach(c.Context, body); err != nil {
				return cli.Exit("gpuarb attach: "+err.Error(), 1)
			}
			fmt.Fprintf(c.App.Writer, "attached %s\n", t.Name)
			return nil
		},
	}
}

func detachCommand() *cli.Command {
	return &cli.Command{
		Name:      "detach",
		Usage:     "remove a tenant from the policy (it is thawed and falls back to the defaults)",
		ArgsUsage: "NAME",
		Flags:     []cli.Flag{socketFlag()},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("gpuarb detach: give the tenant NAME", 2)
			}
			if err := api.NewClient(c.String("socket")).Detach(c.Context, c.Args().First()); err != nil {
				return cli.Exit("gpuarb detach: "+err.Error(), 1)
			}
			fmt.Fprintf(c.App.Writer, "detached %s\n", c.Args().First())
			return nil
		},
	}
}

func policyCommand() *cli.Command {
	return &cli.Command{
		Name:  "policy",
		Usage: "show or replace the policy in force",
		Subcommands: []*cli.Command{{
			Name:  "apply",
			Usage: "validate a YAML policy and make it the daemon's (a bad one changes nothing)",
			Flags: []cli.Flag{&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Required: true, Usage: "policy `FILE` (- for stdin)"}, socketFlag()},
			Action: func(c *cli.Context) error {
				var data []byte
				var err error
				if f := c.String("file"); f == "-" {
					data, err = io.ReadAll(os.Stdin)
				} else {
					data, err = os.ReadFile(f)
				}
				if err != nil {
					return cli.Exit("gpuarb policy apply: "+err.Error(), 1)
				}
				if _, err := policy.Parse(data); err != nil {
					return cli.Exit("gpuarb policy apply: "+err.Error(), 2)
				}
				if err := api.NewClient(c.String("socket")).ApplyPolicy(c.Context, data); err != nil {
					return cli.Exit("gpuarb policy apply: "+err.Error(), 1)
				}
				fmt.Fprintln(c.App.Writer, "policy applied")
				return nil
			},
		}, {
			Name:  "show",
			Usage: "print the policy in force as YAML",
			Flags: []cli.Flag{socketFlag()},
			Action: func(c *cli.Context) error {
				out, err := api.NewClient(c.String("socket")).Policy(c.Context)
				if err != nil {
					return cli.Exit("gpuarb policy show: "+err.Error(), 1)
				}
				_, err = c.App.Writer.Write(out)
				return err
			},
		}},
	}
}

func thawCommand() *cli.Command {
	return &cli.Command{
		Name:  "thaw",
		Usage: "resume every tenant gpuarb may have frozen or stopped",
		Description: `With the daemon running, it thaws everything and pauses enforcement until a
policy is applied again (gpuarb policy apply, attach, or SIGHUP). Without a
daemon it thaws what the ledger lists and continues the processes that the
pinned held table (under --pin-path) says a launch gate stopped.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "all", Required: true, Usage: "every tenant"},
			&cli.StringFlag{Name: "ledger", Usage: "thaw ledger `FILE` (default: gated.json beside the socket)"},
			&cli.StringFlag{Name: "pin-path", Value: bpf.DefaultPinPath, Usage: "bpffs `DIR` of the daemon's pinned maps"},
			socketFlag(),
		},
		Action: func(c *cli.Context) error {
			err := api.NewClient(c.String("socket")).ThawAll(c.Context)
			if err == nil {
				fmt.Fprintln(c.App.Writer, "thawed every tenant; enforcement paused until a policy is applied")
				return nil
			}
			if !errors.Is(err, api.ErrNoDaemon) {
				return cli.Exit("gpuarb thaw: "+err.Error(), 1)
			}
			done, err := daemon.ThawLeftovers(ledgerPath(c), c.String("pin-path"))
			for _, line := range done {
				fmt.Fprintln(c.App.Writer, line)
			}
			if err != nil {
				return cli.Exit("gpuarb thaw: "+err.Error(), 1)
			}
			fmt.Fprintf(c.App.Writer, "no daemon; resumed %d targets from %s and %s\n", len(done), ledgerPath(c), c.String("pin-path"))
			return nil
		},
	}
}
