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
// limits, arrivals and departures, on one simulated GPU.
type Scenario struct {
	Seed     uint64
	Duration time.Duration
	Tenants  []ScenarioTenant
}

// ScenarioTenant is one tenant of a scenario.
type ScenarioTenant struct {
	Name   string
	Procs  int      // processes, each `gpuwork loop` with Args
	Args   []string // gpuwork loop flags
	Weight int
	Limit  float64 // 0: none
	// Priority is normal or batch (latency tenants have SLOs the
	// fuzzer's max-min targets do not model).
	Priority string
	Arrive   time.Duration // after the scenario starts
	Leave    time.Duration // 0: stays to the end
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

// String is the scenario in a few lines, one per tenant.
func (sc Scenario) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d (%s)\n", sc.Seed, sc.Duration)
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
// after the last arrival or departure to the next one (at least 2 s).
func (sc Scenario) Segments() []Segment {
	changes := []time.Duration{0, sc.Duration}
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

// TenantResult is how one tenant fared in one segment.
type TenantResult struct {
	Name string `json:"name"`
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
		// target, true, unarbitrated, estimated, err, unarbitrated err, alone, latency bound,
		// alone unprobed, err against the targets without the probes
		cols := map[string]*[10][]float64{}
		for _, name := range seg.Tenants {
			cols[name] = &[10][]float64{}
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
			targets := sc.Targets(seg.Tenants, demand)
			unprobed, okP := unprobedAt[second(a.At)]
			var unprobedTargets map[string]float64
			if okP {
				unprobedTargets = sc.Targets(seg.Tenants, unprobed)
			}
			var taken float64
			for _, name := range seg.Tenants {
				taken += a.True[name]
			}
			for _, name := range seg.Tenants {
				c := cols[name]
				tg := targets[name]
				c[0] = append(c[0], tg)
				c[1] = append(c[1], a.True[name])
				c[2] = append(c[2], u.True[name])
				c[3] = append(c[3], a.Est[name])
				c[4] = append(c[4], math.Abs(a.True[name]-tg))
				c[5] = append(c[5], math.Abs(u.True[name]-tg))
				c[6] = append(c[6], demand[name])
				c[7] = append(c[7], demand[name]*max(0, 1-(taken-a.True[name])))
				if okP {
					c[8] = append(c[8], unprobed[name])
					c[9] = append(c[9], math.Abs(a.True[name]-unprobedTargets[name]))
				}
			}
		}
		var rs []TenantResult
		for _, name := range seg.Tenants {
			c := cols[name]
			rs = append(rs, TenantResult{Name: name, Target: Median(c[0]), True: Median(c[1]), Unarbitrated: Median(c[2]),
				Estimated: Median(c[3]), Err: Median(c[4]), UnarbitratedErr: Median(c[5]), Alone: Median(c[6]),
				LatencyBound: Median(c[7]), AloneUnprobed: Median(c[8]), ErrUnprobed: Median(c[9])})
		}
		res.Segments = append(res.Segments, rs)
	}
	return res
}
