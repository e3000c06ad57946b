package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/enforce"
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
A --pid tenant is the process that pid names now, and its descendants.

A process started from an interactive shell: if the shell exits while
gpuarb holds the process stopped, the kernel sends SIGHUP to its process
group (an orphaned group with a stopped member), which ends it unless it
ignores SIGHUP. Start such work with setsid or nohup, or attach it by
cgroup (systemd-run --scope).
Examples:
  gpuarb attach --cgroup /gpu/train --name train --weight 300
  gpuarb attach --pid 4242 --limit 30%
  gpuarb attach --cgroup /gpu/notebook --memory-limit 16GiB
  gpuarb attach --cgroup /gpu/infer --priority latency --slo-p99-ms 20`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "cgroup", Usage: "cgroup `PATH`"},
			&cli.IntFlag{Name: "pid", Usage: "process `PID` (and its descendants)", DefaultText: "none"},
			&cli.StringFlag{Name: "name", Usage: "tenant `NAME` (default: from the cgroup or pid)"},
			&cli.IntFlag{Name: "weight", Usage: "relative share `W`, 1–10000", DefaultText: "100"},
			&cli.StringFlag{Name: "limit", Usage: "hard maximum share `P` of a GPU: 0.3 or 30%"},
			&cli.StringFlag{Name: "memory-limit", Usage: "GPU memory `LIMIT` on each GPU: an amount (16GiB, 512MiB), a share of each GPU's memory (50%), or both (50% up to 16GiB); an allocation past it kills the allocating process"},
			&cli.StringFlag{Name: "priority", Usage: "`CLASS`: latency | normal | batch", DefaultText: "normal"},
			&cli.Float64Flag{Name: "slo-p99-ms", Usage: "latency SLO: p99 sync wait ≤ `X` ms (needs --priority latency)", DefaultText: "none"},
			&cli.Float64Flag{Name: "slo-fps", Usage: "frame-loop SLO: at least `F` frames/s (needs --priority latency)", DefaultText: "none"},
			socketFlag(),
		},
		Action: func(c *cli.Context) error {
			t := policy.Tenant{Name: c.String("name"), Selector: policy.Selector{Cgroup: c.String("cgroup"), PID: c.Int("pid")}}
			if (t.Cgroup == "") == (t.PID == 0) {
				return cli.Exit("gpuarb attach: give exactly one of --cgroup PATH or --pid PID", 2)
			}
			if err := attachTargetExists(t.Selector); err != nil {
				return cli.Exit("gpuarb attach: "+err.Error(), 2)
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
			if c.IsSet("memory-limit") {
				m, err := policy.ParseMemoryLimit(c.String("memory-limit"))
				if err != nil {
					return cli.Exit("gpuarb attach: --memory-limit: "+err.Error(), 2)
				}
				t.MemoryLimit = m
			}
			t.Priority = policy.Priority(c.String("priority"))
			t.SLO = policy.SLO{P99SyncMS: c.Float64("slo-p99-ms"), FPS: c.Float64("slo-fps")}
			if (t.SLO.P99SyncMS > 0 || t.SLO.FPS > 0) && t.Priority == "" {
				t.Priority = policy.Latency
			}
			if err := checkRulesFlags(t.Rules); err != nil {
				return cli.Exit("gpuarb attach: "+err.Error(), 2)
			}
			body, err := json.Marshal(t)
			if err != nil {
				return err
			}
			// The operator attaches: no owner, no admission bounds.
			if _, err := api.NewClient(c.String("socket")).Attach(c.Context, "", body); err != nil {
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
		Usage:     "remove an attached tenant (it is thawed and falls back to the policy file's entry or the defaults)",
		ArgsUsage: "NAME",
		Flags:     []cli.Flag{socketFlag()},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("gpuarb detach: give the tenant NAME", 2)
			}
			if err := api.NewClient(c.String("socket")).Detach(c.Context, "", c.Args().First()); err != nil {
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

// thawAnswerTimeout is how long thaw --all waits for the daemon before it
// resumes what the ledger and the pins list itself: a hung daemon must
// not keep tenants frozen.
const thawAnswerTimeout = 5 * time.Second

func thawCommand() *cli.Command {
	return &cli.Command{
		Name:  "thaw",
		Usage: "resume every tenant gpuarb may have frozen or stopped",
		Description: `With the daemon running, it thaws everything and pauses enforcement until a
policy is applied again (gpuarb policy apply, attach or detach, or SIGHUP; a
container's or VM's hook does not resume it). Without a
daemon (or one that does not answer within 5 s) it thaws what the ledger
lists and continues the processes that the pinned held table (under
--pin-path) says a launch gate stopped.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "all", Required: true, Usage: "every tenant"},
			&cli.StringFlag{Name: "ledger", Usage: "thaw ledger `FILE` (default: gated.json beside the socket)"},
			&cli.StringFlag{Name: "pin-path", Value: bpf.DefaultPinPath, Usage: "bpffs `DIR` of the daemon's pinned maps"},
			socketFlag(),
		},
		Action: func(c *cli.Context) error {
			ctx, cancel := context.WithTimeout(c.Context, thawAnswerTimeout)
			defer cancel()
			err := api.NewClient(c.String("socket")).ThawAll(ctx)
			switch {
			case err == nil:
				fmt.Fprintln(c.App.Writer, "thawed every tenant; enforcement paused until a policy is applied")
				return nil
			case errors.Is(err, context.DeadlineExceeded):
				fmt.Fprintf(c.App.ErrWriter, "gpuarb thaw: the daemon did not answer within %v; resuming from its ledger and pins (a daemon that recovers may hold tenants again)\n", thawAnswerTimeout)
			case !errors.Is(err, api.ErrNoDaemon):
				return cli.Exit("gpuarb thaw: "+err.Error(), 1)
			}
			done, err := enforce.ThawLeftovers(ledgerPath(c), c.String("pin-path"))
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

// attachTargetExists refuses a cgroup or process that is not there: an
// attach that matched nothing would succeed and hold nothing back.
func attachTargetExists(sel policy.Selector) error {
	if sel.PID != 0 {
		if sel.PID < 0 {
			return fmt.Errorf("--pid %d: want a process ID", sel.PID)
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", sel.PID)); err != nil {
			return fmt.Errorf("--pid %d: no such process", sel.PID)
		}
		return nil
	}
	root, err := cgroup.UnifiedMount()
	if err != nil {
		return nil // a v1-only host: the daemon resolves the path itself
	}
	dir := sel.Cgroup
	if !strings.HasPrefix(dir, root+"/") {
		dir = filepath.Join(root, dir)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("--cgroup %s: no such cgroup (%s does not exist; create it, or attach once the container runs)", sel.Cgroup, dir)
	}
	return nil
}

// ruleFlags names the attach flag behind each rule field.
var ruleFlags = map[string]string{"rules.weight": "--weight", "rules.limit": "--limit", "rules.priority": "--priority",
	"rules.slo.p99_sync_ms": "--slo-p99-ms", "rules.slo.fps": "--slo-fps", "rules.slo": "--slo-p99-ms/--slo-fps",
	"rules.memory_limit": "--memory-limit"}

// checkRulesFlags validates the rules as the daemon will, before sending
// them, and names the flag and the values it allows.
func checkRulesFlags(r policy.Rules) error {
	if r.Weight == 0 {
		r.Weight = policy.DefaultWeight
	}
	if r.Priority == "" {
		r.Priority = policy.Normal
	}
	err := r.Validate("rules")
	var fe *policy.FieldError
	if errors.As(err, &fe) {
		if flag, ok := ruleFlags[fe.Field]; ok {
			return fmt.Errorf("%s: %s", flag, fe.Msg)
		}
	}
	return err
}
