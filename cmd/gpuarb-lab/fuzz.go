package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/gpuarb/gpuarb/lab"
)

func fuzzCommand() *cli.Command {
	return &cli.Command{
		Name:  "fuzz",
		Usage: "run randomized sharing scenarios without and with gpuarb and score them against max-min fair targets",
		Description: `fuzz draws one scenario per seed (lab.DrawScenario: 2–6 tenants of 1–4
processes, kernel mixes of 20 µs to 50 ms, syncs every 1–200 launches by
stream, context, event or polling or never, think time, graphs, weights
1–1000, limits, arrivals and departures), runs each tenant alone on the
scenario's timeline (what it takes alone in each second, phases and all),
then all together without gpuarb and with the daemon, and compares the true
shares (fakegpud stats) in each 1 s window with the weighted max-min
targets over that second's demands. A scenario passes when every tenant's
median error over a segment's windows is within 3 pp. Each seed takes
about 50 s.

--shapes also draws, from the same seed, what one context per process on
one GPU leaves out (lab.Scenario.WithShapes): processes of 2–4 contexts (a
context per thread), a second GPU with some processes on both (each GPU
scored apart: tenant@1 is a tenant's share of GPU 1), steering refused by
the driver for some tenants or all of them (held at the launch gate), and
the daemon stopped or killed and restarted between 3 and 8 s (a segment
boundary, like an arrival). Run it in each actuator mode:
--daemon-arg=--gpu-scheduler --daemon-arg=off holds every tenant at the
launch gate.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "seeds", Value: "1..10", Usage: "`A..B` (inclusive) or a comma-separated list"},
			&cli.StringFlag{Name: "scenario", Usage: "run the scenarios in `FILE` instead of drawing them from seeds: --json's output, or its \"Scenario\" objects (one, or a list), edited at will"},
			&cli.BoolFlag{Name: "shapes", Usage: "also draw contexts per thread, a second GPU, steering refused and a daemon restart (not with --scenario)"},
			&cli.BoolFlag{Name: "realism", Usage: "run the simulated GPU with --realism"},
			&cli.StringSliceFlag{Name: "gpu-arg", Usage: "pass `FLAG` to fakegpud serve (repeatable; --gpu-arg=--ctxsw=256us --gpu-arg=--timeslice=2048us runs the real-GPU check's H200)"},
			&cli.BoolFlag{Name: "probed-demand", Usage: "set the targets from each tenant alone beside the daemon observing (its probes' cost counted as the tenant's own), in a fourth run (about 15 s more a seed); the errors against the demands without them are printed beside"},
			&cli.StringFlag{Name: "json", Usage: "also write the results to `FILE` as JSON"},
			&cli.StringSliceFlag{Name: "daemon-arg", Usage: "pass `FLAG` to gpuarb daemon (repeatable)"},
			&cli.BoolFlag{Name: "verbose", Usage: "print every second of the runs: true share, gpuarb's estimate, target and duty per tenant"},
			&cli.StringFlag{Name: "logs", Usage: "keep the daemon's log and its status every second, per seed, in `DIR`"},
			&cli.BoolFlag{Name: "record-meter", Usage: "with --logs, also keep the meter's recording of the run with gpuarb (seed-N-meter.jsonl, about 1 MB a second), to replay with replay-meter"},
		},
		Action: func(c *cli.Context) error {
			if err := requireRoot(); err != nil {
				return err
			}
			bins, err := binDir(c)
			if err != nil {
				return err
			}
			var scenarios []lab.Scenario
			if p := c.String("scenario"); p != "" {
				if c.IsSet("seeds") || c.Bool("shapes") {
					return fmt.Errorf("--scenario with --seeds or --shapes: the file's scenarios are run as they are")
				}
				if scenarios, err = readScenarios(p); err != nil {
					return err
				}
			} else {
				seeds, err := parseSeeds(c.String("seeds"))
				if err != nil {
					return err
				}
				for _, seed := range seeds {
					sc := lab.DrawScenario(seed)
					if c.Bool("shapes") {
						sc = sc.WithShapes()
					}
					scenarios = append(scenarios, sc)
				}
			}
			o := lab.RunOptions{Bins: bins, Parent: cgroupParent, DaemonArgs: c.StringSlice("daemon-arg"),
				Log: func(format string, args ...any) { fmt.Fprintf(c.App.ErrWriter, "fuzz: "+format+"\n", args...) }}
			if c.Bool("realism") {
				o.GPUArgs = []string{"--realism"}
			}
			o.GPUArgs = append(o.GPUArgs, c.StringSlice("gpu-arg")...)
			o.ProbedDemand = c.Bool("probed-demand")
			if d := c.String("logs"); d != "" {
				if err := os.MkdirAll(d, 0o755); err != nil {
					return err
				}
				o.Logs = d
			}
			if o.RecordMeter = c.Bool("record-meter"); o.RecordMeter && o.Logs == "" {
				return fmt.Errorf("--record-meter keeps the recordings in --logs DIR: give --logs")
			}
			if c.Bool("verbose") {
				o.Samples = func(arbitrated bool, ss []lab.Sample) { printSamples(c.App.Writer, arbitrated, ss) }
			}
			results, err := runFuzz(c.Context, c.App.Writer, scenarios, o)
			if p := c.String("json"); p != "" && len(results) > 0 {
				data, jerr := json.MarshalIndent(results, "", "  ")
				if jerr == nil {
					jerr = os.WriteFile(p, data, 0o644)
				}
				if jerr != nil {
					return fmt.Errorf("write %s: %w", p, jerr)
				}
			}
			return err
		},
	}
}

// parseSeeds reads "A..B" or "a,b,c".
func parseSeeds(s string) ([]uint64, error) {
	bad := fmt.Errorf("--seeds %q: want A..B or a comma-separated list of seeds", s)
	if a, b, ok := strings.Cut(s, ".."); ok {
		lo, err1 := strconv.ParseUint(a, 10, 64)
		hi, err2 := strconv.ParseUint(b, 10, 64)
		if err1 != nil || err2 != nil || hi < lo || hi-lo > 100000 {
			return nil, bad
		}
		var out []uint64
		for i := lo; i <= hi; i++ {
			out = append(out, i)
		}
		return out, nil
	}
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, bad
		}
		out = append(out, v)
	}
	return out, nil
}

// passBar and failBar are the fuzzer's bars: a scenario passes when every
// tenant is within passBar of its target; none may be beyond failBar.
const (
	passBar = 0.03
	failBar = 0.10
)

// readScenarios reads the scenarios of a file --json wrote (a list of
// results, each with its "Scenario"), or one scenario or a list of them.
func readScenarios(path string) ([]lab.Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--scenario: %w", err)
	}
	var results []struct{ Scenario *lab.Scenario }
	var list []lab.Scenario
	var one lab.Scenario
	switch {
	case json.Unmarshal(data, &results) == nil && len(results) > 0 && results[0].Scenario != nil:
		for _, r := range results {
			if r.Scenario != nil {
				list = append(list, *r.Scenario)
			}
		}
	case json.Unmarshal(data, &list) == nil:
	case json.Unmarshal(data, &one) == nil:
		list = []lab.Scenario{one}
	default:
		return nil, fmt.Errorf("--scenario %s: want the JSON of --json, a scenario or a list of them", path)
	}
	for _, sc := range list {
		if len(sc.Tenants) == 0 || sc.Duration <= 0 {
			return nil, fmt.Errorf("--scenario %s: seed %d: want tenants and a duration (ns)", path, sc.Seed)
		}
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("--scenario %s: no scenarios", path)
	}
	return list, nil
}

// runFuzz runs the scenarios, printing each result and a summary to w.
func runFuzz(ctx context.Context, w io.Writer, scenarios []lab.Scenario, o lab.RunOptions) ([]lab.ScenarioResult, error) {
	var results []lab.ScenarioResult
	for _, sc := range scenarios {
		fmt.Fprint(w, sc.String())
		res, err := lab.RunScenario(ctx, sc, o)
		if err != nil {
			printFuzzSummary(w, results)
			return results, err
		}
		printScenarioResult(w, res)
		results = append(results, res)
	}
	printFuzzSummary(w, results)
	return results, nil
}

func printScenarioResult(w io.Writer, r lab.ScenarioResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, seg := range r.Segments {
		unprobed := ""
		if r.ProbedDemand() {
			unprobed = "\talone unprobed"
		}
		fmt.Fprintf(tw, "  segment %d\ttarget\twithout\twith gpuarb\testimated\terror\talone\tlatency bound%s\n", i+1, unprobed)
		for _, t := range seg {
			if r.ProbedDemand() {
				unprobed = fmt.Sprintf("\t%.1f%%", 100*t.AloneUnprobed)
			}
			fmt.Fprintf(tw, "  %s\t%.1f%%\t%.1f%%\t%.1f%%\t%.1f%%\t%.1f pp\t%.1f%%\t%.1f%%%s\n", t.Name, 100*t.Target,
				100*t.Unarbitrated, 100*t.True, 100*t.Estimated, 100*t.Error(), 100*t.Alone, 100*t.LatencyBound, unprobed)
		}
	}
	tw.Flush()
	verdict := "pass"
	if r.MaxError(true) > passBar {
		verdict = "FAIL"
		if held := r.LatencyHeld(passBar); held != nil {
			verdict = fmt.Sprintf("FAIL (only closed loops held at their latency bound miss: %s)", strings.Join(held, ", "))
		}
	}
	unprobed := ""
	if r.ProbedDemand() {
		unprobed = fmt.Sprintf("; against the demand without the probes %.1f pp with gpuarb", 100*r.MaxErrorUnprobed())
	}
	fmt.Fprintf(w, "  %s: largest error %.1f pp with gpuarb, %.1f pp without; meter off by at most %.1f pp%s\n\n", verdict,
		100*r.MaxError(true), 100*r.MaxError(false), 100*r.MaxMeterError(), unprobed)
}

// FuzzSummary is the error distribution over scenarios.
type FuzzSummary struct {
	Scenarios                 int
	Within3, Beyond10         int     // with gpuarb
	Within3Free, Beyond10Free int     // without
	MedianMax, MedianMaxFree  float64 // median over scenarios of the largest tenant error
	Failed                    []uint64
	// LatencyHeld are the failed seeds where only closed loops held at
	// their latency bound miss (lab.ScenarioResult.LatencyHeld).
	LatencyHeld []uint64
	// Probed is set when the targets came from the demands under the
	// probes (--probed-demand); the Unprobed figures then score gpuarb
	// against the targets from the demands without them.
	Probed            bool
	Within3Unprobed   int
	Beyond10Unprobed  int
	MedianMaxUnprobed float64
	FailedUnprobed    []uint64
}

// summarize computes the error distribution of results.
func summarize(results []lab.ScenarioResult) FuzzSummary {
	s := FuzzSummary{Scenarios: len(results)}
	var with, without, unprobed []float64
	for _, r := range results {
		if r.ProbedDemand() {
			s.Probed = true
			u := r.MaxErrorUnprobed()
			unprobed = append(unprobed, u)
			if u <= passBar {
				s.Within3Unprobed++
			} else {
				s.FailedUnprobed = append(s.FailedUnprobed, r.Scenario.Seed)
			}
			if u > failBar {
				s.Beyond10Unprobed++
			}
		}
		e, f := r.MaxError(true), r.MaxError(false)
		with, without = append(with, e), append(without, f)
		if e <= passBar {
			s.Within3++
		} else {
			s.Failed = append(s.Failed, r.Scenario.Seed)
			if r.LatencyHeld(passBar) != nil {
				s.LatencyHeld = append(s.LatencyHeld, r.Scenario.Seed)
			}
		}
		if e > failBar {
			s.Beyond10++
		}
		if f <= passBar {
			s.Within3Free++
		}
		if f > failBar {
			s.Beyond10Free++
		}
	}
	s.MedianMax, s.MedianMaxFree, s.MedianMaxUnprobed = lab.Median(with), lab.Median(without), lab.Median(unprobed)
	slices.Sort(s.FailedUnprobed)
	slices.Sort(s.Failed)
	slices.Sort(s.LatencyHeld)
	return s
}

func printFuzzSummary(w io.Writer, results []lab.ScenarioResult) {
	if len(results) == 0 {
		return
	}
	s := summarize(results)
	fmt.Fprintf(w, "%d scenarios: every tenant within 3 pp of its target in %d (%.0f%%) with gpuarb, %d without; "+
		"a tenant beyond 10 pp in %d with gpuarb, %d without; median largest error %.1f pp with, %.1f pp without\n",
		s.Scenarios, s.Within3, 100*float64(s.Within3)/float64(s.Scenarios), s.Within3Free, s.Beyond10, s.Beyond10Free,
		100*s.MedianMax, 100*s.MedianMaxFree)
	if len(s.Failed) > 0 {
		fmt.Fprintf(w, "failing seeds: %v\n", s.Failed)
	}
	if len(s.LatencyHeld) > 0 {
		fmt.Fprintf(w, "of which only closed loops held at their latency bound miss in: %v\n", s.LatencyHeld)
	}
	if s.Probed {
		fmt.Fprintf(w, "against the targets from the demands without the probes: every tenant within 3 pp in %d (%.0f%%) with gpuarb; "+
			"a tenant beyond 10 pp in %d; median largest error %.1f pp; failing seeds: %v\n", s.Within3Unprobed,
			100*float64(s.Within3Unprobed)/float64(s.Scenarios), s.Beyond10Unprobed, 100*s.MedianMaxUnprobed, s.FailedUnprobed)
	}
}

// printSamples prints one line per second of a run: per tenant its true
// share, and with gpuarb its estimate, target and duty.
func printSamples(w io.Writer, arbitrated bool, ss []lab.Sample) {
	run := "without gpuarb"
	if arbitrated {
		run = "with gpuarb (true est target duty)"
	}
	fmt.Fprintf(w, "  %s:\n", run)
	for _, s := range ss {
		names := make([]string, 0, len(s.True))
		for n := range s.True {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(w, "    %5.1fs busy %3.0f%%", s.At.Seconds(), 100*s.Busy)
		for _, n := range names {
			if arbitrated {
				fmt.Fprintf(w, " | %s %4.1f %4.1f %4.1f %.2f", n, 100*s.True[n], 100*s.Est[n], 100*s.Target[n], s.Duty[n])
			} else {
				fmt.Fprintf(w, " | %s %4.1f", n, 100*s.True[n])
			}
		}
		fmt.Fprintln(w)
	}
}
