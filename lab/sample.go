package lab

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/e2e/fakegpu"
)

// Tenant names a tenant for sampling: its name in gpuarb's status and the
// cgroup (as in /proc/PID/cgroup) whose processes' true GPU time is its.
type Tenant struct {
	Name   string
	Cgroup string
}

// Sample is one interval of ground truth, with gpuarb's view at its end.
type Sample struct {
	At   time.Duration      // end of the interval, since sampling began
	True map[string]float64 // tenant (SlotKey: name@N on GPU N): true share of the GPU over the interval
	Busy float64            // GPU 0 busy over the interval
	// gpuarb's view (empty without a daemon): its estimate over its
	// window, target share and duty.
	Est, Target, Duty map[string]float64
}

// TrueShares splits one reading of the ground truth among the tenants by
// cgroup (a tenant's cgroup and everything below it), per GPU (by
// SlotKey); busy is GPU 0's.
func TrueShares(st fakegpu.Stats, tenants []Tenant) (shares map[string]float64, busy float64) {
	shares = map[string]float64{}
	if len(st.GPUs) == 0 || st.ElapsedNS == 0 {
		return shares, 0
	}
	for _, g := range st.GPUs {
		for _, t := range tenants {
			for _, c := range g.Contexts {
				if c.Cgroup == t.Cgroup || strings.HasPrefix(c.Cgroup, t.Cgroup+"/") {
					shares[SlotKey(t.Name, g.Index)] += float64(c.BusyNS) / float64(st.ElapsedNS)
				}
			}
		}
	}
	return shares, float64(st.GPUs[0].BusyNS) / float64(st.ElapsedNS)
}

// Sampler reads the ground truth (resetting it) and the daemon's status
// every interval.
type Sampler struct {
	GPU      *FakeGPU
	Daemon   *Daemon // nil: truth only; SetDaemon once it runs
	Tenants  []Tenant
	Interval time.Duration
	// Status, when set, gets the daemon's whole status at each sample.
	Status func(at time.Duration, st api.Status)

	mu      sync.Mutex
	samples []Sample
}

// Run samples until ctx ends.
func (s *Sampler) Run(ctx context.Context) error {
	start := time.Now()
	if _, err := s.GPU.Stats(true); err != nil {
		return err
	}
	tick := time.NewTicker(s.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		st, err := s.GPU.Stats(true)
		if err != nil {
			return err
		}
		smp := Sample{At: time.Since(start), Est: map[string]float64{}, Target: map[string]float64{}, Duty: map[string]float64{}}
		smp.True, smp.Busy = TrueShares(st, s.Tenants)
		s.mu.Lock()
		d := s.Daemon
		s.mu.Unlock()
		if d != nil {
			if status, err := d.Status(ctx); err == nil {
				s.view(&smp, status)
				if s.Status != nil {
					s.Status(smp.At, status)
				}
			}
		}
		s.mu.Lock()
		s.samples = append(s.samples, smp)
		s.mu.Unlock()
	}
}

// SetDaemon makes the sampler read d's status from the next sample on (a
// daemon restarted in the first one's place).
func (s *Sampler) SetDaemon(d *Daemon) {
	s.mu.Lock()
	s.Daemon = d
	s.mu.Unlock()
}

// view adds the daemon's figures for the sampled tenants, matched by name
// or by cgroup.
func (s *Sampler) view(smp *Sample, st api.Status) {
	for _, t := range s.Tenants {
		for _, tn := range st.Tenants {
			if tn.Name == t.Name || tn.Cgroup == t.Cgroup {
				k := SlotKey(t.Name, tn.GPU)
				smp.Est[k] += tn.Share
				smp.Target[k] = tn.TargetShare
				smp.Duty[k] = tn.Duty
			}
		}
	}
}

// Samples returns what has been sampled so far.
func (s *Sampler) Samples() []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples)
}

// Series picks one figure of every sample after `after`.
func Series(ss []Sample, after time.Duration, f func(Sample) float64) []float64 {
	var out []float64
	for _, s := range ss {
		if s.At > after {
			out = append(out, f(s))
		}
	}
	return out
}

// Median of xs (0 for none).
func Median(xs []float64) float64 { return Percentile(xs, 50) }

// Percentile p (0–100) of xs by linear interpolation (0 for none).
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	pos := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

// Max of xs (0 for none).
func Max(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Max(xs)
}

// Mean of xs (0 for none).
func Mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// Unfairness of two shares: |a − b| / (a + b), 0 when both are 0.
func Unfairness(a, b float64) float64 {
	if a+b == 0 {
		return 0
	}
	return math.Abs(a-b) / (a + b)
}
