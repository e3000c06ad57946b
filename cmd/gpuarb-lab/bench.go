package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

// bench is one run of the benchmarks.
type bench struct {
	bins, repo string
	outDir     string // the report's folder: the charts go in dataDir below it
	quick      bool
	log        io.Writer
	// fuzzSeeds are the fuzzer section's seeds; fuzzResults, when set, a
	// previous run's results to report instead.
	fuzzSeeds, fuzzResults string
	// gpuArgs are extra fakegpud serve flags for every scene.
	gpuArgs []string
	// busy collects GPU utilisation without and with gpuarb per scenario
	// for the work-conservation section.
	busy []busyFigure
}

type busyFigure struct {
	scenario      string
	without, with float64
}

// section is one numbered part of BENCHMARKS.md.
type section struct {
	key, title string
	run        func(ctx context.Context, b *bench) (string, error)
}

var sections = []section{
	{"probes", "Probe cost", benchProbes},
	{"accuracy", "Metering accuracy", benchAccuracy},
	{"fairness", "Fairness", benchFairness},
	{"weights", "Weighted shares", benchWeights},
	{"latency", "Latency protection", benchLatency},
	{"frames", "Frame loop SLA", benchFrames},
	{"reaction", "Reaction to a new tenant", benchReaction},
	{"scale", "Scale and gating costs", benchScale},
	{"conservation", "Work conservation", benchConservation},
	{"fuzz", "Random scenarios", benchFuzz},
}

func benchCommand() *cli.Command {
	var keys []string
	for _, s := range sections {
		keys = append(keys, s.key)
	}
	return &cli.Command{
		Name:  "bench",
		Usage: "measure gpuarb beside the unarbitrated baseline and write BENCHMARKS.md with its charts",
		Description: `bench runs each scenario on the simulated GPU without gpuarb (no daemon) and
with it (the daemon arbitrating), reads the ground truth from the
simulator, and writes the report with PNG charts beside it. Every figure
in the report comes from this run. The probe and accuracy sections run the
repository's Go benchmarks and end-to-end accuracy test (go test), so run
it from the repository (make bench does). The sections but the fuzzer's take
about 15 minutes; the fuzzer about 45 s per seed (--fuzz-seeds 1..100: about
70 minutes), or reads a previous gpuarb-lab fuzz --json run (--fuzz-results).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Value: "BENCHMARKS.md", Usage: "write the report to `FILE` (charts beside it)"},
			&cli.StringSliceFlag{Name: "only", Usage: "run only these sections: " + strings.Join(keys, ", ")},
			&cli.BoolFlag{Name: "quick", Usage: "shorter windows and smaller scales: a check that the bench runs, not figures to publish"},
			&cli.StringFlag{Name: "fuzz-seeds", Value: "1..100", Usage: "the fuzzer section's seeds: `A..B` or a comma-separated list (--quick: 1..2)"},
			&cli.StringFlag{Name: "fuzz-results", Usage: "report the fuzzer section from `FILE` (gpuarb-lab fuzz --json) instead of running it"},
			&cli.StringSliceFlag{Name: "gpu-arg", Usage: "pass `FLAG` to every simulated GPU (repeatable; --gpu-arg=--ctxsw=256us --gpu-arg=--timeslice=2048us runs the real-GPU check's H200; not the fuzzer's, not the go test sections')"},
		},
		Action: func(c *cli.Context) error {
			if err := requireRoot(); err != nil {
				return err
			}
			bins, err := binDir(c)
			if err != nil {
				return err
			}
			only := c.StringSlice("only")
			for _, k := range only {
				if !slices.Contains(keys, k) {
					return fmt.Errorf("--only %q: want one of %s", k, strings.Join(keys, ", "))
				}
			}
			repo, err := os.Getwd()
			if err != nil {
				return err
			}
			out := c.String("out")
			b := &bench{bins: bins, repo: repo, outDir: filepath.Dir(out), quick: c.Bool("quick"), log: c.App.ErrWriter,
				fuzzSeeds: c.String("fuzz-seeds"), fuzzResults: c.String("fuzz-results"), gpuArgs: c.StringSlice("gpu-arg")}
			if b.quick && !c.IsSet("fuzz-seeds") {
				b.fuzzSeeds = "1..2"
			}
			return b.run(c.Context, out, only)
		},
	}
}

func (b *bench) run(ctx context.Context, out string, only []string) error {
	began := time.Now()
	if err := os.MkdirAll(b.outDir, 0o755); err != nil {
		return fmt.Errorf("report directory: %w", err)
	}
	var body strings.Builder
	n := 0
	for _, s := range sections {
		n++
		if len(only) > 0 && !slices.Contains(only, s.key) {
			continue
		}
		fmt.Fprintf(b.log, "bench: %d. %s\n", n, s.title)
		text, err := s.run(ctx, b)
		if err != nil {
			return fmt.Errorf("%s: %w", s.title, err)
		}
		fmt.Fprintf(&body, "## %d. %s\n\n%s\n", n, s.title, text)
	}
	var doc strings.Builder
	doc.WriteString(benchPreface(b, time.Since(began)))
	doc.WriteString(body.String())
	if err := os.WriteFile(out, []byte(doc.String()), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	fmt.Fprintf(b.log, "bench: wrote %s in %v\n", out, time.Since(began).Round(time.Second))
	return nil
}

// dataDir is the folder beside the report that holds its charts and the
// fuzzer's results, so that the report's folder (the repository's root)
// holds only the report.
const dataDir = "benchmarks"

// chart returns the path of a chart file in the report's data folder,
// which it makes if need be (a chart that cannot be written there says
// so), and the name the report links it by.
func (b *bench) chart(name string) (path, link string) {
	dir := filepath.Join(b.outDir, dataDir)
	_ = os.MkdirAll(dir, 0o755)
	return filepath.Join(dir, name), dataDir + "/" + name
}

// logf reports progress on stderr.
func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "bench:   "+format+"\n", args...)
}

func benchPreface(b *bench, took time.Duration) string {
	var s strings.Builder
	s.WriteString("# gpuarb benchmarks\n\n")
	s.WriteString("Generated by `sudo make bench` (`bin/gpuarb-lab bench`); every figure below comes from that run")
	if b.quick {
		s.WriteString(" in --quick mode (short windows: a check that the bench runs, not figures to publish)")
	}
	fmt.Fprintf(&s, ". It took %v on %s.\n\n", took.Round(time.Second), time.Now().UTC().Format("2006-01-02"))
	s.WriteString("Machine: " + machine() + "\n\n")
	s.WriteString(`Method: every scenario runs on the simulated GPU (e2e/fakegpu: per-context
round-robin time-slicing of channel groups, 1024 µs timeslices as the
open driver's default, a 20 µs context switch; an H200 ran CUDA at 2048 µs
and switched in about 250 µs, e2e/realgpu) twice — without gpuarb (no daemon)
and with the daemon arbitrating on its eBPF probes alone: it steers the GPU's
scheduler (per-group timeslices, pauses) where the driver allows it, as the
simulated GPU does, and paces launches at the launch gate where not.
Shares are the simulator's ground truth (` + "`fakegpud stats`" + `) over 1 s windows
after the scenario settles, unless a section says otherwise; "unfairness" is
|a − b| / (a + b) of two tenants' shares in a window. Workloads are
` + "`gpuwork`" + ` (e2e/fakegpu/README.md): hog (8 × 20 ms kernels per batch,
double-buffered), infer (requests of 4 × 0.25 ms kernels + a sync), frames
(a render loop with a sync per frame), greedy (50 ms kernels, never syncs),
storm (tiny kernels as fast as it can).

`)
	return s.String()
}

// machine describes the host: CPU, cores, memory, kernel, Go.
func machine() string {
	cpu := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb uint64
		if _, err := fmt.Sscanf(string(data), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.0f GiB memory", float64(kb)/(1<<20))
		}
	}
	var uts unix.Utsname
	kernel := "unknown kernel"
	if unix.Uname(&uts) == nil {
		kernel = "Linux " + unix.ByteSliceToString(uts.Release[:])
	}
	virt := ""
	if out, err := exec.Command("systemd-detect-virt").Output(); err == nil && strings.TrimSpace(string(out)) != "none" {
		virt = ", virtualized (" + strings.TrimSpace(string(out)) + ")"
	}
	return fmt.Sprintf("%s, %d CPUs%s, %s%s, %s, no GPU (the simulated one)", cpu, runtime.NumCPU(), mem, kernel, virt, runtime.Version())
}
