package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/gpuarb/gpuarb/lab"
	ocihook "github.com/gpuarb/gpuarb/oci-hook"
)

// demoTimeline is when things happen in the demo, from the start of the
// containers.
type demoTimeline struct {
	enforce time.Duration // gpuarb starts arbitrating (before: the baseline)
	stopB   time.Duration // train-b finishes
	end     time.Duration
}

var (
	fullDemo  = demoTimeline{enforce: 10 * time.Second, stopB: 26 * time.Second, end: 34 * time.Second}
	quickDemo = demoTimeline{enforce: 5 * time.Second, stopB: 13 * time.Second, end: 16 * time.Second}
)

// inferSLOms is the inference service's SLO: p99 sync wait. At 200
// requests/s beside two training jobs it is missed unarbitrated (the GPU
// time-slices per process, and requests queue behind the jobs' slices);
// gpuarb holds it by slowing the jobs.
const inferSLOms = "8"

func demoCommand() *cli.Command {
	return &cli.Command{
		Name:  "demo",
		Usage: "three tenants in runc containers on the simulated GPU, with and without gpuarb",
		Description: `The demo starts the simulated GPU, the gpuarb daemon and three runc containers
that the OCI hook attaches with the policy of their annotations: a training
job (weight 100), a second one (weight 300) and an inference service with
an SLO (latency priority, p99 sync wait 8 ms). For the first seconds
gpuarb only watches (the unarbitrated baseline), then it arbitrates; the
second training job finishes before the end. gpuarb top is shown live
beside the simulator's ground truth. At the end a table gives, per tenant,
its target share, the share gpuarb measured and the true one, and the
inference service's p99 sync wait (the SLO's measure) and request
latency without and with gpuarb; a PNG chart of the shares over time is
written. Everything started is stopped and removed on exit or Ctrl-C.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "chart", Value: "gpuarb-demo.png", Usage: "write the chart of shares over time to `PATH`"},
			&cli.BoolFlag{Name: "simulated", Usage: "run on the simulated GPU even when the host has a real one"},
			&cli.BoolFlag{Name: "quick", Usage: "a 16 s run instead of 34 s"},
		},
		Action: func(c *cli.Context) error {
			if err := requireRoot(); err != nil {
				return err
			}
			if dev := realGPU(); dev != "" && !c.Bool("simulated") {
				fmt.Fprintf(c.App.Writer, `This host has a real GPU (%s). gpuarb runs on it as it is:
  sudo gpuarb daemon            # probes the nvidia driver and every libcuda in use
  gpuarb top                    # GPU time per tenant, live
  sudo gpuarb attach --cgroup /my/job --weight 300   # or the OCI hook: gpuarb hooks install
See README.md, "Using it". This demo uses the simulated GPU: run it with --simulated.
`, dev)
				return nil
			}
			bins, err := binDir(c)
			if err != nil {
				return err
			}
			tl := fullDemo
			if c.Bool("quick") {
				tl = quickDemo
			}
			return runDemo(c.Context, c.App.Writer, bins, c.String("chart"), tl)
		},
	}
}

// realGPU names a real GPU driver the host has loaded, or "".
func realGPU() string {
	data, err := os.ReadFile("/proc/devices")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && (f[1] == "nvidia" || f[1] == "nvidia-frontend") {
			return "the nvidia driver, /dev/nvidia*"
		}
	}
	return ""
}

// demoTenant is one of the demo's containers.
type demoTenant struct {
	name  string
	args  []string
	notes map[string]string
}

func runDemo(ctx context.Context, out io.Writer, bins, chart string, tl demoTimeline) error {
	fmt.Fprintln(out, "== starting the simulated GPU and the gpuarb daemon")
	sc, err := newScene(bins, "demo", enforcing)
	if err != nil {
		return err
	}
	defer sc.close()
	runc, err := lab.NewRunc(filepath.Join(sc.dir, "runc"))
	if err != nil {
		return err
	}
	// The operator's admission rule: the demo's containers may ask for
	// latency priority themselves (by default no workload may).
	demoPolicy := fmt.Sprintf("admission: [{cgroup_prefix: %s, max_weight: 1000, allow_latency: true}]\n", sc.cgroup.Rel)
	if err := sc.policy(ctx, demoPolicy); err != nil {
		return err
	}
	fmt.Fprintf(out, "== policy: %s", demoPolicy)
	hook := ocihook.HookCommand{Binary: filepath.Join(bins, "gpuarb"), Socket: sc.daemon.Socket}
	hooks := &specs.Hooks{Prestart: []specs.Hook{hook.Hook(ocihook.RegisterStage)}, Poststop: []specs.Hook{hook.Hook(ocihook.Poststop)}}
	secs := func(d time.Duration) string { return fmt.Sprintf("%.1f", d.Seconds()) }
	tenants := []demoTenant{
		{"infer", []string{"infer", "--rate", "200", "--duration", secs(tl.end), "--interval", "1"},
			map[string]string{ocihook.AnnotationPriority: "latency", ocihook.AnnotationSLOP99MS: inferSLOms}},
		{"train-a", []string{"hog", "--duration", secs(tl.end)}, map[string]string{ocihook.AnnotationWeight: "100"}},
		{"train-b", []string{"hog", "--duration", secs(tl.stopB)}, map[string]string{ocihook.AnnotationWeight: "300"}},
	}
	procs := map[string]*lab.Proc{}
	for _, t := range tenants {
		t.notes[ocihook.AnnotationName] = t.name
		id := "gpuarb-demo-" + t.name
		bundle, err := runc.Bundle(sc.dir, lab.ContainerSpec{ID: id, Args: append([]string{"/gpuarb-bin/gpuwork"}, t.args...),
			CgroupsPath: sc.cgroup.Rel + "/" + t.name, Annotations: t.notes, Hooks: hooks, GPU: sc.gpu, Bins: bins})
		if err != nil {
			return err
		}
		p, err := runc.Run(id, bundle)
		if err != nil {
			return err
		}
		sc.Add(func() { p.Stop(); runc.Delete(id) })
		procs[t.name] = p
		sc.tenants = append(sc.tenants, lab.Tenant{Name: t.name, Cgroup: sc.cgroup.Rel + "/" + t.name})
		fmt.Fprintf(out, "== container %s started (runc, attached by the OCI hook: %s)\n", id, annotationList(t.notes))
	}
	// Watch only until enforcement begins: the baseline. (Registering a
	// tenant resumes enforcement, so this waits for the hooks.)
	if err := waitRegistered(ctx, sc, tenants); err != nil {
		return err
	}
	if err := sc.daemon.ThawAll(ctx); err != nil {
		return fmt.Errorf("pause enforcement: %w", err)
	}
	start := time.Now()
	sampler := &lab.Sampler{GPU: sc.gpu, Daemon: sc.daemon, Tenants: sc.tenants, Interval: 500 * time.Millisecond}
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	sampled := make(chan error, 1)
	go func() { sampled <- sampler.Run(sctx) }()

	tty := isTTY(out)
	enforced := false
	for now := time.Since(start); now < tl.end; now = time.Since(start) {
		if !enforced && now >= tl.enforce {
			if err := sc.policy(ctx, demoPolicy); err != nil {
				return err
			}
			enforced = true
		}
		phase := "baseline: gpuarb watches, the GPU time-slices per process"
		switch {
		case now >= tl.stopB:
			phase = "gpuarb arbitrates; train-b has finished: train-a takes what infer leaves"
		case enforced:
			phase = "gpuarb arbitrates: weights 100:300, infer's SLO protected"
		}
		if err := demoFrame(ctx, out, bins, sc, sampler.Samples(), now, phase, tty); err != nil {
			return err
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
	stopSampling()
	if err := <-sampled; err != nil {
		return err
	}
	samples := sampler.Samples()
	stdout, _ := procs["infer"].Output()
	if err := demoReport(out, samples, stdout, tl); err != nil {
		return err
	}
	if err := demoChart(chart, samples, stdout, tl); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nchart of the shares over time: %s\n== stopping the containers, the daemon and the simulated GPU\n", chart)
	return nil
}

// waitRegistered waits until the hooks have registered every tenant.
func waitRegistered(ctx context.Context, sc *scene, tenants []demoTenant) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pol, err := sc.daemon.Policy(ctx)
		if err != nil {
			return err
		}
		missing := ""
		for _, t := range tenants {
			if !strings.Contains(string(pol), "name: "+t.name+"\n") {
				missing = t.name
			}
		}
		if missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the OCI hook did not register %s within 10 s", missing)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

func annotationList(notes map[string]string) string {
	var parts []string
	for _, k := range []string{ocihook.AnnotationName, ocihook.AnnotationWeight, ocihook.AnnotationPriority, ocihook.AnnotationSLOP99MS} {
		if v, ok := notes[k]; ok {
			parts = append(parts, k+"="+v)
		}
	}
	return strings.Join(parts, " ")
}

func isTTY(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// demoFrame prints `gpuarb top --once` under a banner, with the simulator's
// truth of the last sample.
func demoFrame(ctx context.Context, out io.Writer, bins string, sc *scene, samples []lab.Sample, now time.Duration, phase string, tty bool) error {
	top, err := exec.CommandContext(ctx, filepath.Join(bins, "gpuarb"), "top", "--once", "--socket", sc.daemon.Socket).CombinedOutput()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("gpuarb top: %w: %s", err, top)
	}
	var b bytes.Buffer
	if tty {
		b.WriteString("\x1b[H\x1b[2J")
	} else {
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "gpuarb demo  %4.0fs  %s\n\n", now.Seconds(), phase)
	b.Write(top)
	if n := len(samples); n > 0 {
		last := samples[n-1]
		b.WriteString("\nsimulator (ground truth, last 0.5 s):")
		for _, t := range sc.tenants {
			fmt.Fprintf(&b, "  %s %5.1f%%", t.Name, 100*last.True[t.Name])
		}
		fmt.Fprintf(&b, "  (GPU busy %.0f%%)\n", 100*last.Busy)
	}
	_, err = out.Write(b.Bytes())
	return err
}

// inferSeconds parses gpuwork infer's per-second lines: by the time of the
// line, the p99 of its sync waits (what the SLO is on) and of its requests
// (from their scheduled arrival: a request that starts late, behind a slow
// one or a host that did not run the service, counts its delay too).
func inferSeconds(stdout string) (at []time.Duration, sync, request []float64) {
	for _, line := range strings.Split(stdout, "\n") {
		var iv struct {
			T       float64 `json:"t"`
			Count   int     `json:"count"`
			Request float64 `json:"latency_p99_ms"`
			Sync    float64 `json:"sync_p99_ms"`
		}
		if json.Unmarshal([]byte(line), &iv) == nil && iv.Count > 0 {
			at = append(at, time.Duration(iv.T*float64(time.Second)))
			sync, request = append(sync, iv.Sync), append(request, iv.Request)
		}
	}
	return at, sync, request
}

// between keeps the values whose time is in [from, to).
func between(at []time.Duration, xs []float64, from, to time.Duration) []float64 {
	var out []float64
	for i, t := range at {
		if t >= from && t < to {
			out = append(out, xs[i])
		}
	}
	return out
}

// demoReport prints the table: per tenant the unarbitrated true share, the
// target, gpuarb's measure and the truth while all three run under gpuarb,
// and the inference service's p99 sync wait and request latency without
// and with gpuarb.
func demoReport(out io.Writer, samples []lab.Sample, inferOut string, tl demoTimeline) error {
	settle := 2 * time.Second
	base := func(s lab.Sample) bool { return s.At > settle && s.At <= tl.enforce }
	arb := func(s lab.Sample) bool { return s.At > tl.enforce+settle && s.At <= tl.stopB }
	pick := func(keep func(lab.Sample) bool, f func(lab.Sample) float64) float64 {
		var xs []float64
		for _, s := range samples {
			if keep(s) {
				xs = append(xs, f(s))
			}
		}
		return lab.Median(xs)
	}
	fmt.Fprintf(out, "\n== shares of the GPU (medians over 0.5 s samples): unarbitrated (%v–%v), then under gpuarb with all three running (%v–%v)\n\n",
		settle, tl.enforce, tl.enforce+settle, tl.stopB)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "tenant\tunarbitrated (true)\ttarget\tgpuarb measured\ttrue (simulator)\t")
	for _, name := range []string{"infer", "train-a", "train-b"} {
		fmt.Fprintf(w, "%s\t%.1f%%\t%.1f%%\t%.1f%%\t%.1f%%\t\n", name,
			100*pick(base, func(s lab.Sample) float64 { return s.True[name] }),
			100*pick(arb, func(s lab.Sample) float64 { return s.Target[name] }),
			100*pick(arb, func(s lab.Sample) float64 { return s.Est[name] }),
			100*pick(arb, func(s lab.Sample) float64 { return s.True[name] }))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	at, sync, request := inferSeconds(inferOut)
	without := func(xs []float64) float64 { return lab.Median(between(at, xs, settle, tl.enforce)) }
	with := func(xs []float64) float64 { return lab.Median(between(at, xs, tl.enforce+settle, tl.stopB)) }
	fmt.Fprintf(out, "\ninference p99 sync wait (median of per-second p99s): without gpuarb %.2f ms, with gpuarb %.2f ms (SLO %s ms)\n",
		without(sync), with(sync), inferSLOms)
	fmt.Fprintf(out, "inference p99 request latency, from the scheduled arrival: without gpuarb %.2f ms, with gpuarb %.2f ms\n",
		without(request), with(request))
	fmt.Fprintf(out, "GPU busy: without gpuarb %.1f%%, with gpuarb %.1f%%\n",
		100*pick(base, func(s lab.Sample) float64 { return s.Busy }), 100*pick(arb, func(s lab.Sample) float64 { return s.Busy }))
	return nil
}

// demoChart draws the true shares over time, with gpuarb's targets dashed.
// Under the title it says how the inference service's p99 sync wait did
// without and with gpuarb, and why, once train-b has ended, infer's target
// stands above its true share: its target is what it may take (its demand
// counts the time it waits in syncs), and train-a takes what it leaves.
func demoChart(path string, samples []lab.Sample, inferOut string, tl demoTimeline) error {
	var lines []lab.Line
	for i, name := range []string{"infer", "train-a", "train-b"} {
		var x, y, tx, ty []float64
		for _, s := range samples {
			x, y = append(x, s.At.Seconds()), append(y, 100*s.True[name])
			if t, ok := s.Target[name]; ok && s.At > tl.enforce && (name != "train-b" || s.At <= tl.stopB) {
				tx, ty = append(tx, s.At.Seconds()), append(ty, 100*t)
			}
		}
		lines = append(lines, lab.Line{Name: name + " (true)", X: x, Y: y, Color: i},
			lab.Line{Name: name + " target", X: tx, Y: ty, Dashed: true, Color: i})
	}
	title := fmt.Sprintf("gpuarb demo: unarbitrated until %.0f s, then arbitrated; train-b ends at %.0f s", tl.enforce.Seconds(), tl.stopB.Seconds())
	settle := 2 * time.Second
	at, sync, _ := inferSeconds(inferOut)
	title += fmt.Sprintf("\ninfer's p99 sync wait: %.1f ms without gpuarb, %.1f ms with (SLO %s ms)",
		lab.Median(between(at, sync, settle, tl.enforce)), lab.Median(between(at, sync, tl.enforce+settle, tl.stopB)), inferSLOms)
	var target, used []float64
	for _, s := range samples {
		if t, ok := s.Target["infer"]; ok && s.At > tl.stopB+time.Second {
			target, used = append(target, t), append(used, s.True["infer"])
		}
	}
	if len(target) > 0 && lab.Median(target) > lab.Median(used)+0.02 {
		title += fmt.Sprintf("\nafter train-b ends, infer uses %.0f%% of the %.0f%% it may take; train-a gets the rest",
			100*lab.Median(used), 100*lab.Median(target))
	}
	return lab.LineChart(path, title, "seconds", "share of the GPU (%)", 115, lines)
}
