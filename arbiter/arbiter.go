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
	// Increase is the additive step per period when a tenant with work is
	// below its target (default 0.05: from MinDuty to 1 in about 2 s).
	Increase float64
	// Decrease is the multiplicative step when a tenant is above its
	// target, and for others while a latency SLO is missed (default 0.8).
	Decrease float64
	// Tolerance is the dead band around a target in which the duty is
	// left alone (default 0.01), so measurement noise does not make it
	// oscillate.
	Tolerance float64
}

// DefaultParams are the defaults documented on Params.
func DefaultParams() Params {
	return Params{MinDuty: 0.05, Increase: 0.05, Decrease: 0.8, Tolerance: 0.01}
}

// Input is what the arbiter knows of one tenant on one GPU in a period.
type Input struct {
	Name  string
	GPU   int
	Rules policy.Rules
	// Share is the measured fraction of the GPU over the control window.
	Share float64
	// Busy tells whether the tenant has work outstanding or launched some
	// in the control window.
	Busy bool
	// SyncP99MS and FPS are the measured SLO figures (0: none seen).
	SyncP99MS float64
	FPS       float64
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
	return &Arbiter{p: p, duty: map[key]float64{}}
}

// Step runs one control period over every tenant of every GPU. mode gives
// each GPU's sharing mode. Decisions come per GPU, by tenant name.
func (a *Arbiter) Step(in []Input, mode func(gpu int) policy.Mode) []Decision {
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
		var ds []Decision
		if mode(g) == policy.ModeTimeslice {
			ds = a.timeslice(ts)
		} else {
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
		}
	}
	return out
}

// Targets computes weighted max-min fair shares with limits among the
// tenants with work (water filling). A throttled tenant wants the whole
// GPU; an unthrottled one (and a latency tenant) what it uses plus
// headroom, so a tenant that needs little leaves the rest to the others
// (work conservation) while one that needs more grows 10% a period.
func Targets(ts []Input, duty func(Input) float64) []float64 {
	target := make([]float64, len(ts))
	demand := make([]float64, len(ts))
	for i, t := range ts {
		switch {
		case !t.Busy:
			demand[i] = 0
		case t.Rules.Priority == policy.Latency:
			demand[i] = math.Min(1, t.Share*1.2+0.02)
		case duty(t) >= 1:
			demand[i] = math.Min(1, t.Share*1.1+0.02)
		default:
			demand[i] = 1
		}
		if t.Rules.Limit > 0 {
			demand[i] = math.Min(demand[i], float64(t.Rules.Limit))
		}
	}
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
			w += float64(ts[i].Rules.Weight)
		}
		capped := false
		for i := range open {
			fair := left * float64(ts[i].Rules.Weight) / w
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
			target[i] += left * float64(ts[i].Rules.Weight) / w
		}
		break
	}
	return target
}

func (a *Arbiter) share(ts []Input) []Decision {
	targets := Targets(ts, func(t Input) float64 { return a.dutyOf(key{t.Name, t.GPU}) })
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
	out := make([]Decision, len(ts))
	stagger := 0
	for i, t := range ts {
		k := key{t.Name, t.GPU}
		d := a.dutyOf(k)
		dec := Decision{Name: t.Name, GPU: t.GPU, Target: targets[i], Paced: true}
		// A decrease starts from what the tenant uses, not from a rate it
		// does not reach, and goes no lower than the target needs; an
		// increase is no larger than the gap. Both keep the loop from
		// hunting around the target.
		from := math.Min(d, math.Max(t.Share, a.p.MinDuty))
		switch {
		case t.Rules.Priority == policy.Latency:
			d, dec.Reason = 1, "latency tenant: never throttled"
			dec.SLOMissed = t.Busy && sloMissed(t)
		case !t.Busy:
			d, dec.Reason = 1, "idle"
		case missed:
			d, dec.Reason = from*a.p.Decrease, "a latency SLO is missed"
		case busy == 1 && t.Rules.Limit == 0:
			d, dec.Reason = 1, "alone on the GPU"
		case t.Share > targets[i]+a.p.Tolerance:
			// The share lags the rate by the tenant's queue (up to a second
			// for a deep one): a paced rate is not cut below half its
			// target on that lag, or the tenant would be starved once the
			// queue drains.
			d = from * math.Max(a.p.Decrease, targets[i]/t.Share)
			d, dec.Reason = math.Max(d, targets[i]/2), "above target"
		case t.Share < targets[i]-a.p.Tolerance:
			d, dec.Reason = d+math.Min(a.p.Increase, targets[i]-t.Share), "below target"
		default:
			dec.Reason = "on target"
		}
		d = math.Max(a.p.MinDuty, math.Min(1, d))
		a.duty[k] = d
		dec.Duty = d
		if d < 1 {
			// Stagger the running windows so throttled tenants do not
			// stall (and resume) together.
			dec.Offset = math.Mod(float64(stagger)*0.37, 1)
			stagger++
		}
		out[i] = dec
	}
	return out
}

// timeslice gives the tenants with work exclusive consecutive slots sized
// by weight; idle tenants are left running (they submit nothing).
func (a *Arbiter) timeslice(ts []Input) []Decision {
	var w float64
	for _, t := range ts {
		if t.Busy {
			w += float64(t.Rules.Weight)
		}
	}
	out := make([]Decision, len(ts))
	at := 0.0
	for i, t := range ts {
		dec := Decision{Name: t.Name, GPU: t.GPU, Duty: 1, Reason: "idle"}
		if t.Busy {
			dec.Target = float64(t.Rules.Weight) / w
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

func sloMissed(t Input) bool {
	slo := t.Rules.SLO
	if slo.P99SyncMS > 0 && t.SyncP99MS > slo.P99SyncMS {
		return true
	}
	return slo.FPS > 0 && t.FPS > 0 && t.FPS < slo.FPS*0.98
}
