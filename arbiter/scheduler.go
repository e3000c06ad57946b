package arbiter

import (
	"cmp"
	"math"
	"slices"

	"github.com/gpuarb/gpuarb/policy"
)

// Nanoseconds is a span of GPU time. The arbiter reads no clock: its
// spans are plain numbers, converted at its edges (time.Duration has the
// same unit).
type Nanoseconds int64

// Microseconds is n in whole microseconds.
func (n Nanoseconds) Microseconds() int64 { return int64(n / Microsecond) }

// Units of Nanoseconds.
const (
	Microsecond Nanoseconds = 1000
	Millisecond             = 1000 * Microsecond
)

// Scheduler-mode constants.
const (
	// BaseSlice is a channel group's timeslice when every group weighs the
	// same, on a GPU whose own (SetSlices) gpuarb does not know: the
	// simulated GPU's default. The nvidia driver's is 2048 µs, 8 of its
	// switches (gpusched.Slices, e2e/realgpu).
	BaseSlice = 1024 * Microsecond
	// MinSlice is the shortest timeslice gpuarb gives a group on such a
	// GPU: a context switch costs the simulated GPU 20 µs, and shorter
	// slices would spend it on switches. 50 µs gained the fuzzer's
	// latency-held loops nothing there (docs/benchmark-history.md §10).
	// A switch costs a real H200 about 256 µs: its floor is 1024 µs
	// (gpusched.Slices).
	MinSlice = 100 * Microsecond
	// MaxSlice bounds one group's timeslice, and maxRotation the round of
	// all of a GPU's busy groups: the longest a group with work waits.
	MaxSlice    = 50 * Millisecond
	maxRotation = 100 * Millisecond
	// feedbackGain is how much of the log-ratio target/share one control
	// window's correction takes (spread over the window's periods):
	// half, because the share lags the slices by that window and a whole
	// correction per window overshoots.
	feedbackGain = 0.5
	// maxFeedback bounds the feedback multiplier of a tenant's weight,
	// either way: the turn model is right to a context switch's cost, the
	// host's latency and groups without work; a larger correction would
	// carry one phase of a workload's into the next (pauses take over
	// where it is not enough).
	maxFeedback = 2.0
	// minRun is the least fraction of each period a tenant's groups stay
	// on the GPU: slowed, never starved (it drains its queue and shows
	// demand).
	minRun = 0.05
	// maxRunStep bounds the factor by which a run fraction moves per
	// control window, either way: the share that steers it lags by that
	// window.
	maxRunStep = 2.0
	// sloPressure is the factor by which the others' run fraction falls
	// per period while a latency tenant's SLO is missed.
	sloPressure = 0.8
	// latencyWeight is how many times the largest other weight a busy
	// latency tenant weighs: its turn comes at once and lasts to MaxSlice.
	latencyWeight = 1000
	// idleSlack is how much of the control window the GPU may idle while
	// every busy tenant is below its target before the paused ones resume
	// at once: the pauses then serve nobody and only waste the GPU (run
	// fractions growing back from minRun at maxRunStep take seconds). Not
	// while any tenant is at its target: a closed loop's own gaps idle the
	// GPU up to that much beside others paused for it, and resuming them
	// at once would take the loop's share.
	idleSlack = 0.15
)

// Slices bound a GPU's timeslices: Base is the mean of its busy groups'
// when every group weighs the same, Min the shortest. They follow the
// GPU's driver (gpusched.Actuator.Slices); DefaultSlices are the
// simulated GPU's.
type Slices struct{ Base, Min Nanoseconds }

// DefaultSlices are the slices of a GPU SetSlices has not named.
var DefaultSlices = Slices{Base: BaseSlice, Min: MinSlice}

// SetSlices sets GPU gpu's slices: Min at least 1 µs, Base within
// [Min, MaxSlice].
func (a *Arbiter) SetSlices(gpu int, s Slices) {
	s.Min = min(max(s.Min, Microsecond), MaxSlice)
	s.Base = min(max(s.Base, s.Min), MaxSlice)
	a.slices[gpu] = s
}

// SlicesOf returns GPU gpu's slices.
func (a *Arbiter) SlicesOf(gpu int) Slices {
	if s, ok := a.slices[gpu]; ok {
		return s
	}
	return DefaultSlices
}

// schedState is the scheduler mode's memory of one tenant on one GPU.
type schedState struct {
	feedback float64 // multiplier of its weight, 1/maxFeedback..maxFeedback
	run      float64 // fraction of each period its groups stay on the GPU
	// sliceAtFloor tells whether its groups' timeslice was the GPU's
	// Slices.Min in the last step it had work, and raiseMovesNothing
	// whether a larger weight would have moved no slice then: its own was
	// set by its burst (or MaxSlice) and every other busy group's was at
	// the floor. A feedback that cannot move a slice stays (see correct).
	sliceAtFloor, raiseMovesNothing bool
	// held is the run fraction a release ended (0: none), remembered for
	// heldFor more periods (see runFraction).
	held    float64
	heldFor int
}

// pauseMemory is how many control windows a released pause is remembered
// for: a phased loop's phases of a second or two alternate within it, and
// its next phase of short bursts calls for the same pause again.
const pauseMemory = 10

func (a *Arbiter) sched(k key) *schedState {
	s := a.schedStates[k]
	if s == nil {
		s = &schedState{feedback: 1, run: 1}
		a.schedStates[k] = s
	}
	return s
}

// schedule decides one GPU whose own scheduler gpuarb steers: every
// tenant's weight in the GPU's rotation, its channel groups' timeslices
// (timeslices), and the part of each period it stays on the GPU (paused
// for the rest).
//
// The hardware time-slices the channel groups with work round robin, each
// for its own timeslice or until it runs out of work, so a tenant's share
// is its turns' length over the rotation's: slices in proportion to the
// targets give backlogged tenants their targets whatever their number of
// processes or queue depth, and work nobody else wants is never lost — a
// tenant without work takes no turn. A closed loop brings only so much
// work to a turn (its burst); the others' slices shrink until its burst
// is its share of the rotation. Feedback on the settled share corrects
// the rest (context switches, the host's latency), bounded by
// maxFeedback. A tenant that wants less than its fair share gets the
// largest weight and a slice that holds its burst (burstSlice): served at
// once whenever it has work and never cut off mid-burst, it takes what it
// needs and no more. Pauses bound what slices cannot (runFraction); a
// tenant gives up nothing while no other is deprived, and a tenant on
// its target gives up only the part of a deprived one's shortfall that
// the tenants above their targets cannot cover (runTargets).
func (a *Arbiter) schedule(ts []Input) []Decision {
	targets := Targets(ts, func(Input) float64 { return 1 })
	busy, missed, latencyBusy, wanting := 0, false, false, 0
	var short float64 // the largest deficit of a deprived tenant (0: none)
	used, allBelow := 0.0, true
	for i, t := range ts {
		used += t.Share
		allBelow = allBelow && (!t.Busy || t.Share < targets[i]-a.p.Tolerance)
		if a.wanting(t, targets[i]) {
			wanting++
		}
		if t.Busy {
			busy++
		}
		if t.Rules.Priority == policy.Latency && t.Busy {
			latencyBusy = true
			missed = missed || sloMissed(t)
		}
		if a.deprived(t, targets[i]) {
			short = math.Max(short, targets[i]-t.Share)
		}
	}
	deprived := short > 0
	out := make([]Decision, len(ts))
	states := make([]*schedState, len(ts))
	var maxWeight float64
	for i, t := range ts {
		s := a.sched(key{t.Name, t.GPU})
		states[i] = s
		dec := Decision{Name: t.Name, GPU: t.GPU, Target: targets[i], Scheduled: true, Duty: 1}
		switch {
		case !t.Busy:
			dec.Reason = "idle"
		case t.Unsteered:
			dec.Scheduled, dec.Paced = false, true
		case t.Rules.Priority == policy.Latency:
			dec.Reason = "latency tenant: served first"
			dec.SLOMissed = sloMissed(t)
		case busy == 1 && t.Rules.Limit == 0:
			s.feedback, dec.Reason = 1, "alone on the GPU"
		default:
			dec.Reason = a.correct(t, s, targets[i], deprived)
		}
		dec.Weight = math.Max(targets[i], 1e-3) * s.feedback
		if t.Busy && !t.Unsteered && t.Rules.Priority != policy.Latency {
			maxWeight = math.Max(maxWeight, dec.Weight)
		}
		out[i] = dec
	}
	turnBound := make([]bool, len(ts))
	maxWait := make([]float64, len(ts))
	lightDemand := make([]float64, len(ts))
	for i, t := range ts {
		switch {
		case !t.Busy || t.Unsteered:
		case t.Rules.Priority == policy.Latency:
			out[i].Weight = math.Max(1, maxWeight) * latencyWeight
		case latencyBusy:
			out[i].Weight = math.Min(out[i].Weight, 1)
		case light(t, 1) && targets[i] < maxWeight && t.Demand < targets[i]+a.p.Tolerance:
			// It wants less than a fair share: the largest weight serves
			// it at once when it has work, and it uses no more than it needs.
			out[i].Weight, out[i].Reason = maxWeight, "light: served first"
			maxWait[i] = a.maxWait(t)
			lightDemand[i] = t.Demand
		case t.BurstNS > 0:
			turnBound[i] = busy > 1
		}
	}
	relax := a.waitRelax(ts, targets, turnBound)
	for i := range maxWait {
		maxWait[i] *= relax
	}
	sl := a.SlicesOf(ts[0].GPU)
	timeslices(ts, out, turnBound, maxWait, lightDemand, sl)
	recordSlices(ts, out, states, turnBound, lightDemand, sl.Min)
	wasted := used < 1-idleSlack && allBelow
	released := !missed && overrun(ts, targets, states)
	runTargets := a.runTargets(ts, targets, short)
	for i, t := range ts {
		var why string
		// An unsteered tenant has no slice to shrink: its rate at the
		// launch gate is its only lever, run as a run fraction is.
		atFloor := t.Unsteered || out[i].Timeslice <= sl.Min || states[i].feedback <= 1/maxFeedback
		contested := wanting > 0 && (wanting > 1 || !a.wanting(t, targets[i]))
		out[i].Duty, why = a.runFraction(t, states[i], runTargets[i], runContext{atFloor, missed, deprived, contested, wasted, released})
		if why != "" {
			out[i].Reason = why
		}
		if t.Unsteered && t.Busy {
			out[i].Timeslice, out[i].Reason = 0, "channel groups unknown or refused: not paced"
			if out[i].Duty < 1 {
				out[i].Reason = "channel groups unknown or refused: paced at the launch gate (" + cmp.Or(why, "below 1") + ")"
			}
		}
	}
	return out
}

// timeslices sets every tenant's Decision.Timeslice: its weight split
// among its channel groups, scaled so that the GPU's busy groups average
// sl.Base (more where the lightest would fall below sl.Min, less where
// the rotation would exceed maxRotation) — or less, until the burst of
// every closed loop among them (turnBound) fills its slice, since its turn
// ends when its work runs out and the others' slices must shrink for its
// burst to be its share — and until the others' rotation is within the
// maxWait of every light closed loop (its wait for a turn costs it its
// share). A tenant without work keeps the slice it has (Timeslice 0): it
// takes no turn, and a thousand light tenants going idle and busy again
// would each cost a control per step. A light tenant's turns last its
// bursts, not its slices, and take its demand's part of any stretch of
// time (lightDemand, a share of the GPU; 0: not light): the others'
// slices share the rest of maxRotation, or a host of light tenants (1000,
// each busy in some steps) would shrink everyone's slices with their
// number, which changes every step; its own slice holds its burst
// (burstSlice). So does a closed loop's whose slice nearly fits its burst
// (within burstCover). No slice falls below sl.Min or exceeds MaxSlice.
func timeslices(ts []Input, out []Decision, turnBound []bool, maxWait, lightDemand []float64, sl Slices) {
	groups := func(t Input) float64 { return float64(max(t.Groups, 1)) }
	perGroup := func(i int) float64 { return math.Max(out[i].Weight, 1e-9) / groups(ts[i]) }
	var n, total, lightest float64
	lightest = math.Inf(1)
	for i, t := range ts {
		if t.Busy && !t.Unsteered {
			n += groups(t)
			total += out[i].Weight
			lightest = math.Min(lightest, perGroup(i))
		}
	}
	if n == 0 {
		return
	}
	scale := float64(sl.Base) * n / total // ns of slice per unit of weight
	scale = max(scale, float64(sl.Min)/lightest)
	left, heavy := 1.0, total // the part of a rotation the light tenants leave, and who shares it
	for i, t := range ts {
		if lightDemand[i] > 0 && t.Busy && !t.Unsteered {
			left -= lightDemand[i]
			heavy -= out[i].Weight
		}
	}
	if left > 0 && heavy > 0 {
		scale = min(scale, float64(maxRotation)*left/heavy)
	} else {
		scale = min(scale, float64(maxRotation)/total)
	}
	for i, t := range ts {
		if turnBound[i] {
			// Below the lightest's floor too: the groups held at sl.Min
			// then get more than their weight, which their feedback and
			// pauses correct; everyone's longer slices would not let the
			// closed loop have its share at all.
			scale = math.Min(scale, t.BurstNS/perGroup(i))
		}
		if maxWait[i] > 0 && total > out[i].Weight {
			scale = math.Min(scale, maxWait[i]/(total-out[i].Weight))
		}
	}
	for i, t := range ts {
		if t.Busy && !t.Unsteered {
			d := Nanoseconds(scale * perGroup(i))
			switch {
			case lightDemand[i] > 0:
				d = max(d, burstSlice(t.BurstNS, sl.Base))
			case turnBound[i] && burstCover*float64(d) >= t.BurstNS:
				// A closed loop whose slice nearly fits its burst gets a
				// slice that holds it: its turn ends when its work runs
				// out and takes no more, where a slice of its mean burst
				// cut every longer burst, and the rest waited a rotation
				// (a loop of 2 ms bursts in 1.9 ms slices read 49.5% for
				// a target of 55.8%).
				d = max(d, Nanoseconds(burstCover*t.BurstNS))
			}
			out[i].Timeslice = min(max(d, sl.Min), MaxSlice)
		}
	}
}

// recordSlices keeps, for every busy steered tenant, whether its new
// timeslice is at the GPU's floor and whether a larger weight would have moved
// no slice: what the next step's correct needs to tell a feedback that
// steers from one that only winds up. A closed loop's slice (turnBound)
// and a light tenant's hold their bursts whatever their weights; a
// larger weight only shrinks the others' slices, and not below floor.
func recordSlices(ts []Input, out []Decision, states []*schedState, turnBound []bool, lightDemand []float64, floor Nanoseconds) {
	steeredBusy := func(t Input) bool { return t.Busy && !t.Unsteered && t.Rules.Priority != policy.Latency }
	aboveFloor := 0
	for i, t := range ts {
		if steeredBusy(t) && out[i].Timeslice > floor {
			aboveFloor++
		}
	}
	for i, t := range ts {
		if !steeredBusy(t) {
			continue
		}
		others := aboveFloor
		if out[i].Timeslice > floor {
			others--
		}
		ownFixed := lightDemand[i] > 0 || turnBound[i] && float64(out[i].Timeslice) >= t.BurstNS
		states[i].sliceAtFloor = out[i].Timeslice <= floor
		states[i].raiseMovesNothing = out[i].Timeslice >= MaxSlice || ownFixed && others == 0
	}
}

// burstSlice is a light tenant's timeslice: long enough for one of its
// bursts (burstCover of it), so that its turn ends when its work runs out,
// not in the middle of a burst — a burst cut by its slice waits through
// the others' rotation once per slice instead of once per burst, which
// costs a closed loop most of what it would take alone (a 12.6 ms burst
// in 1 ms slices beside six groups read 41% for a demand of 51%). A light
// tenant wants less than its share, so a turn as long as its burst takes
// no more than it needs. Rounded up to the GPU's base slice times a power
// of two, or every wobble of the burst's estimate would cost a control; 0
// when it never ran out of work (BurstNS 0).
func burstSlice(burstNS float64, base Nanoseconds) Nanoseconds {
	if burstNS <= 0 {
		return 0
	}
	d := base
	for float64(d) < burstCover*burstNS && d < MaxSlice {
		d *= 2
	}
	return d
}

// burstCover is how much longer than its measured burst a light tenant's
// timeslice is: bursts vary, and one cut short waits a whole rotation.
const burstCover = 1.25

// maxShortfallCut is the most of its target a tenant gives up to a
// deprived one's uncovered shortfall (runTargets): the deprived loop
// gains from the others' pauses only where they coincide and it then runs
// alone, so the cut is bounded, and a tenant is slowed, never starved.
const maxShortfallCut = 0.5

// runTargets are the shares the tenants' run fractions steer to: their
// targets, less a shortfall the GPU cannot cover. A deprived closed loop
// of short bursts waits at every turn for the others' slices, at the
// GPU's floor already, and its target can be out of reach while every
// other tenant holds its own: the host time between its bursts, in which
// the others run, counts in its share alone but not in the targets, which
// sum to the GPU. Where the tenants above their targets cannot give back
// the deprived one's shortfall (what is left of it, beyond Tolerance, is
// the uncovered part), every tenant that is better off by more than
// Tolerance steers to its target less that part, but at most half its
// target: pausing them serves the loop sooner in some of its turns, and
// the shortfall is shared instead of borne by one. short is the largest
// deficit of a deprived tenant.
func (a *Arbiter) runTargets(ts []Input, targets []float64, short float64) []float64 {
	tol := a.p.Tolerance
	var excess float64
	for i, t := range ts {
		if t.Busy && t.Share > targets[i]+tol {
			excess += t.Share - targets[i] - tol
		}
	}
	out := slices.Clone(targets)
	give := short - tol - excess
	if give <= tol {
		return out
	}
	for i, t := range ts {
		if t.Busy && t.Rules.Priority != policy.Latency && targets[i]-t.Share < short-tol {
			out[i] = targets[i] - math.Min(give, targets[i]*maxShortfallCut)
		}
	}
	return out
}

// maxWait is the longest rotation of the others a light closed loop may
// wait through for each turn and still get what it would alone, less
// Tolerance: alone it runs its burst B every B/D (D its demand); a wait R
// a turn makes that B/(B/D + R), at least D − Tolerance while
// R ≤ B·Tolerance / (D·(D − Tolerance)). 0: no bound (it never ran out of
// work, or wants too little to tell).
func (a *Arbiter) maxWait(t Input) float64 {
	d, tol := t.Demand, a.p.Tolerance
	if t.BurstNS <= 0 || d <= 2*tol {
		return 0
	}
	return t.BurstNS * tol / (d * (d - tol))
}

// waitRelax is how far the light loops' maxWait stretches, 1 to
// maxWaitRelax. A light loop's work arrives at any point of the others'
// rotation and waits what is left of it, half of it on average, so maxWait
// (the whole rotation) keeps it within Tolerance with a margin, bought
// with the others' slices. A closed loop of long bursts with host time
// between them, its slice so cut, waits the others' turns once per slice
// and cannot make that up with queued work: there the margin costs it
// more than it saves the light one. So the bound stretches with the largest shortfall of such a loop that
// wants more (demand below 1 − 2·Tolerance; on the settled window, so
// that the slices do not move every step): not at all within Tolerance,
// to maxWaitRelax at twice Tolerance. A hog's queued work fills each of
// its turns, and its own feedback corrects its shortfall.
func (a *Arbiter) waitRelax(ts []Input, targets []float64, turnBound []bool) float64 {
	tol := a.p.Tolerance
	var short float64
	for i, t := range ts {
		if turnBound[i] && t.Demand < 1-2*tol && a.wanting(t, targets[i]) {
			short = math.Max(short, targets[i]-t.SettledShare)
		}
	}
	return 1 + (maxWaitRelax-1)*min(max((short-tol)/tol, 0), 1)
}

// maxWaitRelax is the most waitRelax stretches maxWait: to the light
// loop's average wait, half the rotation, where its loss reaches Tolerance.
const maxWaitRelax = 2

// deprived tells whether a tenant is kept from its share: below its
// target by more than Tolerance while it wants more than it gets and
// waits for the others' turns (heldByOthers). Only then does a tenant
// above its target give anything up: what nobody else wants is not lost.
// A latency tenant is never deprived of a share: its turn comes within
// the others' shortest slices, and pausing them would leave the GPU idle
// without serving it sooner (batch tenants still yield to a missed SLO).
func (a *Arbiter) deprived(t Input, target float64) bool {
	return a.wanting(t, target) && t.Share < target-a.p.Tolerance
}

// wanting tells whether a tenant wants more than it gets while below its
// target, even within Tolerance of it: a paused tenant's run fraction
// keeps converging on its own target while another wants (deprived is
// the stronger condition that starts a pause).
func (a *Arbiter) wanting(t Input, target float64) bool {
	return t.Busy && t.Rules.Priority != policy.Latency && t.Share < target && a.wantsMore(t) &&
		a.heldByOthers(t)
}

// wantsMore tells whether a tenant would take more than it gets: its
// demand over the settled window says so, or its work queues deep now
// (Backlogged, the short window's evidence its target rests on). A
// phased loop in a phase of long bursts is backlogged while its settled
// demand still averages in the idle time of its phase of short ones:
// judged by that alone it would be set a backlogged tenant's target and
// never count as deprived below it, and the others would take its share.
func (a *Arbiter) wantsMore(t Input) bool {
	return t.Backlogged || t.Demand > t.Share+a.p.Tolerance
}

// heldByOthers tells whether a tenant's work waited for the others'
// turns on the GPU for more than Tolerance of the window. One that did
// not is as fast as its own host lets it be, whatever the host time in
// its syncs adds to its demand: pausing the others would leave the GPU
// idle without serving it sooner.
func (a *Arbiter) heldByOthers(t Input) bool {
	return t.Waited > a.p.Tolerance
}

// runContext is what a tenant's run fraction depends on beside its own
// share and target: whether its slice or feedback is at its floor, a
// latency SLO is missed, another tenant is deprived, another still wants
// more (contested), the GPU idles more than idleSlack with every busy
// tenant below its target (wasted), and a tenant that is not paused takes
// more than overrunMargin above its target with no SLO missed (released).
type runContext struct {
	atFloor, missed, deprived, contested, wasted, released bool
}

// overrunMargin is how far above its target a running tenant must take
// the GPU for the others' pauses to be released at once (see overrun):
// beyond what a pause converging on a deprived tenant's target overshoots
// it by, so that a loop served by the pauses does not lose them to its
// own noise.
const overrunMargin = 0.03

// overrun tells whether a busy tenant that is not paused takes more than
// overrunMargin above its target. The others' pauses then add to its
// excess first, whoever else they were meant to serve: a phased loop
// deprived in its phase of short bursts takes more than its target in
// its phase of long ones, and the pauses set for the first, growing back
// at maxRunStep per window, would run a phase behind.
func overrun(ts []Input, targets []float64, states []*schedState) bool {
	for i, t := range ts {
		if t.Busy && t.Rules.Priority != policy.Latency && states[i].run >= 1 && t.Share > targets[i]+overrunMargin {
			return true
		}
	}
	return false
}

// runFraction is the part of each period a tenant's groups stay on the
// GPU, and why it pauses them; target is its run target (runTargets).
//
// Invariant: a tenant is paused only where its slice cannot hold it — to a
// limit; to its target while another tenant is deprived and its slice or
// feedback is at the floor (atFloor); or, for a batch tenant, while a
// latency SLO is missed. A pause moves by at most a factor maxRunStep per
// control window (spread over its periods) and never below minRun. Normal
// tenants are not paused for a latency tenant at the floor: its turn comes
// within their slices, and a pause would idle the GPU without serving it
// sooner.
//
// The rules, the first that applies wins:
//  1. a latency tenant, or one with no work, runs (1);
//  2. a batch tenant while an SLO is missed: its fraction falls by
//     sloPressure a period;
//  3. a tenant that must yield: at once as deep as its last pause if that
//     was released within pauseMemory windows (a phased load's short phase
//     needs its pause back at once, not grown into from 1), else toward its
//     target;
//  4. a paused tenant without a limit, its slice above the floor, while an
//     unpaused one overruns its target (released): resumes at once, its
//     slice holding it to its own target, and remembers the pause; at the
//     floor the pause is what holds it, and it stays;
//  5. a paused tenant below target without a limit, where pauses only idle
//     the GPU (wasted): resumes at once — never with a limit, whose pauses
//     idle the GPU by design;
//  6. a paused tenant below target: grows toward it;
//  7. a paused tenant on target while another wants more (contested):
//     converges on it both ways (growing back at full rate would hold the
//     other below its target on average);
//  8. a paused tenant nothing calls to pause: grows back at maxRunStep a
//     window.
func (a *Arbiter) runFraction(t Input, s *schedState, target float64, c runContext) (float64, string) {
	atFloor, missed, deprived, contested := c.atFloor, c.missed, c.deprived, c.contested
	per := 1 / float64(a.p.React)
	share := math.Max(t.Share, 1e-3)
	overLimit := t.Rules.Limit > 0 && t.Share > float64(t.Rules.Limit)+a.p.Tolerance
	yields := overLimit || deprived && atFloor && t.Share > target+a.p.Tolerance
	// The step is linear in the share's error, not in its log: a share
	// measured over a window of a few periods swings widely around its
	// mean (a launch-gated queue drains in bursts), and a step by the
	// ratio target/share settles where the share's geometric mean meets
	// the target, its mean above it.
	toward := math.Min(math.Pow(maxRunStep, per), math.Max(math.Pow(maxRunStep, -per), 1+per*(target-share)/target))
	if s.heldFor > 0 {
		s.heldFor--
	} else {
		s.held = 0
	}
	switch {
	case t.Rules.Priority == policy.Latency || !t.Busy:
		s.run = 1
	case missed && t.Rules.Priority == policy.Batch:
		s.run = math.Max(minRun, s.run*sloPressure)
		return s.run, "a latency SLO is missed"
	case yields && s.run >= 1 && s.held > 0:
		s.run, s.held, s.heldFor = s.held, 0, 0
		return s.run, "above target: paused as before its release"
	case yields:
		s.run = math.Max(minRun, s.run*math.Min(1, toward))
		return s.run, "above target: paused part of each period"
	case s.run < 1 && c.released && !atFloor && t.Rules.Limit == 0:
		s.run, s.held, s.heldFor = 1, s.run, pauseMemory*a.p.React
		return s.run, "resuming at once (another tenant takes more than its target)"
	case s.run < 1 && t.Share < target-a.p.Tolerance && c.wasted && t.Rules.Limit == 0:
		s.run = 1
		return s.run, "below target: resuming at once (the GPU idles)"
	case s.run < 1 && t.Share < target-a.p.Tolerance:
		s.run = math.Min(1, s.run*toward)
		return s.run, "below target: resuming"
	case s.run < 1 && contested:
		s.run = math.Max(minRun, math.Min(1, s.run*toward))
		return s.run, "on target: paused part of each period"
	case s.run < 1 && !(deprived && atFloor) && !(t.Rules.Limit > 0 && t.Share >= float64(t.Rules.Limit)-a.p.Tolerance):
		s.run = math.Min(1, s.run*math.Pow(maxRunStep, per))
		return s.run, "resuming"
	}
	return s.run, ""
}

// correct steers a tenant's feedback multiplier by its share over the
// control window (spread over the window's periods) and says why: down
// while it is above target and another tenant is deprived, up while it is
// below target and wants more.
//
// A feedback that could not move any slice stays where it is: down while
// its own slice is at the GPU's floor (Slices.Min; a pause is the lever
// there, see runFraction), up while a larger weight would move no slice
// (its own holds its burst or MaxSlice, every other busy group's is at
// the floor): a feedback wound up where it moves nothing holds the
// workload's next phase off target for as many windows as it takes to
// unwind.
func (a *Arbiter) correct(t Input, s *schedState, target float64, deprived bool) string {
	step := math.Pow(target/math.Max(t.Share, 1e-3), feedbackGain/float64(a.p.React))
	switch {
	case t.Share > target+a.p.Tolerance && deprived:
		if !s.sliceAtFloor {
			s.feedback = math.Max(1/maxFeedback, s.feedback*step)
		}
		return "above target"
	case t.Share > target+a.p.Tolerance:
		return "above target: takes the slack"
	case t.Share < target-a.p.Tolerance && a.wantsMore(t):
		if !s.raiseMovesNothing {
			s.feedback = math.Min(maxFeedback, s.feedback*step)
		}
		return "below target"
	}
	return "on target"
}
