package main

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/gpuarb/gpuarb/lab"
)

// fairCase is a two-tenant unfairness scenario.
type fairCase struct {
	name, short string
	gpuArgs     []string
	policy      string
	setup       func(*scene) error
}

var fairCases = []fairCase{
	{"4 processes vs 1, equal weights", "4 vs 1", nil, "", func(sc *scene) error {
		if _, err := sc.tenant("a", 4, "hog", "--duration", "60"); err != nil {
			return err
		}
		_, err := sc.tenant("b", 1, "hog", "--duration", "60")
		return err
	}},
	{"20 ms vs 2 ms kernels on a non-preemptive GPU, equal weights", "20 vs 2 ms", []string{"--no-preempt"},
		"gpus: [{index: 0, preemptive: false}]\n", func(sc *scene) error {
			if _, err := sc.tenant("a", 1, "hog", "--kernel-ms", "20", "--duration", "60"); err != nil {
				return err
			}
			time.Sleep(time.Second) // identifiable costs: meter.TestHogsOnEitherScheduler
			_, err := sc.tenant("b", 1, "hog", "--kernel-ms", "2", "--duration", "60")
			return err
		}},
}

// benchFairness: unfairness per 1 s window with and without gpuarb.
func benchFairness(ctx context.Context, b *bench) (string, error) {
	var s strings.Builder
	s.WriteString("Two tenants with equal weights: unfairness |a − b| / (a + b) of their true shares per 1 s window (0 is fair; the bar is a median ≤ 2%).\n\n")
	s.WriteString("| scenario | run | median | p95 | max | shares a / b (median) | GPU busy |\n|---|---|---|---|---|---|---|\n")
	var cats []string
	var med, p95, mx []float64
	for _, fc := range fairCases {
		var busy [2]float64
		for i, m := range modes {
			b.logf("%s, %s", fc.name, m.name)
			ss, bz, err := b.measured(ctx, "fair", m.mode, fc.gpuArgs, func(sc *scene) error {
				if err := sc.policy(ctx, fc.policy); err != nil {
					return err
				}
				return fc.setup(sc)
			})
			if err != nil {
				return "", err
			}
			busy[i] = bz
			u := lab.Series(ss, 0, func(s lab.Sample) float64 { return lab.Unfairness(s.True["a"], s.True["b"]) })
			a := lab.Median(lab.Series(ss, 0, func(s lab.Sample) float64 { return s.True["a"] }))
			bb := lab.Median(lab.Series(ss, 0, func(s lab.Sample) float64 { return s.True["b"] }))
			fmt.Fprintf(&s, "| %s | %s | %s | %s | %s | %s / %s | %s |\n", fc.name, m.name, pct(lab.Median(u)), pct(lab.Percentile(u, 95)),
				pct(lab.Max(u)), pct(a), pct(bb), pct(bz))
			cats = append(cats, fc.short+", "+strings.TrimSuffix(m.name, " gpuarb"))
			med, p95, mx = append(med, 100*lab.Median(u)), append(p95, 100*lab.Percentile(u, 95)), append(mx, 100*lab.Max(u))
		}
		b.busy = append(b.busy, busyFigure{fc.name, busy[0], busy[1]})
	}
	path, link := b.chart("fairness.png")
	if err := lab.BarChart(path, "Unfairness per 1 s window, without and with gpuarb", "unfairness (%)", 110, cats,
		[]lab.Bars{{Name: "median", Values: med}, {Name: "p95", Values: p95}, {Name: "max", Values: mx}}); err != nil {
		return "", err
	}
	fmt.Fprintf(&s, "\n![unfairness per window, without and with gpuarb](%s)\n\n", link)
	s.WriteString("The GPU time-slices per process, so a tenant with four processes takes four slices to the other's one; a GPU that runs kernels to completion gives a 20 ms kernel ten times a 2 ms one's time. On the preemptive GPU gpuarb gives the tenants' channel groups timeslices in proportion to their targets (the four processes' groups a quarter each of what the one gets); a non-preemptive GPU ignores timeslices, so there gpuarb paces the over-served tenant's launches at its target rate through the launch gate. The non-preemptive case is declared in the policy (`gpus: [{index: 0, preemptive: false}]`) so the meter models it, and the second tenant starts a second later: started together, the two would complete batches at the same rate under either hypothesis, and launch and sync timings could not tell their kernels' costs apart.\n")
	return s.String(), nil
}

// benchWeights: two hogs with weights 1:1, 1:3, 1:9.
func benchWeights(ctx context.Context, b *bench) (string, error) {
	var s strings.Builder
	s.WriteString("Two hogs (one process each) with weights 1:w; the unarbitrated GPU splits 50/50 whatever the weights. Shares are medians over 1 s windows.\n\n")
	s.WriteString("| weights | target a / b | unarbitrated a / b | with gpuarb a / b | \\|error\\| of a | GPU busy with gpuarb |\n|---|---|---|---|---|---|\n")
	var cats []string
	var target, without, with []float64
	for _, w := range []int{1, 3, 9} {
		var got [2][2]float64
		var busy [2]float64
		for i, m := range modes {
			b.logf("weights 1:%d, %s", w, m.name)
			var err error
			if got[i][0], got[i][1], busy[i], err = b.weightedPair(ctx, m.mode, "hog", 100, 100*w); err != nil {
				return "", err
			}
		}
		ta := 1 / float64(1+w)
		fmt.Fprintf(&s, "| 1:%d | %s / %s | %s / %s | %s / %s | %.1f pp | %s |\n", w, pct(ta), pct(1-ta), pct(got[0][0]), pct(got[0][1]),
			pct(got[1][0]), pct(got[1][1]), 100*abs(got[1][0]-ta), pct(busy[1]))
		cats = append(cats, fmt.Sprintf("1:%d", w))
		target, without, with = append(target, 100*ta), append(without, 100*got[0][0]), append(with, 100*got[1][0])
		b.busy = append(b.busy, busyFigure{fmt.Sprintf("two hogs, weights 1:%d", w), busy[0], busy[1]})
	}
	path, link := b.chart("weights.png")
	if err := lab.BarChart(path, "Share of the weight-1 tenant", "share of the GPU (%)", 75, cats,
		[]lab.Bars{{Name: "target", Values: target}, {Name: "without gpuarb", Values: without}, {Name: "with gpuarb", Values: with}}); err != nil {
		return "", err
	}
	fmt.Fprintf(&s, "\n![target and achieved shares of the weight-1 tenant](%s)\n", link)
	text, err := benchStackWeights(ctx, b)
	if err != nil {
		return "", err
	}
	return s.String() + text, nil
}

// stackWorkloads are gpuwork's workloads shaped like real stacks (entry
// points from cuGetProcAddress_v2, primary contexts, per-thread streams).
var stackWorkloads = []string{"train", "serve", "collective"}

// benchStackWeights: each workload shaped like a real stack at weight 300
// beside a hog at 100, its target the weighted share or what it takes
// alone if less.
func benchStackWeights(ctx context.Context, b *bench) (string, error) {
	var s strings.Builder
	s.WriteString("\nThe workloads shaped like real stacks (`gpuwork train`, `serve`, `collective`: entry points from `cuGetProcAddress_v2` with the per-thread flag, primary contexts, `cuLaunchKernelEx`, event polling, graph replays, stream memory operations; e2e/fakegpu/README.md) at weight 300 beside a hog at 100. A tenant's target is its weighted share, 75%, or what it takes alone if that is less.\n\n")
	s.WriteString("| tenant | alone | target | unarbitrated | with gpuarb | \\|error\\| | hog with gpuarb | GPU busy with gpuarb |\n|---|---|---|---|---|---|---|---|\n")
	for _, w := range stackWorkloads {
		b.logf("%s alone", w)
		alone, _, err := b.measured(ctx, "weights", noDaemon, nil, func(sc *scene) error {
			_, err := sc.tenant("a", 1, w, "--duration", "60")
			return err
		})
		if err != nil {
			return "", err
		}
		var got, hog, busy [2]float64
		for i, m := range modes {
			b.logf("%s beside a hog, weights 3:1, %s", w, m.name)
			if got[i], hog[i], busy[i], err = b.weightedPair(ctx, m.mode, w, 300, 100); err != nil {
				return "", err
			}
		}
		a := lab.Median(lab.Series(alone, 0, func(s lab.Sample) float64 { return s.True["a"] }))
		target := min(0.75, a)
		fmt.Fprintf(&s, "| %s | %s | %s | %s | %s | %.1f pp | %s | %s |\n", w, pct(a), pct(target), pct(got[0]), pct(got[1]),
			100*abs(got[1]-target), pct(hog[1]), pct(busy[1]))
	}
	return s.String(), nil
}

// weightedPair runs a tenant a of one process of workload beside a hog b,
// at weights wa:wb, and returns their median true shares and the GPU's
// median busy share.
func (b *bench) weightedPair(ctx context.Context, mode daemonMode, workload string, wa, wb int) (a, hog, busy float64, err error) {
	ss, busy, err := b.measured(ctx, "weights", mode, nil, func(sc *scene) error {
		if _, err := sc.tenant("a", 1, workload, "--duration", "60"); err != nil {
			return err
		}
		if _, err := sc.tenant("b", 1, "hog", "--duration", "60"); err != nil {
			return err
		}
		return sc.policy(ctx, fmt.Sprintf("tenants:\n  - {name: a, cgroup: %s, weight: %d}\n  - {name: b, cgroup: %s, weight: %d}\n",
			sc.cgroupOf("a"), wa, sc.cgroupOf("b"), wb))
	})
	if err != nil {
		return 0, 0, 0, err
	}
	share := func(t string) float64 {
		return lab.Median(lab.Series(ss, 0, func(s lab.Sample) float64 { return s.True[t] }))
	}
	return share("a"), share("b"), busy, nil
}

func abs(x float64) float64 { return max(x, -x) }

// latencyCase is one run of the inference service.
type latencyCase struct {
	name    string
	mode    daemonMode
	others  string // workload of the two other tenants ("": alone)
	sloP99  string // the inference tenant's SLO (latency priority), "": none
	comment string
}

var latencyCases = []latencyCase{
	{"alone", noDaemon, "", "", ""},
	{"beside two hogs, without gpuarb", noDaemon, "hog", "", ""},
	{"beside two hogs, with gpuarb (SLO p99 8 ms)", enforcing, "hog", "8", "the demo's setting"},
	{"beside two hogs, with gpuarb (SLO p99 3 ms)", enforcing, "hog", "3", "tighter than a timeslice allows at full load"},
	{"beside two greedy tenants, without gpuarb", noDaemon, "greedy", "", ""},
	{"beside two greedy tenants, with gpuarb (SLO p99 8 ms)", enforcing, "greedy", "8", "the GPU's scheduler steered"},
	{"beside two greedy tenants, with gpuarb at the launch gate alone (SLO p99 8 ms)", gating, "greedy", "8", "--gpu-scheduler off: work queued before any gate acts"},
}

// benchLatency: an inference service's latency alone, beside two hogs or
// two greedy tenants, without and with gpuarb.
func benchLatency(ctx context.Context, b *bench) (string, error) {
	var s strings.Builder
	s.WriteString("An inference service (`gpuwork infer --rate 200 --device-latency`: requests of 4 × 0.25 ms kernels and a sync, open loop, latency from the scheduled arrival), with priority latency and an SLO on its p99 sync wait when gpuarb runs. The others start 2 s before it is measured; p50 and p99 are over the whole measured run, the per-second p99 is the steady state. The SLO is on what the probes see, the wait in the sync call: a request that starts behind its schedule (the previous one still running) is longer than its sync, so request p99 can exceed an SLO that reads as held. *On the GPU* is the simulator's truth: each request's time from when the device saw it to its end (events around it, stamped in the device's virtual time), what a GPU scheduler can change; the request's wall clock adds the host's wake-ups and stalls, which on this 2-vCPU VM reach milliseconds even alone, and the probes' traps (about 20 µs a uprobe hit here).\n\n")
	s.WriteString("| case | p50 | p99 | p99 per second after 4 s (median) | on the GPU: p50 | on the GPU: p99 (× alone) | GPU busy | others' share |\n|---|---|---|---|---|---|---|---|\n")
	measure := 10 * time.Second
	if b.quick {
		measure = 4 * time.Second
	}
	busyOf := map[string]float64{}
	var aloneDevice float64
	ratio := map[string]float64{} // each case's p99 on the GPU over alone's
	for _, lc := range latencyCases {
		b.logf("inference %s", lc.name)
		sc, err := b.scene("latency", lc.mode)
		if err != nil {
			return "", err
		}
		row, bz, err := b.latencyRun(ctx, sc, lc, measure, &aloneDevice, ratio)
		sc.close()
		if err != nil {
			return "", err
		}
		busyOf[lc.name] = bz
		comment := ""
		if lc.comment != "" {
			comment = " (" + lc.comment + ")"
		}
		fmt.Fprintf(&s, "| %s%s | %s |\n", lc.name, comment, row)
	}
	b.busy = append(b.busy, busyFigure{"inference beside two hogs (SLO p99 8 ms)", busyOf[latencyCases[1].name], busyOf[latencyCases[2].name]})
	fmt.Fprintf(&s, "\nWhere the driver lets it (the simulated GPU does, as the nvidia driver does for root through the process's own control file), gpuarb steers the GPU's scheduler: the other tenants' channel groups get the GPU's shortest timeslice (100 µs at the simulator's default 20 µs switch; 1024 µs where a switch costs 256 µs, as on the real-GPU check's H200), so a request that arrives while their kernels run waits at most one short slice per other tenant instead of a 1 ms one (its time on the GPU: p99 %.2f× alone beside greedy tenants and %.2f× beside hogs in this run, against %.2f× and %.2f× without gpuarb), and batch tenants are paused while the SLO is missed. Greedy tenants queue 1024 kernels of 50 ms (51 s of GPU time) in their first milliseconds and never synchronize: at the launch gate alone (the last row) that work is on the GPU before any gate can act and cannot be recalled; the GPU's scheduler reaches it.\n",
		ratio[latencyCases[5].name], ratio[latencyCases[2].name], ratio[latencyCases[4].name], ratio[latencyCases[1].name])
	serve, err := b.benchServe(ctx, measure)
	if err != nil {
		return "", err
	}
	s.WriteString(serve)
	return s.String(), nil
}

// latencyRun runs one latency case in sc and returns its table cells. The
// first case (alone) sets *aloneDevice, its p99 on the GPU, which the
// others' are a multiple of (ratio, by case).
func (b *bench) latencyRun(ctx context.Context, sc *scene, lc latencyCase, measure time.Duration, aloneDevice *float64, ratio map[string]float64) (string, float64, error) {
	m, err := b.latencyTenant(ctx, sc, lc.others, lc.sloP99, measure,
		sc.gpu.Workload("infer", "--rate", "200", "--duration", fmt.Sprint(measure.Seconds()), "--interval", "1", "--device-latency"))
	if err != nil {
		return "", 0, err
	}
	device := m.res["device_latency_p99_ms"]
	if lc.others == "" {
		*aloneDevice = device
	}
	ratio[lc.name] = device / max(*aloneDevice, 1e-9)
	return fmt.Sprintf("%.2f ms | %.2f ms | %s | %.2f ms | %.2f ms (%.2f×) | %s | %s", m.res["latency_p50_ms"], m.res["latency_p99_ms"], m.steady(),
		m.res["device_latency_p50_ms"], device, ratio[lc.name], pct(m.busy), m.others), m.busy, nil
}

// latencyMeasure is what one run of a latency tenant measured: its
// workload's summary, its per-second p99s after 4 s, the
// GPU's busy time and the others' true share (medians over 1 s windows).
type latencyMeasure struct {
	res        map[string]float64
	steadyP99s []float64 // the per-second p99s after 4 s
	busy       float64
	others     string
}

// steady is the median of the per-second p99s after 4 s, "—" if none.
func (m latencyMeasure) steady() string {
	if len(m.steadyP99s) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f ms", lab.Median(m.steadyP99s))
}

// latencyTenant starts two tenants of the workload others ("": none) and
// after 2 s the latency tenant "infer" running cmd, with priority latency
// and an SLO of sloP99 ms on its p99 wait where sloP99 is set, and
// measures it to its end.
func (b *bench) latencyTenant(ctx context.Context, sc *scene, others, sloP99 string, measure time.Duration, cmd *exec.Cmd) (latencyMeasure, error) {
	var m latencyMeasure
	if others != "" {
		for _, t := range []string{"x", "y"} {
			if _, err := sc.tenant(t, 1, others, "--duration", fmt.Sprint((measure + 6*time.Second).Seconds())); err != nil {
				return m, err
			}
		}
		if err := sleep(ctx, 2*time.Second); err != nil {
			return m, err
		}
	}
	if _, err := sc.tenant("infer", 0); err != nil { // its cgroup, for the policy
		return m, err
	}
	if sloP99 != "" {
		if err := sc.policy(ctx, fmt.Sprintf("tenants:\n  - {name: infer, cgroup: %s, priority: latency, slo: {p99_sync_ms: %s}}\n",
			sc.cgroupOf("infer"), sloP99)); err != nil {
			return m, err
		}
	}
	sampler := &lab.Sampler{GPU: sc.gpu, Tenants: sc.tenants, Interval: time.Second}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	sampled := make(chan error, 1)
	go func() { sampled <- sampler.Run(sctx) }()
	p, err := lab.Start(cmd, sc.cgroup.Path+"/infer")
	if err != nil {
		return m, err
	}
	sc.Add(p.Stop)
	if m.res, err = finished(ctx, p, measure+30*time.Second); err != nil {
		return m, err
	}
	stop()
	if err := <-sampled; err != nil {
		return m, err
	}
	ss := sampler.Samples()
	m.busy = lab.Median(lab.Series(ss, 0, func(s lab.Sample) float64 { return s.Busy }))
	m.others = "—"
	if others != "" {
		m.others = pct(lab.Median(lab.Series(ss, 0, func(s lab.Sample) float64 { return s.True["x"] + s.True["y"] })))
	}
	m.steadyP99s = intervals(p, "latency_p99_ms", 4)
	return m, nil
}

// serveCases are the runs of the serving stack: alone, beside two hogs
// without gpuarb, and with it (priority latency, an SLO on its waits).
var serveCases = []latencyCase{
	{"alone", noDaemon, "", "", ""},
	{"beside two hogs, without gpuarb", noDaemon, "hog", "", ""},
	{"beside two hogs, with gpuarb (SLO p99 20 ms)", enforcing, "hog", "20", "the README's example"},
}

// benchServe: the serving stack's request latency alone and beside two
// hogs, without and with gpuarb.
func (b *bench) benchServe(ctx context.Context, measure time.Duration) (string, error) {
	var s strings.Builder
	s.WriteString("\nThe serving stack (`gpuwork serve`, shaped like an LLM server on the CUDA runtime: requests arrive at 10/s, each an eager prefill of 8 × 1.5 ms kernels and 16 decode steps, each a graph replay of 100 kernels of 5–60 µs, about 2 ms, and an event polled until it completes) with priority latency and an SLO on its p99 wait for the GPU when gpuarb runs; its waits are polling loops, which count as waits (`meter.ContextStats.SyncWait`). Latency is a request's, from its scheduled arrival to its last token; time to first token (TTFT) from its arrival to the first decode step's end.\n\n")
	s.WriteString("| case | p50 | p99 (× alone) | p99 per second after 4 s (median) | TTFT p99 | GPU busy | others' share |\n|---|---|---|---|---|---|---|\n")
	var alone, aloneSteady float64
	p50, p99s, steady := map[string]float64{}, map[string]float64{}, map[string]float64{}
	for _, lc := range serveCases {
		b.logf("serve %s", lc.name)
		sc, err := b.scene("serve", lc.mode)
		if err != nil {
			return "", err
		}
		m, err := b.latencyTenant(ctx, sc, lc.others, lc.sloP99, measure,
			sc.gpu.Workload("serve", "--duration", fmt.Sprint(measure.Seconds()), "--interval", "1"))
		sc.close()
		if err != nil {
			return "", err
		}
		p99 := m.res["latency_p99_ms"]
		if lc.others == "" {
			alone, aloneSteady = p99, lab.Median(m.steadyP99s)
		}
		p50[lc.name], p99s[lc.name], steady[lc.name] = m.res["latency_p50_ms"], p99, lab.Median(m.steadyP99s)
		comment := ""
		if lc.comment != "" {
			comment = " (" + lc.comment + ")"
		}
		fmt.Fprintf(&s, "| %s%s | %.2f ms | %.2f ms (%.2f×) | %s | %.2f ms | %s | %s |\n", lc.name, comment, m.res["latency_p50_ms"], p99,
			p99/max(alone, 1e-9), m.steady(), m.res["ttft_p99_ms"], pct(m.busy), m.others)
	}
	without, with := serveCases[1].name, serveCases[2].name
	fmt.Fprintf(&s, "\nWithout gpuarb each token's graph and each prefill kernel waits for the hogs' 20 ms kernels in 1 ms slices: a request outlasts the 100 ms between arrivals, and requests queue for the whole run (p50 %.2f s). With gpuarb the serving stack's turns come first and last its bursts: p50 %.2f× alone's, p99 over the whole run %.2f×, the per-second p99 after 4 s %.2f×.\n",
		p50[without]/1e3, p50[with]/max(p50[serveCases[0].name], 1e-9), p99s[with]/max(alone, 1e-9), steady[with]/max(aloneSteady, 1e-9))
	return s.String(), nil
}

// benchFrames: two frame loops with an FPS SLO beside a hog.
func benchFrames(ctx context.Context, b *bench) (string, error) {
	var s strings.Builder
	s.WriteString("Two render loops (`gpuwork frames --fps 60 --frame-ms 6`: 6 ms of GPU work per frame, 36% of the GPU each) beside a hog — the cloud-gaming case. With gpuarb both have priority latency and an SLO of 60 frames/s. FPS is the median of per-second counts after the first 4 s; frames over 34 and 60 ms are over the whole run.\n\n")
	s.WriteString("| run | FPS (loop 1, loop 2) | frames over 34 ms | over 60 ms | hog's share | GPU busy |\n|---|---|---|---|---|---|\n")
	d := 14.0
	if b.quick {
		d = 8
	}
	var busy [2]float64
	for i, m := range modes {
		b.logf("frames, %s", m.name)
		sc, err := b.scene("frames", m.mode)
		if err != nil {
			return "", err
		}
		row, bz, err := b.framesRun(ctx, sc, d)
		sc.close()
		if err != nil {
			return "", err
		}
		busy[i] = bz
		fmt.Fprintf(&s, "| %s | %s |\n", m.name, row)
	}
	b.busy = append(b.busy, busyFigure{"two frame loops beside a hog", busy[0], busy[1]})
	s.WriteString("\nThree render loops of 5, 8 and 10 ms of GPU work a frame (`gpuwork frames --fps 1000 --kernels 2`: as fast as they can), " +
		"vGASA's three-game case for its equal-FPS policy (a common 38 frames/s at about 90% of the GPU, in its paper). With gpuarb " +
		"the three are one `equal_fps` group at weight 100 each; at one rate the GPU's busy time allows 1000/23 frames/s per unit busy. " +
		"FPS is the median of per-second counts after the first 4 s.\n\n")
	s.WriteString("| run | FPS (5, 8, 10 ms) | fastest / slowest | GPU busy | the rate its busy time allows |\n|---|---|---|---|---|\n")
	for _, m := range modes {
		b.logf("equal frame rates, %s", m.name)
		sc, err := b.scene("equalfps", m.mode)
		if err != nil {
			return "", err
		}
		row, err := b.equalFramesRun(ctx, sc, d)
		sc.close()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&s, "| %s | %s |\n", m.name, row)
	}
	return s.String(), nil
}

// equalFramesRun runs three frame loops of different frame costs, in one
// equal-FPS group where a daemon arbitrates, and reports their frame
// rates and how busy the GPU was.
func (b *bench) equalFramesRun(ctx context.Context, sc *scene, d float64) (string, error) {
	costs := []float64{5, 8, 10}
	var loops []*lab.Proc
	pol := "tenants:\n"
	for _, ms := range costs {
		n := fmt.Sprintf("g%g", ms)
		ps, err := sc.tenant(n, 1, "frames", "--fps", "1000", "--frame-ms", fmt.Sprint(ms), "--kernels", "2",
			"--duration", fmt.Sprint(d), "--interval", "1")
		if err != nil {
			return "", err
		}
		loops = append(loops, ps[0])
		pol += fmt.Sprintf("  - {name: %s, cgroup: %s, weight: 100, equal_fps: games}\n", n, sc.cgroupOf(n))
	}
	if err := sc.policy(ctx, pol); err != nil {
		return "", err
	}
	ss, err := sc.sample(ctx, settle, time.Second, time.Duration(d-settle.Seconds()-1)*time.Second)
	if err != nil {
		return "", err
	}
	var fps []float64
	for _, p := range loops {
		if _, err := finished(ctx, p, 30*time.Second); err != nil {
			return "", err
		}
		fps = append(fps, lab.Median(intervals(p, "count", 4)))
	}
	busy := lab.Median(lab.Series(ss, 0, func(s lab.Sample) float64 { return s.Busy }))
	return fmt.Sprintf("%.0f, %.0f, %.0f | %.2f | %s | %.0f", fps[0], fps[1], fps[2], slices.Max(fps)/slices.Min(fps), pct(busy),
		busy*1000/23), nil
}

func (b *bench) framesRun(ctx context.Context, sc *scene, d float64) (string, float64, error) {
	if _, err := sc.tenant("hog", 1, "hog", "--duration", fmt.Sprint(d+2)); err != nil {
		return "", 0, err
	}
	var loops []*lab.Proc
	pol := "tenants:\n"
	for _, n := range []string{"f1", "f2"} {
		ps, err := sc.tenant(n, 1, "frames", "--fps", "60", "--frame-ms", "6", "--duration", fmt.Sprint(d), "--interval", "1")
		if err != nil {
			return "", 0, err
		}
		loops = append(loops, ps[0])
		pol += fmt.Sprintf("  - {name: %s, cgroup: %s, priority: latency, slo: {fps: 60}}\n", n, sc.cgroupOf(n))
	}
	if err := sc.policy(ctx, pol); err != nil {
		return "", 0, err
	}
	ss, err := sc.sample(ctx, settle, time.Second, time.Duration(d-settle.Seconds()-1)*time.Second)
	if err != nil {
		return "", 0, err
	}
	var fps []string
	var over34, over60 float64
	for _, p := range loops {
		res, err := finished(ctx, p, 30*time.Second)
		if err != nil {
			return "", 0, err
		}
		fps = append(fps, fmt.Sprintf("%.0f", lab.Median(intervals(p, "count", 4))))
		over34, over60 = max(over34, res["over_34ms"]), max(over60, res["over_60ms"])
	}
	busy := lab.Median(lab.Series(ss, 0, func(s lab.Sample) float64 { return s.Busy }))
	hog := lab.Median(lab.Series(ss, 0, func(s lab.Sample) float64 { return s.True["hog"] }))
	return fmt.Sprintf("%s | %s | %s | %s | %s", strings.Join(fps, ", "), pct(over34), pct(over60), pct(hog), pct(busy)), busy, nil
}
