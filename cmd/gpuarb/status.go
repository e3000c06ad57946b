package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/gpuarb/gpuarb/api"
)

const defaultWindow = time.Second

func socketFlag() cli.Flag {
	return &cli.StringFlag{Name: "socket", Value: api.DefaultSocket, Usage: "daemon API socket `PATH`"}
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show GPU time per tenant as the daemon measures it",
		Description: `status asks the daemon for its figures: per tenant (a cgroup, named after its
container when it is one) and GPU, the share of the GPU's time in the last
window (0..1), GPU ms, launches/s and memory held; per GPU how busy it was.`,
		Flags: []cli.Flag{socketFlag(), &cli.BoolFlag{Name: "json", Usage: "print the status document as JSON"}},
		Action: func(c *cli.Context) error {
			st, err := api.NewClient(c.String("socket")).Status(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			return printTable(c.App.Writer, st, "share")
		},
	}
}

func topCommand() *cli.Command {
	return &cli.Command{
		Name:  "top",
		Usage: "a live table of GPU time per tenant, refreshed every second",
		Description: `top redraws the daemon's figures like top or nvtop: tenant, GPU, share, GPU
ms per second, launches/s, memory and state. In a terminal it redraws in
place; over a pipe it prints one frame after another. q or Ctrl-C quits.`,
		Flags: []cli.Flag{
			socketFlag(),
			&cli.BoolFlag{Name: "once", Usage: "print one frame and exit"},
			&cli.DurationFlag{Name: "interval", Value: time.Second, Usage: "refresh every `DURATION`"},
			&cli.StringFlag{Name: "sort", Value: "share", Usage: "sort by `KEY`: share, gpu, name, launches, mem"},
		},
		Action: func(c *cli.Context) error {
			key := c.String("sort")
			if !validSort[key] {
				return fmt.Errorf("--sort %q: want share, gpu, name, launches or mem", key)
			}
			if c.Duration("interval") < 100*time.Millisecond {
				return fmt.Errorf("--interval %s: want at least 100ms", c.Duration("interval"))
			}
			client := api.NewClient(c.String("socket"))
			tty := isTerminal(c.App.Writer)
			ctx, cancel := context.WithCancel(c.Context)
			defer cancel()
			if tty && !c.Bool("once") {
				restore := watchQuit(cancel)
				defer restore()
			}
			for {
				st, err := client.Status(ctx)
				if err != nil {
					return err
				}
				if tty && !c.Bool("once") {
					fmt.Fprint(c.App.Writer, "\x1b[H\x1b[2J") // home, clear
				}
				fmt.Fprintf(c.App.Writer, "gpuarb top - %s - %d tenant(s) - window %s\n", time.Now().Format("15:04:05"),
					len(st.Tenants), time.Duration(st.WindowNS))
				for _, g := range st.GPUs {
					fmt.Fprintf(c.App.Writer, "GPU %d  busy %5.1f%%  %d tenant(s)", g.Index, 100*g.BusyShare, g.Tenants)
					if g.BaseSliceUS > 0 {
						fmt.Fprintf(c.App.Writer, "  timeslices %d µs, at least %d µs", g.BaseSliceUS, g.MinSliceUS)
					}
					if g.LatencyHolds > 0 {
						fmt.Fprintf(c.App.Writer, "  latency holds %d (start %d µs, slices bound %d µs)", g.LatencyHolds,
							g.LatencyHoldStartUS, g.LatencyHoldBoundUS)
					}
					fmt.Fprintln(c.App.Writer)
				}
				fmt.Fprintln(c.App.Writer)
				if err := printTable(c.App.Writer, st, key); err != nil {
					return err
				}
				if c.Bool("once") {
					return nil
				}
				if !tty {
					fmt.Fprintln(c.App.Writer)
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(c.Duration("interval")):
				}
			}
		},
	}
}

var validSort = map[string]bool{"share": true, "gpu": true, "name": true, "launches": true, "mem": true}

func sortTenants(ts []api.Tenant, key string) {
	sort.SliceStable(ts, func(i, j int) bool {
		a, b := ts[i], ts[j]
		switch key {
		case "gpu":
			return a.GPU < b.GPU
		case "name":
			return a.Name < b.Name
		case "launches":
			return a.LaunchesPerS > b.LaunchesPerS
		case "mem":
			return a.MemBytes > b.MemBytes
		}
		return a.Share > b.Share
	})
}

// memoryColumn shows the device memory a tenant holds on the GPU, in MiB,
// and its limit where it has one ("900/1024"; "900/50%" for a share of a
// GPU whose size is not read yet).
func memoryColumn(t api.Tenant) string {
	held := fmt.Sprintf("%.0f", float64(t.MemBytes)/(1<<20))
	switch {
	case t.MemoryLimit == 0 && t.MemoryLimitShare != 0:
		return fmt.Sprintf("%s/%g%%", held, t.MemoryLimitShare*100)
	case t.MemoryLimit == 0:
		return held
	}
	return fmt.Sprintf("%s/%.0f", held, float64(t.MemoryLimit)/(1<<20))
}

// driverMemoryColumn shows what the driver itself counts for the tenant's
// processes on the GPU, in MiB ("-" where it could not be asked).
func driverMemoryColumn(t api.Tenant) string {
	if t.DriverMemBytes == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(*t.DriverMemBytes)/(1<<20))
}

func printTable(w io.Writer, st api.Status, key string) error {
	sortTenants(st.Tenants, key)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tGPU\tSHARE\tTARGET\tDUTY\tPRIO\tWEIGHT\tGPU ms/s\tQUEUE ms/s\tLAUNCH/s\tSYNC/s\tMEM MiB\tDRIVER MiB\tOOM\tPROCS\tSTATE\tCGROUP\t")
	window := float64(st.WindowNS) / 1e9
	for _, t := range st.Tenants {
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%.1f%%\t%.2f\t%s\t%d\t%.1f\t%.1f\t%.0f\t%.0f\t%s\t%s\t%d\t%d\t%s\t%s\t\n", truncate(displayName(t), 24), t.GPU,
			100*t.Share, 100*t.TargetShare, t.Duty, t.Priority, t.Weight, float64(t.GPUNS)/1e6/window, float64(t.QueueNS)/1e6/window,
			t.LaunchesPerS, t.SyncsPerS, memoryColumn(t), driverMemoryColumn(t), t.OOMKills, t.Processes, t.State, truncate(t.Cgroup, 48))
	}
	if len(st.Tenants) == 0 {
		fmt.Fprintln(tw, "(no tenant has used a GPU in the window)\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t")
	}
	if !st.Enforcing {
		fmt.Fprintln(tw, "(observing only: nothing is throttled)")
	}
	if st.PolicyError != "" {
		fmt.Fprintf(tw, "(policy file refused, the last good policy applies: %s)\n", shown(st.PolicyError))
	}
	// Failed freezes, thaws and pauses: the tenant may get more than its
	// share while they go on.
	for _, t := range st.Tenants {
		if t.GateErrors > 0 {
			fmt.Fprintf(tw, "(%s: %d failed freeze, thaw or pause operations; last: %s)\n", shown(displayName(t)), t.GateErrors, shown(t.LastGateError))
		}
	}
	// Work nobody sees: the tenant is metered by assumption.
	for _, t := range st.Tenants {
		if len(t.UnprobedPIDs) > 0 {
			fmt.Fprintf(tw, "(%s: pids %v use the GPU through a driver gpuarb does not probe: metered as busy whenever they may run, held by %s)\n",
				shown(displayName(t)), t.UnprobedPIDs, shown(t.Actuator))
		}
	}
	// Pods the annotations of which never reached gpuarb.
	var unregistered []string
	for _, t := range st.Tenants {
		if t.Unregistered {
			unregistered = append(unregistered, displayName(t))
		}
	}
	if len(unregistered) > 0 {
		fmt.Fprintf(tw, "(containers of Kubernetes pods use a GPU unregistered, their pods' gpuarb.io/* annotations not applied: %s; %s)\n",
			shown(strings.Join(unregistered, " ")), nriAdvice(st.NRI))
	}
	// NRI is news when the runtime that was connected is gone.
	if n := st.NRI; n != nil && !n.Connected && !n.Since.IsZero() {
		fmt.Fprintf(tw, "(NRI: the runtime's connection at %s is lost (%s); new pods are not registered until it is back)\n", n.Socket, shown(cmp.Or(n.LastError, "closed")))
	}
	// The guardian is news only when it is not running or has died.
	if g := st.Guardian; g != nil && (g.PID == 0 || g.Restarts > 0) {
		state := fmt.Sprintf("pid %d", g.PID)
		if g.PID == 0 {
			state = "not running"
		}
		fmt.Fprintf(tw, "(thaw guardian %s, restarted %d times)\n", state, g.Restarts)
	}
	return tw.Flush()
}

// nriAdvice says why pods may go unregistered, from the NRI plugin's
// state.
func nriAdvice(n *api.NRIStatus) string {
	switch {
	case n == nil:
		return "the daemon runs without its NRI plugin (--nri-socket): install the OCI hook (docs/deploy.md)"
	case !n.Connected:
		return fmt.Sprintf("the NRI plugin is not connected to %s: %s", n.Socket, cmp.Or(n.LastError, "no runtime answered"))
	default:
		return fmt.Sprintf("NRI is connected to %s %s, and registering these failed: the daemon's log says why (\"NRI: ...\")", n.Runtime, n.RuntimeVersion)
	}
}

// truncate shows s (shown) in at most n characters, keeping its end.
// displayName is what a table shows of a tenant: its label where it has
// one (a tenant named by its cgroup), else its name.
func displayName(t api.Tenant) string {
	if t.Label != "" {
		return t.Label
	}
	return t.Name
}

func truncate(s string, n int) string {
	r := []rune(shown(s))
	if len(r) <= n {
		return string(r)
	}
	return "…" + string(r[len(r)-n+1:])
}

// shown makes a name fit for a terminal: tenants control what their
// cgroups and processes are called, and a control character or a terminal
// escape in a name would act on the operator's terminal. Those, and bytes
// that are not UTF-8, are shown escaped (\x1b).
func shown(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case !unicode.IsPrint(r):
			b.WriteString(strings.Trim(strconv.QuoteRuneToASCII(r), "'"))
		default:
			b.WriteRune(r)
		}
		i += size
	}
	return b.String()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// watchQuit puts stdin in raw mode and cancels on q or Ctrl-C.
func watchQuit(cancel func()) (restore func()) {
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return func() {}
	}
	old, err := term.MakeRaw(fd)
	if err != nil {
		return func() {}
	}
	go func() {
		b := make([]byte, 1)
		for {
			if _, err := os.Stdin.Read(b); err != nil || strings.ContainsRune("qQ\x03", rune(b[0])) {
				cancel()
				return
			}
		}
	}()
	return func() { term.Restore(fd, old) }
}
