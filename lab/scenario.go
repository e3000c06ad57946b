package lab

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Scenario is one sharing situation the scenario fuzzer draws: tenants of
// `gpuwork loop` processes with their own kernels, sync patterns, weights,
// limits, arrivals and departures, on one simulated GPU or two, with the
// daemon restarted once where Restart is set.
type Scenario struct {
	Seed     uint64
	Duration time.Duration
	Tenants  []ScenarioTenant
	// GPUs is how many GPUs the runs together have (0: one).
	GPUs int `json:",omitempty"`
	// Restart, when set, is when the daemon of the run with gpuarb is
	// stopped and started again (RestartKilled: killed, SIGKILL, rather
	// than stopped with SIGINT).
	Restart       time.Duration `json:",omitempty"`
	RestartKilled bool          `json:",omitempty"`
}

// ScenarioTenant is one tenant of a scenario.
type ScenarioTenant struct {
	Name   string
	Procs  int      // processes, each `gpuwork loop` with Args
	Args   []string // gpuwork loop flags (--threads, --spread and --gpu among them)
	Weight int
	Limit  float64 // 0: none
	// Priority is normal or batch (latency tenants have SLOs the
	// fuzzer's max-min targets do not model).
	Priority string
	Arrive   time.Duration // after the scenario starts
	Leave    time.Duration // 0: stays to the end
	// Refused: the driver refuses the controls made through its
	// processes' files (gpuwork GPUWORK_REOPEN_CTL=1), so it is held at the
	// launch gate however the others are.
	Refused bool `json:",omitempty"`
}

// gpuCount is how many GPUs the scenario's runs together have.
func (sc Scenario) gpuCount() int { return max(sc.GPUs, 1) }

// GPUsOf are the GPUs a tenant's processes use: its --gpu, and the next
// one too with --spread 2.
func (t ScenarioTenant) GPUsOf() []int {
	gpu, spread := 0, 1
	for i := 0; i+1 < len(t.Args); i++ {
		switch t.Args[i] {
		case "--gpu":
			gpu, _ = strconv.Atoi(t.Args[i+1])
		case "--spread":
			spread, _ = strconv.Atoi(t.Args[i+1])
		}
	}
	out := []int{gpu}
	for i := 1; i < spread; i++ {
		out = append(out, gpu+i)
	}
	return out
}

// SlotKey names a tenant's share of one GPU in samples and results: its
// name on GPU 0, name@N on GPU N.
func SlotKey(name string, gpu int) string {
	if gpu == 0 {
		return name
	}
	return fmt.Sprintf("%s@%d", name, gpu)
}

// DrawScenario draws the scenario of a seed: 2–6 tenants, each of 1–4
// processes on 1–4 streams, running 1–4 kernel functions of 20 µs to
// 50 ms (cycled, at random, or in phases), synchronizing every 1–200
// launches by stream, context, event or polling (or never), some with CPU
// think time, graphs, the runtime's entry points; weights 1–1000 (log
// uniform), limits on some, batch priority on some; some arrive late,
// some leave early. The same seed draws the same scenario.
func DrawScenario(seed uint64) Scenario {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	logUniform := func(lo, hi float64) float64 { return math.Exp(math.Log(lo) + r.Float64()*(math.Log(hi)-math.Log(lo))) }
	sc := Scenario{Seed: seed, Duration: 14 * time.Second}
	n := 2 + r.IntN(5)
	for i := range n {
		t := ScenarioTenant{Name: fmt.Sprintf("t%d", i), Procs: 1 + r.IntN(4)*r.IntN(2), Weight: int(math.Round(logUniform(1, 1000))),
			Priority: "normal"}
		var ms []string
		for range 1 + r.IntN(4) {
			ms = append(ms, strconv.FormatFloat(logUniform(0.02, 50), 'f', 3, 64))
		}
		t.Args = []string{"--kernels-ms", strings.Join(ms, ","), "--streams", strconv.Itoa(1 + r.IntN(4)*r.IntN(2))}
		switch p := r.Float64(); {
		case p < 0.25:
			t.Args = append(t.Args, "--mix", "random")
		case p < 0.5:
			t.Args = append(t.Args, "--mix", "phase", "--phase-s", strconv.FormatFloat(0.5+2.5*r.Float64(), 'f', 2, 64))
		}
		if r.Float64() < 0.1 {
			t.Args = append(t.Args, "--sync-every", "0")
		} else {
			t.Args = append(t.Args, "--sync-every", strconv.Itoa(int(math.Round(logUniform(1, 200)))),
				"--sync", []string{"stream", "stream", "ctx", "event", "poll"}[r.IntN(5)])
			if r.Float64() < 0.3 {
				t.Args = append(t.Args, "--think-ms", strconv.FormatFloat(0.5+19.5*r.Float64(), 'f', 2, 64))
			}
		}
		if r.Float64() < 0.15 {
			t.Args = append(t.Args, "--graph", strconv.Itoa(2+r.IntN(49)))
		}
		if r.Float64() < 0.3 {
			t.Args = append(t.Args, "--api", "runtime")
		}
		if r.Float64() < 0.15 {
			t.Limit = math.Round(100*(0.1+0.7*r.Float64())) / 100
		}
		if r.Float64() < 0.1 {
			t.Priority = "batch"
		}
		if i > 0 && r.Float64() < 0.4 {
			t.Arrive = time.Duration(500+r.IntN(2500)) * time.Millisecond
		}
		if i > 0 && r.Float64() < 0.2 {
			t.Leave = sc.Duration * 55 / 100
		}
		sc.Tenants = append(sc.Tenants, t)
	}
	return sc
}

// WithShapes adds to a drawn scenario the shapes beyond one context per
// process on one GPU, drawn from its seed apart from the rest (the same
// seed keeps its tenants, kernels and weights): contexts per process (1–4,
// a context per thread), a second GPU (some processes spanning both),
// steering refused for some tenants or all of them, and a daemon restart
// (stopped or killed) at a moment between 3 and 8 s, leaving a measured
// stretch after it.
func (sc Scenario) WithShapes() Scenario {
	r := rand.New(rand.NewPCG(sc.Seed, 0x5bd1e9955bd1e995))
	sc.Tenants = slices.Clone(sc.Tenants)
	if r.Float64() < 0.4 {
		sc.GPUs = 2
	}
	refuseAll, refuseSome := false, false
	switch p := r.Float64(); {
	case p < 0.15:
		refuseAll = true
	case p < 0.45:
		refuseSome = true
	}
	for i := range sc.Tenants {
		t := &sc.Tenants[i]
		t.Args = slices.Clone(t.Args)
		threads := 1
		if r.Float64() < 0.4 {
			threads = 2 + r.IntN(3)
		}
		if sc.GPUs == 2 {
			if r.Float64() < 0.4 {
				// Thread i on GPU i mod 2.
				threads = max(threads, 2)
				t.Args = append(t.Args, "--spread", "2")
			} else {
				t.Args = append(t.Args, "--gpu", strconv.Itoa(r.IntN(2)))
			}
		}
		if threads > 1 {
			t.Args = append(t.Args, "--threads", strconv.Itoa(threads))
		}
		t.Refused = refuseAll || refuseSome && r.Float64() < 0.4
	}
	if r.Float64() < 0.5 {
		sc.Restart = time.Duration(3000+r.IntN(5000)) * time.Millisecond
		sc.RestartKilled = r.Float64() < 0.5
	}
	return sc
}

// String is the scenario in a few lines, one per tenant.
func (sc Scenario) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d (%s", sc.Seed, sc.Duration)
	if sc.GPUs > 1 {
		fmt.Fprintf(&b, ", %d GPUs", sc.GPUs)
	}
	if sc.Restart > 0 {
		how := "stopped"
		if sc.RestartKilled {
			how = "killed"
		}
		fmt.Fprintf(&b, ", the daemon %s and restarted at %s", how, sc.Restart)
	}
	b.WriteString(")\n")
	for _, t := range sc.Tenants {
		fmt.Fprintf(&b, "  %s: %d× gpuwork loop %s; weight %d", t.Name, t.Procs, strings.Join(t.Args, " "), t.Weight)
		if t.Limit > 0 {
			fmt.Fprintf(&b, ", limit %.0f%%", 100*t.Limit)
		}
		if t.Priority != "normal" {
			fmt.Fprintf(&b, ", %s", t.Priority)
		}
		if t.Arrive > 0 {
			fmt.Fprintf(&b, ", arrives at %s", t.Arrive)
		}
		if t.Leave > 0 {
			fmt.Fprintf(&b, ", leaves at %s", t.Leave)
		}
		if t.Refused {
			b.WriteString(", steering refused")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Policy is the scenario's policy file for the daemon, its tenants by
// cgroup (as in /proc/PID/cgroup) under parent.
func (sc Scenario) Policy(parent string) string {
	var b strings.Builder
	b.WriteString("tenants:\n")
	for _, t := range sc.Tenants {
		fmt.Fprintf(&b, "  - {name: %s, cgroup: %s/%s, weight: %d, priority: %s", t.Name, parent, t.Name, t.Weight, t.Priority)
		if t.Limit > 0 {
			fmt.Fprintf(&b, ", limit: %g", t.Limit)
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// Segment is a stretch of a scenario in which the same tenants run.
type Segment struct {
	From, To time.Duration
	Tenants  []string
}

// settleAfterChange is how long after a tenant arrives or leaves a
// segment's measurement begins.
const settleAfterChange = 3 * time.Second

// Segments are the scenario's measured stretches: from settleAfterChange
// after the last arrival, departure or daemon restart to the next one (at
// least 2 s).
func (sc Scenario) Segments() []Segment {
	changes := []time.Duration{0, sc.Duration}
	if sc.Restart > 0 {
		changes = append(changes, sc.Restart)
	}
	for _, t := range sc.Tenants {
		changes = append(changes, t.Arrive)
		if t.Leave > 0 {
			changes = append(changes, t.Leave)
		}
	}
	slices.Sort(changes)
	changes = slices.Compact(changes)
	var out []Segment
	for i := 0; i+1 < len(changes); i++ {
		from, to := changes[i]+settleAfterChange, changes[i+1]
		if to-from < 2*time.Second {
			continue
		}
		seg := Segment{From: from, To: to}
		for _, t := range sc.Tenants {
			if t.Arrive <= changes[i] && (t.Leave == 0 || t.Leave >= to) {
				seg.Tenants = append(seg.Tenants, t.Name)
			}
		}
		out = append(out, seg)
	}
	return out
}

// Targets are the shares weighted max-min fairness gives the tenants
// present, each wanting at most its demand (its share measured alone) and
// its limit: water filling by weight.
func (sc Scenario) Targets(present []string, demand map[string]float64) map[string]float64 {
	type claim struct {
		name   string
		weight float64
		want   float64
	}
	var cs []claim
	for _, t := range sc.Tenants {
		if !slices.Contains(present, t.Name) {
			continue
		}
		want := demand[t.Name]
		if t.Limit > 0 {
			want = min(want, t.Limit)
		}
		cs = append(cs, claim{t.Name, float64(t.Weight), want})
	}
	target := map[string]float64{}
	left := 1.0
	open := cs
	for len(open) > 0 && left > 1e-9 {
		var w float64
		for _, c := range open {
			w += c.weight
		}
		var still []claim
		capped := false
		for _, c := range open {
			if c.want-target[c.name] <= left*c.weight/w {
				capped = true
				continue
			}
			still = append(still, c)
		}
		if !capped {
			for _, c := range open {
				target[c.name] += left * c.weight / w
			}
			break
		}
		for _, c := range open {
			if !slices.ContainsFunc(still, func(s claim) bool { return s.name == c.name }) {
				left -= c.want - target[c.name]
				target[c.name] = c.want
			}
		}
		open = still
	}
	return target
}

// tenant is the scenario's tenant of that name.
func (sc Scenario) tenant(name string) ScenarioTenant {
	for _, t := range sc.Tenants {
		if t.Name == name {
			return t
		}
	}
	return ScenarioTenant{Name: name}
}

// targetsPerGPU are Targets on each GPU apart, by SlotKey, over the
// tenants on it (onGPU) and their demands there (by SlotKey).
func (sc Scenario) targetsPerGPU(onGPU map[int][]string, demand map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for g, names := range onGPU {
		there := map[string]float64{}
		for _, name := range names {
			there[name] = demand[SlotKey(name, g)]
		}
		for name, tg := range sc.Targets(names, there) {
			out[SlotKey(name, g)] = tg
		}
	}
	return out
}

// TenantResult is how one tenant fared in one segment, on one GPU.
type TenantResult struct {
	Name string `json:"name"` // SlotKey: the tenant's name, name@N on GPU N
	// Medians over the segment's 1 s windows: the target (weighted
	// max-min over what each tenant took alone in that second), the true
	// share with gpuarb and without, and gpuarb's estimate.
	Target, True, Unarbitrated, Estimated float64
	// Err and UnarbitratedErr are the medians over the windows of
	// |true − target| with gpuarb and without.
	Err, UnarbitratedErr float64
	// Alone is the median of what the tenant took alone in the windows;
	// LatencyBound the median of Alone × the time the others' true
	// shares left free: what a closed loop gets when nothing fills its
	// idle gaps but itself (see HeldByLatency).
	Alone, LatencyBound float64
	// AloneUnprobed is, when the targets come from the tenant alone under
	// gpuarb's probes (RunOptions.ProbedDemand), the median of what it
	// took alone without them: the probes' cost is the difference.
	AloneUnprobed float64 `json:",omitempty"`
	// ErrUnprobed is then the median over the windows of |true − the
	// target set from the demands without the probes|: Err as a run
	// without --probed-demand scores it.
	ErrUnprobed float64 `json:",omitempty"`
}

// latencyMargin is how close to its latency bound a tenant short of its
// target must be to count as held there, and idleAlone how far below a
// whole GPU its share alone must be to be a loop that idles the GPU.
const (
	latencyMargin = 0.01
	idleAlone     = 0.95
)

// HeldByLatency tells whether a tenant short of its target by more than
// bar is a closed loop held at its latency bound: alone it idles the GPU
// between its bursts (a sync's round trip), beside others it reaches at
// least that rate in all the time they leave free. Its target, set from
// its share alone as if it could take that much of any time, then is out
// of reach while the others hold theirs: whenever another's work holds
// the GPU, the loop waits for the GPU's timeslice to end at every sync.
func (r TenantResult) HeldByLatency(bar float64) bool {
	return r.Target-r.True > bar && r.Alone < idleAlone && r.True >= r.LatencyBound-latencyMargin
}

// ProbedDemand tells whether the targets came from the tenants alone
// under gpuarb's probes (RunOptions.ProbedDemand).
func (r ScenarioResult) ProbedDemand() bool {
	for _, seg := range r.Segments {
		for _, t := range seg {
			if t.AloneUnprobed > 0 {
				return true
			}
		}
	}
	return false
}

// Error is the median |true − target| with gpuarb.
func (r TenantResult) Error() float64 { return r.Err }

// UnarbitratedError is the median |true − target| without gpuarb.
func (r TenantResult) UnarbitratedError() float64 { return r.UnarbitratedErr }

// MeterError is |estimated − true| with gpuarb (medians).
func (r TenantResult) MeterError() float64 { return math.Abs(r.Estimated - r.True) }

// ScenarioResult is how a scenario fared: per segment, per tenant.
type ScenarioResult struct {
	Scenario Scenario
	// Demand is each tenant's median share alone over its seconds.
	Demand   map[string]float64
	Segments [][]TenantResult
}

// MaxError is the largest |true − target| of any tenant in any segment,
// with gpuarb (arbitrated) or without.
func (r ScenarioResult) MaxError(arbitrated bool) float64 {
	if arbitrated {
		return r.maxOf(TenantResult.Error)
	}
	return r.maxOf(TenantResult.UnarbitratedError)
}

// MaxErrorUnprobed is MaxError with gpuarb against the targets set from
// the demands without the probes (0 without RunOptions.ProbedDemand).
func (r ScenarioResult) MaxErrorUnprobed() float64 {
	return r.maxOf(func(t TenantResult) float64 { return t.ErrUnprobed })
}

// maxOf is the largest f of any tenant in any segment.
func (r ScenarioResult) maxOf(f func(TenantResult) float64) float64 {
	var m float64
	for _, seg := range r.Segments {
		for _, t := range seg {
			m = max(m, f(t))
		}
	}
	return m
}

// LatencyHeld names the tenants beyond bar of their targets when every
// one of them is a closed loop held at its latency bound (HeldByLatency)
// and short of its target; nil when the scenario is within bar or any
// miss has another cause.
func (r ScenarioResult) LatencyHeld(bar float64) []string {
	var held []string
	for _, seg := range r.Segments {
		for _, t := range seg {
			switch {
			case t.Error() <= bar:
			case t.HeldByLatency(bar):
				if !slices.Contains(held, t.Name) {
					held = append(held, t.Name)
				}
			default:
				return nil
			}
		}
	}
	return held
}

// MaxMeterError is the largest |estimated − true| of any tenant.
func (r ScenarioResult) MaxMeterError() float64 { return r.maxOf(TenantResult.MeterError) }

// Evaluate turns the samples of the arbitrated and the unarbitrated runs
// into per-segment results: in each 1 s window, each tenant's target is
// the weighted max-min share over what every tenant present took alone in
// that second (alone: the runs of each tenant by itself on the same
// timeline).
func (sc Scenario) Evaluate(alone, arbitrated, unarbitrated, unprobed []Sample) ScenarioResult {
	res := ScenarioResult{Scenario: sc, Demand: map[string]float64{}}
	// Windows are matched by their second: the samplers' ticks drift a
	// little from run to run.
	second := func(d time.Duration) int { return int(math.Round(d.Seconds())) }
	demandAt := map[int]map[string]float64{}
	per := map[string][]float64{}
	for _, s := range alone {
		demandAt[second(s.At)] = s.True
		for name, v := range s.True {
			per[name] = append(per[name], v)
		}
	}
	for name, xs := range per {
		res.Demand[name] = Median(xs)
	}
	unprobedAt := map[int]map[string]float64{}
	for _, s := range unprobed {
		unprobedAt[second(s.At)] = s.True
	}
	unarbAt := map[int]Sample{}
	for _, u := range unarbitrated {
		unarbAt[second(u.At)] = u
	}
	for _, seg := range sc.Segments() {
		// Each tenant's share of each GPU it uses, the GPUs apart.
		onGPU := map[int][]string{}
		var slots []string
		for _, name := range seg.Tenants {
			for _, g := range sc.tenant(name).GPUsOf() {
				onGPU[g] = append(onGPU[g], name)
				slots = append(slots, SlotKey(name, g))
			}
		}
		// target, true, unarbitrated, estimated, err, unarbitrated err, alone, latency bound,
		// alone unprobed, err against the targets without the probes
		cols := map[string]*[10][]float64{}
		for _, slot := range slots {
			cols[slot] = &[10][]float64{}
		}
		for _, a := range arbitrated {
			if a.At <= seg.From || a.At > seg.To {
				continue
			}
			demand, ok := demandAt[second(a.At)]
			u, okU := unarbAt[second(a.At)]
			if !ok || !okU {
				continue
			}
			targets := sc.targetsPerGPU(onGPU, demand)
			unprobed, okP := unprobedAt[second(a.At)]
			var unprobedTargets map[string]float64
			if okP {
				unprobedTargets = sc.targetsPerGPU(onGPU, unprobed)
			}
			taken := map[int]float64{}
			for g, names := range onGPU {
				for _, name := range names {
					taken[g] += a.True[SlotKey(name, g)]
				}
			}
			for g, names := range onGPU {
				for _, name := range names {
					slot := SlotKey(name, g)
					c := cols[slot]
					tg := targets[slot]
					c[0] = append(c[0], tg)
					c[1] = append(c[1], a.True[slot])
					c[2] = append(c[2], u.True[slot])
					c[3] = append(c[3], a.Est[slot])
					c[4] = append(c[4], math.Abs(a.True[slot]-tg))
					c[5] = append(c[5], math.Abs(u.True[slot]-tg))
					c[6] = append(c[6], demand[slot])
					c[7] = append(c[7], demand[slot]*max(0, 1-(taken[g]-a.True[slot])))
					if okP {
						c[8] = append(c[8], unprobed[slot])
						c[9] = append(c[9], math.Abs(a.True[slot]-unprobedTargets[slot]))
					}
				}
			}
		}
		var rs []TenantResult
		for _, name := range slots {
			c := cols[name]
			rs = append(rs, TenantResult{Name: name, Target: Median(c[0]), True: Median(c[1]), Unarbitrated: Median(c[2]),
				Estimated: Median(c[3]), Err: Median(c[4]), UnarbitratedErr: Median(c[5]), Alone: Median(c[6]),
				LatencyBound: Median(c[7]), AloneUnprobed: Median(c[8]), ErrUnprobed: Median(c[9])})
		}
		res.Segments = append(res.Segments, rs)
	}
	return res
}
