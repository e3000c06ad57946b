package enforce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/arbiter"
	"github.com/gpuarb/gpuarb/control"
	"github.com/gpuarb/gpuarb/gpusched"
	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/meter"
	"github.com/gpuarb/gpuarb/policy"
)

// A latency tenant's processes hold the busy other tenants' groups on the
// GPUs whose scheduler gpuarb steers, from before it is busy itself; idle
// tenants, other latency tenants, GPUs paced at the launch gate and GPUs
// with more groups than a hold can take in time are left out, and the
// bound is the others' groups times the GPU's shortest slice. A process
// the step did not see with groups holds by its latency tenant's cgroup
// every GPU the plan holds, those without a latency tenant's groups
// included; a held group's process never does.
func TestHoldPlanOf(t *testing.T) {
	tenant := func(name string, prio policy.Priority) *control.Tenant {
		return &control.Tenant{Assignment: control.Assignment{Name: name, Rules: policy.Rules{Priority: prio}}}
	}
	res := control.Result{Tenants: map[string]*control.Tenant{
		"infer": tenant("infer", policy.Latency), "infer2": tenant("infer2", policy.Latency),
		"a": tenant("a", policy.Normal), "b": tenant("b", policy.Batch), "idle": tenant("idle", policy.Normal),
	}}
	groups := map[string]map[int][]gpusched.Group{}
	add := func(name string, gpu int, pids ...uint32) {
		if groups[name] == nil {
			groups[name] = map[int][]gpusched.Group{}
		}
		for _, pid := range pids {
			groups[name][gpu] = append(groups[name][gpu], gpusched.Group{PID: pid, GPU: uint32(gpu), Client: pid, TSG: 1})
		}
	}
	in := func(name string, gpu int, busy bool) {
		res.Inputs = append(res.Inputs, arbiter.Input{Name: name, GPU: gpu, Busy: busy})
	}
	// GPU 0: steered; infer not busy yet, infer2 busy, a and b busy, idle not.
	in("infer", 0, false)
	in("infer2", 0, true)
	in("a", 0, true)
	in("b", 0, true)
	in("idle", 0, false)
	add("infer", 0, 10)
	add("infer2", 0, 11)
	add("a", 0, 21, 20)
	add("b", 0, 30)
	add("idle", 0, 40)
	// GPU 1: paced at the launch gate.
	in("infer", 1, true)
	in("a", 1, true)
	add("infer", 1, 10)
	add("a", 1, 22)
	// GPU 2: steered, but too many groups to hold.
	in("infer", 2, true)
	in("b", 2, true)
	add("infer", 2, 10)
	for i := range maxHeldGroups + 1 {
		add("b", 2, uint32(100+i))
	}
	// GPU 3: steered, a busy alone.
	in("a", 3, true)
	add("a", 3, 23)
	actuation := map[int]arbiter.Actuation{0: arbiter.Scheduler, 1: arbiter.Pacing, 2: arbiter.Scheduler, 3: arbiter.Scheduler}
	bounds := map[int]gpusched.Slices{0: {Base: 2048 * time.Microsecond, Min: 1024 * time.Microsecond}}

	p := PlanHolds(true, actuation, bounds, res, groups, nil)
	if got := fmt.Sprint(p.gpusOf); got != "map[10:[0] 11:[0]]" {
		t.Errorf("urgent processes %s, want infer's and infer2's on GPU 0 alone", got)
	}
	var pids []uint32
	for _, g := range p.others[0] {
		pids = append(pids, g.PID)
	}
	if !slices.Equal(pids, []uint32{20, 21, 30}) {
		t.Errorf("GPU 0 holds %v, want a's and b's groups in order (20 21 30), not the idle tenant's or a latency tenant's", pids)
	}
	if len(p.others) != 1 {
		t.Errorf("holds on %d GPUs, want GPU 0 alone", len(p.others))
	}
	if p.bound[0] != 3*1024*time.Microsecond {
		t.Errorf("GPU 0's bound %v, want 3 groups × 1024 µs", p.bound[0])
	}
	if p := PlanHolds(false, actuation, bounds, res, groups, []uint64{500}); len(p.gpusOf) != 0 || len(p.others) != 0 || len(p.cgroups) != 0 {
		t.Errorf("observing only, the plan holds %v", p.others)
	}

	p = PlanHolds(true, actuation, bounds, res, groups, []uint64{500, 501})
	if got := fmt.Sprint(p.cgroups); got != "map[500:[0 3] 501:[0 3]]" {
		t.Errorf("urgent cgroups %s, want 500 and 501 holding GPUs 0 and 3", got)
	}
	for _, c := range []struct {
		pid    uint32
		cgroup uint64
		want   string
	}{
		{10, 999, "[0]"},   // infer's, seen with groups: its own GPUs
		{77, 500, "[0 3]"}, // new in infer's cgroup: every held GPU
		{20, 500, "[]"},    // a's, held: never urgent
		{77, 999, "[]"},    // elsewhere
	} {
		if got := fmt.Sprint(p.gpusOfProcess(c.pid, c.cgroup)); got != c.want {
			t.Errorf("process %d in cgroup %d holds GPUs %s, want %s", c.pid, c.cgroup, got, c.want)
		}
	}
}

// heldLog records the hold's pauses and resumes; fail makes the next
// resume fail once.
type heldLog struct {
	mu    sync.Mutex
	calls []string
	fail  bool
}

func (l *heldLog) pause(gs []gpusched.Group, off bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !off && l.fail {
		l.fail = false
		l.calls = append(l.calls, "resume refused")
		return errors.New("refused")
	}
	l.calls = append(l.calls, fmt.Sprintf("%v %d", map[bool]string{true: "pause", false: "resume"}[off], gs[0].PID))
	return nil
}

func (l *heldLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.calls, ", ")
}

// A latency tenant's launch starts a hold and the end of its wait ends
// it; launches within a hold start none, nor do other tenants'. A hold
// whose wait gpuarb does not see is cut at MaxHold, and the GPU rests
// holdRest. A refused resume is tried again in holdRetry. Once the loop
// ends, holds are released and none starts.
func TestLatencyHoldLifecycle(t *testing.T) {
	var log heldLog
	h := NewLatencyHold(log.pause, func([]uint32, []uint64) error { return nil }, false, slog.New(slog.DiscardHandler))
	h.MaxHold = 2 * defaultMaxHold // the operator's bound (--tune max-hold), not the default
	others := []gpusched.Group{{PID: 20, Client: 20, TSG: 1}}
	h.SetPlan(&HoldPlan{gpusOf: map[uint32][]int{10: {0}}, cgroups: map[uint64][]int{},
		others: map[int][]gpusched.Group{0: others}, mates: map[uint32]bool{20: true},
		bound: map[int]time.Duration{0: 2 * time.Millisecond}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	launch := func(pid uint32) {
		h.Observe(&ioctlspy.Launch{Header: ioctlspy.Header{PID: pid, Start: meter.MonotonicNow()}})
	}
	wait := func(pid uint32) { h.Observe(&ioctlspy.Sync{Header: ioctlspy.Header{PID: pid}}) }
	// want waits for the holds to have done calls, and no more a moment
	// later.
	want := func(what, calls string) {
		t.Helper()
		for began := time.Now(); log.String() != calls && time.Since(began) < time.Second; {
			time.Sleep(100 * time.Microsecond)
		}
		time.Sleep(2 * time.Millisecond)
		if got := log.String(); got != calls {
			t.Fatalf("%s: holds did %q, want %q", what, got, calls)
		}
	}

	launch(20) // another tenant's launch holds nothing
	launch(10)
	launch(10)
	want("two launches", "pause 20")
	wait(10)
	want("the wait's end", "pause 20, resume 20")

	launch(10) // its wait never seen: cut at MaxHold
	began := time.Now()
	want("cut", "pause 20, resume 20, pause 20, resume 20")
	if cut := time.Since(began); cut < h.MaxHold {
		t.Fatalf("cut after %v, want at MaxHold %v", cut, h.MaxHold)
	}
	if st := h.Stats()[0]; st.Holds != 2 || st.Cut != 1 || st.Held < h.MaxHold {
		t.Errorf("stats %+v, want 2 holds, 1 cut, held ≥ %v", st, h.MaxHold)
	}

	time.Sleep(holdRest)
	wait(10)
	log.mu.Lock()
	log.fail = true
	log.mu.Unlock()
	launch(10)
	wait(10) // refused: tried again in holdRetry
	want("retried resume", "pause 20, resume 20, pause 20, resume 20, pause 20, resume refused, resume 20")

	time.Sleep(holdRest) // the retry ended the hold as a cut: the GPU rests
	launch(10)
	want("held at the loop's end", "pause 20, resume 20, pause 20, resume 20, pause 20, resume refused, resume 20, pause 20")
	cancel()
	<-done
	launch(10)
	wait(10)
	launch(10)
	want("after the loop's end", "pause 20, resume 20, pause 20, resume 20, pause 20, resume refused, resume 20, pause 20, resume 20")
}

// Holds that start later than the slices bound the wait go off once a GPU
// has had minHoldStarts of them (one a holdProbe still measures them),
// unless every launch holds (HoldDeschedule).
func TestSlowHoldsGoOff(t *testing.T) {
	for _, everyLaunch := range []bool{false, true} {
		var log heldLog
		slow := func(gs []gpusched.Group, off bool) error {
			if off {
				time.Sleep(3 * time.Millisecond) // the bound is 2 ms
			}
			return log.pause(gs, off)
		}
		h := NewLatencyHold(slow, func([]uint32, []uint64) error { return nil }, everyLaunch, slog.New(slog.DiscardHandler))
		h.SetPlan(&HoldPlan{gpusOf: map[uint32][]int{10: {0}}, cgroups: map[uint64][]int{},
			others: map[int][]gpusched.Group{0: {{PID: 20, Client: 20, TSG: 1}}}, mates: map[uint32]bool{20: true},
			bound: map[int]time.Duration{0: 2 * time.Millisecond}})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { h.Run(ctx); close(done) }()
		for range minHoldStarts + 3 {
			h.Observe(&ioctlspy.Launch{Header: ioctlspy.Header{PID: 10, Start: meter.MonotonicNow()}})
			h.Observe(&ioctlspy.Sync{Header: ioctlspy.Header{PID: 10}})
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		<-done
		want := uint64(minHoldStarts)
		if everyLaunch {
			want = minHoldStarts + 3
		}
		if st := h.Stats()[0]; st.Holds != want || st.Start < 3*time.Millisecond {
			t.Errorf("every launch %v: %d holds, starting in %v (%s); want %d", everyLaunch, st.Holds, st.Start, &log, want)
		}
	}
}
