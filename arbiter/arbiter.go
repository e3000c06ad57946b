package arbiter

import (
	"math"
	"sort"

	"github.com/gpuarb/gpuarb/policy"
)

// Params are the control loop's constants.
type Params struct {
	// MinDuty is the least fraction of a period a throttled tenant runs
	// (default 0.05): a tenant is slowed, never starved, so it still
	// drains its queue, answers health checks and shows demand.
	MinDuty float64
	// Increase is the additive step of a paced tenant's duty (default
	// 0.05): per period for one that wants no more than its target and
	// grows back (from MinDuty to 1 in 19 periods, about 2 s at 100 ms
	// periods); per settled window, spread over its Settle periods, for one
	// below its target by its settled share or recovering from a missed
	// latency SLO, since that share lags the duty by the window.
	Increase float64
	// Decrease is the multiplicative step of a paced tenant's duty
	// (default 0.8): at most ×Decrease per settled window, spread over its
	// Settle periods, for one above its target by its settled share; ×Decrease
	// per period for every other tenant while a latency SLO is missed.
	Decrease float64
	// Tolerance is the dead band around a target in which the duty is
	// left alone (default 0.01), so measurement noise does not make it
	// oscillate.
	Tolerance float64
	// Settle is how many periods a paced tenant's queue must have stayed
	// drained before its settled share is trusted to correct its rate
	// (default 10: the daemon's 1 s window at 100 ms periods); until then
	// that share still shows work admitted before.
	Settle int
	// React is how many periods the control window (Input.Share) spans
	// (default 3): the scheduler mode's corrections by that share are
	// spread over it.
	React int
}

// DefaultParams are the defaults documented on Params.
func DefaultParams() Params {
	return Params{MinDuty: 0.05, Increase: 0.05, Decrease: 0.8, Tolerance: 0.01, Settle: 10, React: 3}
}

// Input is what the arbiter knows of one tenant on one GPU in a period.
type Input struct {
	Name  string
	GPU   int
	Rules policy.Rules
	// Share is the measured fraction of the GPU over the control window,
	// SettledShare over the meter's longer window: the short one reacts,
	// the long one steers a paced tenant's rate without chasing the
	// granularity of its kernels.
	Share, SettledShare float64
	// Busy tells whether the tenant has work outstanding or launched some
	// in the control window.
	Busy bool
	// Backlogged tells whether it had work queued or running nearly all
	// the window: it would take more of the GPU if it could.
	Backlogged bool
	// Held tells whether its launch gate held one of its processes in the
	// control window: it reached its rate.
	Held bool
	// Queued is the GPU work it has queued now, as a fraction of the
	// control window: while that is more than its target, its share still
	// shows work admitted before, not its rate.
	Queued float64
	// Contexts is how many CUDA contexts its processes have on the GPU,
	// and LaunchNS the GPU time of one of its launches: the GPU
	// time-slices per context (each its own channel group) and, if it
	// does not preempt, runs each kernel to its end, so the unpaced tenant
	// is best the one with the fewest and the shortest.
	Contexts int
	LaunchNS float64
	// Costed tells whether the meter has learned what its launches cost.
	// Pacing needs that: a tenant is not paced on a guess.
	Costed bool
	// Demand is what it would take of the GPU alone, 0..1, from the
	// evidence of its waits and its idle time (control's demand model).
	Demand float64
	// Waited is the part of the control window its work waited while
	// another context held the GPU (summed over its processes): a tenant
	// below its target that waits no more than Tolerance is held back by
	// its own pace — its host time between bursts — not by the others,
	// and pausing them would only leave the GPU idle.
	Waited float64
	// Groups is how many channel groups it has on the GPU (scheduler
	// mode; 0 counts as one), BurstNS the GPU time one of them brings to a
	// turn on the GPU before its work runs out (0: it never ran out in the
	// control window, it fills any timeslice).
	Groups  int
	BurstNS float64
	// Unsteered is set, on a GPU in scheduler mode, for a tenant whose
	// channel groups gpuarb does not know (set up before the daemon
	// started, or not through the probed driver): the GPU's scheduler
	// cannot reach it, so it is paced at the launch gate while the others
	// are steered.
	Unsteered bool
	// Unprobed is set for a tenant with processes whose launches no probe
	// sees (a driver of their own): its share is the meter's assumption
	// that they are busy whenever they may run, and a rate cannot pace
	// launches nobody sees, so it is held by freezing part of each period
	// and never takes the slack.
	Unprobed bool
	// SyncP99MS and FPS are the measured SLO figures (0: none seen).
	SyncP99MS float64
	FPS       float64

	// frameWeight is the weight equalFrames gives an equal-FPS group's
	// tenant in place of its own (0: its own).
	frameWeight float64
}

// weightOf is a tenant's weight in the water filling and the windows.
func weightOf(t Input) float64 {
	if t.frameWeight > 0 {
		return t.frameWeight
	}
	return float64(t.Rules.Weight)
}

// equalFrames shares each equal-FPS group's weight (its rendering
// tenants' weights, summed) among those tenants in proportion to the GPU
// time a frame of each costs (its settled share over its frames a second),
// so that targets in proportion to the weights hold one frame rate: the
// highest the group's share of the GPU allows. A tenant not rendering (no
// frame, or no GPU time, in the settled window) keeps its own weight, as
// does a group of one. Work conserving as the rest: a tenant that cannot
// render faster leaves what it does not use to the others, whose frame
// rates then rise above its.
func equalFrames(ts []Input) {
	type group struct {
		weight, cost float64
		members      []int
	}
	groups := map[string]*group{}
	for i, t := range ts {
		if t.Rules.EqualFPS == "" || !t.Busy || t.FPS <= 0 || t.SettledShare <= 0 {
			continue
		}
		g := groups[t.Rules.EqualFPS]
		if g == nil {
			g = &group{}
			groups[t.Rules.EqualFPS] = g
		}
		g.weight += float64(t.Rules.Weight)
		g.cost += t.SettledShare / t.FPS
		g.members = append(g.members, i)
	}
	for _, g := range groups {
		if len(g.members) < 2 {
			continue
		}
		for _, i := range g.members {
			ts[i].frameWeight = g.weight * ts[i].SettledShare / ts[i].FPS / g.cost
		}
	}
}

// Decision is the arbiter's verdict for one tenant on one GPU.
type Decision struct {
	Name string
	GPU  int
	// Target is the share the policy entitles the tenant to now.
	Target float64
	// Duty is, when Paced, the fraction of the GPU's time the tenant may
	// submit (its submissions are paced to it); otherwise the fraction of
	// each period the tenant may run, starting at Offset (a fraction of
	// the period), frozen for the rest.
	Duty, Offset float64
	// Paced is set in share mode: the duty is a submission rate.
	Paced bool
	// Scheduled is set when the GPU's own scheduler carries the decision:
	// the tenant's channel groups take Weight of the GPU's rotation
	// between them (their timeslices), and stay on the GPU Duty of each
	// period (paused for the rest, from Offset).
	Scheduled bool
	Weight    float64
	// Timeslice is each of its channel groups' timeslice (scheduler mode);
	// 0 leaves them as they are (a tenant without work takes no turn).
	Timeslice Nanoseconds
	// SLOMissed is set on latency tenants whose SLO is not held.
	SLOMissed bool
	// Reason explains the duty in a few words.
	Reason string
}

type key struct {
	name string
	gpu  int
}

// Arbiter keeps the duty cycles between periods. It is not safe for
// concurrent use.
type Arbiter struct {
	p    Params
	duty map[key]float64
	// schedStates are the scheduler mode's tenants.
	schedStates map[key]*schedState
	// slices are the GPUs' timeslice bounds SetSlices named.
	slices map[int]Slices
	// settled counts the periods a paced tenant's queue has stayed
	// drained; it is steady at Settle. A queue before then is work from
	// before it was paced (or costs learned since), drained first.
	settled map[key]int
	// pressed marks tenants a latency SLO pushed down: they recover
	// additively, the others at once.
	pressed map[key]bool
	// taker is the last period's slack taker (zero: none).
	taker key
}

// New returns an arbiter.
func New(p Params) *Arbiter {
	d := DefaultParams()
	if p.MinDuty <= 0 {
		p.MinDuty = d.MinDuty
	}
	if p.Increase <= 0 {
		p.Increase = d.Increase
	}
	if p.Decrease <= 0 || p.Decrease >= 1 {
		p.Decrease = d.Decrease
	}
	if p.Tolerance <= 0 {
		p.Tolerance = d.Tolerance
	}
	if p.Settle <= 0 {
		p.Settle = d.Settle
	}
	if p.React <= 0 {
		p.React = d.React
	}
	return &Arbiter{p: p, duty: map[key]float64{}, settled: map[key]int{}, pressed: map[key]bool{},
		schedStates: map[key]*schedState{}, slices: map[int]Slices{}}
}

// SetWindows sets Params.React and Params.Settle: the periods the control
// window and the meter's settled window span.
func (a *Arbiter) SetWindows(react, settle int) {
	if react > 0 {
		a.p.React = react
	}
	if settle > 0 {
		a.p.Settle = settle
	}
}

// Actuation is how a GPU's tenants are held to their shares.
type Actuation int

const (
	// Pacing admits each tenant's launches at its rate (the launch gate,
	// or freezing while its account is in debt): share mode where the
	// GPU's scheduler cannot be steered.
	Pacing Actuation = iota
	// Windows gives tenants exclusive slots by freezing (timeslice mode).
	Windows
	// Scheduler steers the GPU's own scheduler: timeslices and pauses of
	// the tenants' channel groups (share mode where the driver allows it).
	Scheduler
)

// Step runs one control period over every tenant of every GPU. actuation
// gives each GPU's. Decisions come per GPU, by tenant name.
func (a *Arbiter) Step(in []Input, actuation func(gpu int) Actuation) []Decision {
	byGPU := map[int][]Input{}
	for _, t := range in {
		byGPU[t.GPU] = append(byGPU[t.GPU], t)
	}
	gpus := make([]int, 0, len(byGPU))
	for g := range byGPU {
		gpus = append(gpus, g)
	}
	sort.Ints(gpus)
	var out []Decision
	seen := map[key]bool{}
	for _, g := range gpus {
		ts := byGPU[g] // a copy: the caller's slice keeps its order
		sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
		equalFrames(ts)
		var ds []Decision
		switch actuation(g) {
		case Windows:
			ds = a.timeslice(ts)
		case Scheduler:
			ds = a.schedule(ts)
		default:
			ds = a.share(ts)
		}
		for _, d := range ds {
			seen[key{d.Name, d.GPU}] = true
		}
		out = append(out, ds...)
	}
	for k := range a.duty {
		if !seen[k] {
			delete(a.duty, k)
			delete(a.settled, k)
			delete(a.pressed, k)
		}
	}
	for k := range a.schedStates {
		if !seen[k] {
			delete(a.schedStates, k)
		}
	}
	return out
}

// Targets computes weighted max-min fair shares with limits among the
// tenants with work (water filling). A backlogged tenant, or a paced one
// its rate holds back, wants the whole GPU; a latency tenant what it uses
// now plus 20% and 2 pp (to keep its SLO); any other what it would take
// alone (its Demand, at least what it used over the settled window) and a
// little headroom (lightHeadroom each, at most totalHeadroom among them
// all). A tenant that needs little
// leaves the rest to the others (work conservation); one that comes to
// need more is backlogged, and wants the GPU.
func Targets(ts []Input, duty func(Input) float64) []float64 {
	target := make([]float64, len(ts))
	demand := make([]float64, len(ts))
	h := headroom(ts, duty)
	for i, t := range ts {
		demand[i] = demandOf(t, duty(t), h)
	}
	return fill(ts, demand, target)
}

// demandOf is what a tenant would take, its limit applied.
func demandOf(t Input, duty, headroom float64) float64 {
	d := wants(t, duty, headroom)
	if t.Rules.Limit > 0 {
		d = math.Min(d, float64(t.Rules.Limit))
	}
	return d
}

// A latency tenant wants latencyGrowth times its share over the control
// window plus latencyHeadroom (a share of the GPU): its load is requests,
// which can grow within a window before the targets follow, and one that
// used little still needs room to start. Its target only sets time aside
// for it, since it is never throttled; the others give up what it does
// not use while they are not held to their targets.
const (
	latencyGrowth   = 1.2
	latencyHeadroom = 0.02
)

// wants is what a tenant would take without its limit.
func wants(t Input, duty, headroom float64) float64 {
	d := 1.0
	switch {
	case !t.Busy:
		d = 0
	case t.Rules.Priority == policy.Latency:
		d = math.Min(1, t.Share*latencyGrowth+latencyHeadroom)
	case light(t, duty):
		// What it would take alone (its waits and idle time say: slowed by
		// the others' work it waits longer, and waiting is wanting), at
		// least what it used over the settled window (its exited
		// processes' share), and a little headroom; not what a short
		// window shows (a tenant of short bursts uses much of a control
		// window now and then, little on the whole, and many such would
		// claim the GPU between them). One that grows to need more is
		// backlogged at once.
		d = math.Min(1, math.Max(t.Demand, t.SettledShare)+headroom)
	}
	return d
}

// rateBound is the part of its rate a paced tenant must use or queue to
// count as held back by that rate: one held by it uses all of it, and
// half leaves a wide margin for what one window catches of its bursts;
// one that uses less wants less than its rate.
const rateBound = 0.5

// limitedByRate tells whether a paced tenant's rate holds it back: its
// gate held it, or it has work waiting, or it uses half its rate or more.
// One that does not (paced once, idle since) wants what it uses: it is
// not competing, and is let grow back to running freely.
func limitedByRate(t Input, duty float64) bool {
	return t.Held || t.Backlogged || t.Share >= duty*rateBound || t.Queued >= duty*rateBound
}

// light tells whether a tenant with work needs less than the GPU: it is
// neither backlogged nor held back by its rate.
func light(t Input, duty float64) bool {
	return t.Rules.Priority != policy.Latency && (duty >= 1 && !t.Backlogged || duty < 1 && !limitedByRate(t, duty))
}

// lightHeadroom is the share a light tenant is granted beyond what it
// would take alone, and totalHeadroom what all of a GPU's light tenants
// are granted at most (each less, when there are more than ten). A light
// tenant runs freely whatever its target, so headroom only sets aside
// time the others' targets leave out: kept small, or a host of light
// tenants would hand most of the GPU to the slack taker alone — and the
// others, held to their targets, leave what it does not use idle. A light
// tenant wants its settled share and no more: any margin above it reads
// the tenant as deprived by that margin, and pauses the backlogged ones
// for time the GPU then idles.
const (
	lightHeadroom = 0.002
	totalHeadroom = 0.02
)

// headroom is each light tenant's headroom among ts.
func headroom(ts []Input, duty func(Input) float64) float64 {
	n := 0
	for _, t := range ts {
		if t.Busy && light(t, duty(t)) {
			n++
		}
	}
	return math.Min(lightHeadroom, totalHeadroom/float64(max(n, 1)))
}

// fill is the water filling of Targets.
func fill(ts []Input, demand, target []float64) []float64 {
	left := 1.0
	open := map[int]bool{}
	for i := range ts {
		if demand[i] > 0 {
			open[i] = true
		}
	}
	for len(open) > 0 && left > 1e-9 {
		var w float64
		for i := range open {
			w += weightOf(ts[i])
		}
		capped := false
		for i := range open {
			fair := left * weightOf(ts[i]) / w
			if demand[i]-target[i] <= fair {
				left -= demand[i] - target[i]
				target[i] = demand[i]
				delete(open, i)
				capped = true
			}
		}
		if capped {
			continue
		}
		for i := range open {
			target[i] += left * weightOf(ts[i]) / w
		}
		break
	}
	return target
}

// minDutyOfTarget is the least part of its target a paced tenant's duty
// falls to while its settled share reads above target: a paced tenant's
// rate is its share, so one that still reads above its target with its
// duty at half of it is running work admitted before (its queue), not its
// rate, and a lower duty would starve it once that work is gone.
const minDutyOfTarget = 0.5

// staggerStep is the part of a period by which each paced tenant's
// running window starts after the one before (modulo the period): close
// to the golden ratio's 0.382, so that the windows of any number of
// tenants spread over the period (0, 0.37, 0.74, 0.11, 0.48, …) and do not
// stall and resume together.
const staggerStep = 0.37

func (a *Arbiter) share(ts []Input) []Decision {
	dutyOf := func(t Input) float64 { return a.dutyOf(key{t.Name, t.GPU}) }
	targets := Targets(ts, dutyOf)
	missed := false
	busy := 0
	for _, t := range ts {
		if t.Busy {
			busy++
		}
		if t.Rules.Priority == policy.Latency && t.Busy && sloMissed(t) {
			missed = true
		}
	}
	h := headroom(ts, dutyOf)
	free := a.slackTaker(ts, targets, dutyOf, h)
	if free >= 0 && a.crowdedOut(ts, targets, free) {
		free = -1
	}
	a.taker = key{}
	if free >= 0 {
		a.taker = key{ts[free].Name, ts[free].GPU}
	}
	out := make([]Decision, len(ts))
	stagger := 0
	for i, t := range ts {
		k := key{t.Name, t.GPU}
		d := a.dutyOf(k)
		target := targets[i]
		dec := Decision{Name: t.Name, GPU: t.GPU, Target: target, Paced: true}
		competing := wants(t, d, h) > target+a.p.Tolerance
		switch {
		case t.Rules.Priority == policy.Latency:
			d, dec.Reason = 1, "latency tenant: never throttled"
			dec.SLOMissed = t.Busy && sloMissed(t)
		case !t.Busy:
			d, dec.Reason = 1, "idle"
		case missed:
			// From what it uses, not from a rate it does not reach.
			d, dec.Reason = math.Min(d, math.Max(t.Share, a.p.MinDuty))*a.p.Decrease, "a latency SLO is missed"
			a.pressed[k] = true
		case busy == 1 && t.Rules.Limit == 0:
			d, dec.Reason = 1, "alone on the GPU"
		case i == free && a.pressed[k]:
			d, dec.Reason = d+a.p.Increase/float64(a.p.Settle), "recovering" // from SLO pressure
		case i == free:
			d, dec.Reason = 1, "takes the slack"
		case !competing:
			// It wants no more than its target: let it grow back.
			d, dec.Reason = d+a.p.Increase, "below target"
		case (d >= 1 || a.settled[k] < a.p.Settle) && t.Queued > target:
			// It has work queued from before it was paced, which the GPU
			// serves at its round-robin share: admit nothing new until
			// that is gone.
			d, dec.Reason = a.p.MinDuty, "draining its queue"
			a.settled[k] = 0
		case d >= 1:
			// The rate of an admission-paced tenant is its long-run share:
			// start at the target.
			d, dec.Reason = target, "paced at target"
			a.settled[k] = 1
		case a.settled[k] < a.p.Settle && d <= a.p.MinDuty && target > a.p.MinDuty:
			// Drained (it ran at MinDuty): resume at the target.
			d, dec.Reason = target, "paced at target"
			a.settled[k]++
		case a.settled[k] < a.p.Settle && d < target && a.pressed[k]:
			// Pushed below its target by a latency SLO: recover additively,
			// by Increase per settled window, the span the SLO is measured
			// over (faster, it would miss the SLO again before it shows).
			d, dec.Reason = math.Min(target, d+a.p.Increase/float64(a.p.Settle)), "recovering"
		case a.settled[k] < a.p.Settle:
			// Drained, but the settled window still holds the drain: run
			// at the target until it shows the rate.
			d, dec.Reason = target, "settling"
			a.settled[k]++
		case t.SettledShare > target+a.p.Tolerance:
			// The settled share lags the rate by its window: a correction
			// is spread over the Settle periods it spans, or the loop
			// would overshoot and oscillate.
			step := math.Pow(math.Max(a.p.Decrease, target/t.SettledShare), 1/float64(a.p.Settle))
			d, dec.Reason = math.Max(d*step, target*minDutyOfTarget), "above target"
		case t.SettledShare < target-a.p.Tolerance:
			d, dec.Reason = d+math.Min(a.p.Increase, target-t.SettledShare)/float64(a.p.Settle), "below target"
		default:
			dec.Reason = "on target"
		}
		d = math.Max(a.p.MinDuty, math.Min(1, d))
		if !missed && (d >= 1 || d >= target) {
			delete(a.pressed, k) // recovered
		}
		a.duty[k] = d
		dec.Duty = d
		if d < 1 {
			// Stagger the running windows so throttled tenants do not
			// stall (and resume) together.
			dec.Offset = math.Mod(float64(stagger)*staggerStep, 1)
			stagger++
		}
		out[i] = dec
	}
	return out
}

// crowdedOut tells whether a steady paced tenant's admitted work piles up
// unserved (more than its target's worth of the window queued): the
// unpaced tenant takes its time — the GPU time-slices per process — so it
// must be paced too.
func (a *Arbiter) crowdedOut(ts []Input, targets []float64, free int) bool {
	for j, t := range ts {
		k := key{t.Name, t.GPU}
		if d := a.dutyOf(k); j != free && t.Busy && d < 1 && a.settled[k] >= a.p.Settle && t.Queued > targets[j] {
			return true
		}
	}
	return false
}

// slackTaker picks, among the tenants that want more than their target,
// the one left unpaced so that the GPU time others leave unused goes to
// it (work conservation): one whose costs are not learned yet (it cannot
// be paced), then the largest target, then the fewest contexts and the
// shortest launches (one with many contexts, or long kernels on
// a GPU that does not preempt, would crowd the paced ones out), then the
// name. The last period's taker stays while it competes and no other is
// uncosted where it is costed, has a target larger by Tolerance or fewer
// contexts: a choice that flips between equals on noise (launch costs)
// re-paces both every period, and neither gets its share; a count of
// contexts is no noise, and a taker of more contexts than a paced tenant
// takes that many turns of the GPU's round robin to its one. -1 when none competes; a
// tenant with a limit is never unpaced.
func (a *Arbiter) slackTaker(ts []Input, targets []float64, duty func(Input) float64, headroom float64) int {
	best, last := -1, -1
	for i, t := range ts {
		if !t.Busy || t.Unprobed || t.Rules.Priority == policy.Latency || t.Rules.Limit > 0 || demandOf(t, duty(t), headroom) <= targets[i] {
			continue
		}
		if (key{t.Name, t.GPU}) == a.taker {
			last = i
		}
		if best < 0 || (!t.Costed && ts[best].Costed) {
			best = i
			continue
		}
		if t.Costed != ts[best].Costed {
			continue
		}
		if targets[i] > targets[best]+1e-9 {
			best = i
			continue
		}
		if b := ts[best]; math.Abs(targets[i]-targets[best]) <= 1e-9 &&
			(t.Contexts < b.Contexts || (t.Contexts == b.Contexts && t.LaunchNS < b.LaunchNS)) {
			best = i
		}
	}
	if last >= 0 && best != last {
		l, b := ts[last], ts[best]
		if l.Costed == b.Costed && targets[best] <= targets[last]+a.p.Tolerance && l.Contexts <= b.Contexts {
			return last
		}
	}
	return best
}

// timeslice gives the tenants with work exclusive consecutive slots sized
// by weight; idle tenants are left running (they submit nothing).
func (a *Arbiter) timeslice(ts []Input) []Decision {
	var w float64
	for _, t := range ts {
		if t.Busy {
			w += weightOf(t)
		}
	}
	out := make([]Decision, len(ts))
	at := 0.0
	for i, t := range ts {
		dec := Decision{Name: t.Name, GPU: t.GPU, Duty: 1, Reason: "idle"}
		if t.Busy {
			dec.Target = weightOf(t) / w
			dec.Duty, dec.Offset, dec.Reason = dec.Target, at, "timeslice slot"
			if dec.Duty >= 1 {
				dec.Reason = "alone on the GPU"
			}
			at += dec.Target
		}
		a.duty[key{t.Name, t.GPU}] = dec.Duty
		out[i] = dec
	}
	return out
}

func (a *Arbiter) dutyOf(k key) float64 {
	if d, ok := a.duty[k]; ok {
		return d
	}
	return 1
}

// fpsSLOSlack is the part of its frames/s SLO a latency tenant may read
// before the SLO counts as missed: frames/s is counted in whole frames
// over the meter's window (1 s by default), and a loop at its rate reads
// one frame short now and then, which is 2% at 50 frames/s.
const fpsSLOSlack = 0.98

// sloMissed tells whether a latency tenant misses its SLO: its p99 sync
// wait above the SLO's, or its frames/s below fpsSLOSlack of the SLO's.
func sloMissed(t Input) bool {
	slo := t.Rules.SLO
	if slo.P99SyncMS > 0 && t.SyncP99MS > slo.P99SyncMS {
		return true
	}
	return slo.FPS > 0 && t.FPS > 0 && t.FPS < slo.FPS*fpsSLOSlack
}
