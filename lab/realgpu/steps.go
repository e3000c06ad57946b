package realgpu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/gpusched"
	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/lab"
)

// burnerMS is the length of one burner kernel: within docs/driver.md §4's 20-100
// ms, long enough that a timeslice cuts into it.
const burnerMS = "40"

// check is one run's state: the probes, the burners and the daemon it
// started, all ended by cleanups.
type check struct {
	o      Options
	report *Report

	probes  *bpf.Probes
	spy     *ioctlspy.Spy
	stopSpy context.CancelFunc
	spyDone chan struct{}
	mu      sync.Mutex
	seen    map[uint32]map[string]int // pid → event or entry point → count
	allocs  map[uint32][]string       // pid → channel groups and channels decoded

	act        *gpusched.Actuator
	burners    []*burner
	daemon     *lab.Proc
	socket     string
	cgroups    []*lab.Cgroup
	xidsBefore []string // Xid lines in the kernel log before the check
}

// burner is one running burner.py.
type burner struct {
	proc   *lab.Proc
	groups []gpusched.Group
}

// progress is one line "MONOTONIC_NS COUNT" of a workload's output: the
// iterations it had finished at that time.
type progress struct{ at, count int64 }

// progressOf parses a workload's progress lines, skipping the others.
func progressOf(out string) []progress {
	var ps []progress
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		t, err1 := strconv.ParseInt(f[0], 10, 64)
		n, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 == nil && err2 == nil {
			ps = append(ps, progress{t, n})
		}
	}
	return ps
}

// rateOf is the iterations per second between two monotonic times, from
// the last progress line before each.
func rateOf(ps []progress, from, to int64) float64 {
	var a, b int64 = -1, -1
	for _, p := range ps {
		if p.at <= from {
			a = p.count
		}
		if p.at <= to {
			b = p.count
		}
	}
	if a < 0 || b < 0 {
		return 0
	}
	return float64(b-a) / (float64(to-from) / 1e9)
}

// completions are the monotonic times of the burner's finished iterations.
func (b *burner) completions() []int64 {
	out, _ := b.proc.Output()
	var ts []int64
	for _, p := range progressOf(out) {
		ts = append(ts, p.at)
	}
	return ts
}

// rate is the burner's iterations per second between two monotonic times.
func (b *burner) rate(from, to int64) float64 {
	out, _ := b.proc.Output()
	return rateOf(progressOf(out), from, to)
}

func monotonic() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func (c *check) python(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.o.Python, append([]string{filepath.Join(c.o.Work, args[0])}, args[1:]...)...)
	cmd.Dir = c.o.Work
	return cmd
}

// startProbes loads gpuarb's probes in this process and follows every
// event into the table, counting each process's events by kind and entry
// point.
func (c *check) startProbes() error {
	if c.spy != nil {
		return nil
	}
	if _, err := bpf.EnsureFilesystems(); err != nil {
		return err
	}
	devices, err := bpf.HostDevices()
	if err != nil {
		return err
	}
	p, err := bpf.Load(bpf.Options{Devices: devices})
	if err != nil {
		return fmt.Errorf("load the probes: %w", err)
	}
	if err := p.AttachHost(); err != nil {
		c.o.logf("realgpu: warning: %v", err)
	}
	spy, err := ioctlspy.NewSpy(p)
	if err != nil {
		p.Close()
		return err
	}
	spy.OnError = func(err error) { c.o.logf("realgpu: warning: %v", err) }
	c.probes, c.spy, c.seen, c.allocs = p, spy, map[uint32]map[string]int{}, map[uint32][]string{}
	ctx, cancel := context.WithCancel(context.Background())
	c.stopSpy, c.spyDone = cancel, make(chan struct{})
	go func() {
		defer close(c.spyDone)
		_ = spy.Run(ctx, c.record)
	}()
	return nil
}

// record counts one event under its kind, and its entry point where it
// names one (Func) or its control where it is a channel group's.
func (c *check) record(ev ioctlspy.Event) {
	name := strings.TrimPrefix(reflect.TypeOf(ev).String(), "*ioctlspy.")
	if f := reflect.ValueOf(ev).Elem().FieldByName("Func"); f.IsValid() && f.Kind() == reflect.String && f.String() != "" {
		name = f.String()
	}
	if tc, ok := ev.(*ioctlspy.TSGControl); ok {
		name += " " + tc.Name // which control the process made on its own group
	}
	pid := ev.Hdr().PID
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[pid] == nil {
		c.seen[pid] = map[string]int{}
	}
	c.seen[pid][name]++
	switch ev.(type) {
	case *ioctlspy.TSGAllocated, *ioctlspy.ChannelAllocated:
		if len(c.allocs[pid]) < 24 {
			c.allocs[pid] = append(c.allocs[pid], fmt.Sprint(ev))
		}
	}
}

func (c *check) closeProbes() {
	if c.spy == nil {
		return
	}
	c.stopSpy()
	c.spy.Close()
	<-c.spyDone
	c.probes.Close()
	c.spy = nil
}

// startBurners starts n burners and waits until each is calibrated and
// its channel groups are in the probes' table.
func (c *check) startBurners(ctx context.Context, n int) error {
	for i := 0; i < n; i++ {
		p, err := lab.Start(c.python(context.Background(), "burner.py", burnerMS), "")
		if err != nil {
			return err
		}
		c.burners = append(c.burners, &burner{proc: p})
	}
	for _, b := range c.burners {
		gs, err := c.groupsOf(ctx, b.proc, "ready")
		if err != nil {
			return err
		}
		b.groups = gs
	}
	return nil
}

// groupsOf waits (2 minutes at most) until process p's output starts with
// ready and its channel groups are in the probes' table, and returns them.
func (c *check) groupsOf(ctx context.Context, p *lab.Proc, ready string) ([]gpusched.Group, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, stderr := p.Output()
		if proc, ok := c.spy.Table().Process(uint32(p.Cmd.Process.Pid)); ok && strings.HasPrefix(out, ready) {
			if gs := proc.Groups(); len(gs) > 0 {
				return gs, nil
			}
		}
		switch {
		case p.Done():
			return nil, fmt.Errorf("pid %d exited: %s", p.Cmd.Process.Pid, lastLine(stderr))
		case time.Now().After(deadline):
			return nil, fmt.Errorf("pid %d: no channel group seen by the probes within 2 minutes", p.Cmd.Process.Pid)
		}
		if err := lab.Sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

func (c *check) stopBurners() {
	for _, b := range c.burners {
		b.proc.Stop()
	}
	c.burners = nil
}

func (c *check) cleanups() {
	c.stopBurners()
	c.closeProbes()
	c.stopDaemon()
	if c.act != nil {
		c.act.Close()
	}
	for _, cg := range c.cgroups {
		_ = lab.RemoveCgroup(cg.Path)
		_ = os.Remove(filepath.Dir(cg.Path)) // the check's parent, once empty
	}
}

// costWithout times launches before any probe is loaded.
func (c *check) costWithout(ctx context.Context, s *Step) error {
	c.xidsBefore = xidLines()
	ns, err := c.launchCost(ctx)
	s.Values["ns_per_launch"] = ns
	s.Summary = fmt.Sprintf("%.0f ns per launch (100k empty kernels through ctypes)", ns)
	return err
}

func (c *check) launchCost(ctx context.Context) (float64, error) {
	out, err := c.python(ctx, "launch.py", "100000").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("launch.py: %w: %s", err, lastLine(string(out)))
	}
	return strconv.ParseFloat(lastLine(string(out)), 64)
}

// ownership duplicates a burner's control file and asks the driver
// through it and through a fresh open; reads the default timeslice.
func (c *check) ownership(ctx context.Context, s *Step) error {
	if err := c.startProbes(); err != nil {
		return err
	}
	if err := c.startBurners(ctx, 3); err != nil {
		return err
	}
	g := c.burners[0].groups[0]
	s.Values["group"] = g
	for i, b := range c.burners {
		s.Values[fmt.Sprintf("burner%d_groups", i)] = len(b.groups)
	}
	c.mu.Lock()
	s.Values["allocations"] = c.allocs[g.PID]
	c.mu.Unlock()
	c.act = gpusched.New("") // the nvidia driver
	o, err := c.act.CheckOwnership(g)
	s.Values["ownership"] = o
	if err != nil {
		return err
	}
	ts, tsErr := c.act.Timeslice(g)
	s.Values["default_timeslice_us"] = ts.Microseconds()
	s.Summary = fmt.Sprintf("pidfd_getfd of pid %d fd %d (%s, %d:%d): GET_INFO 0x%x through the duplicate, 0x%x through a fresh open; GET_TIMESLICE %v",
		g.PID, g.FD, o.Node, o.Major, o.Minor, o.ViaDuplicate, o.ViaFresh, ts)
	switch {
	case o.ViaDuplicate != 0:
		return fmt.Errorf("the driver refused GET_INFO through the process's own file (0x%x)", o.ViaDuplicate)
	case tsErr != nil:
		return fmt.Errorf("GET_TIMESLICE: %w", tsErr)
	}
	return nil
}

// driverMemory reads, through the first burner's group, the driver's
// figure of each burner's video memory (GET_PID_INFO) beside what the
// probes charged it: the difference is a context's own buffers and
// whatever no decoded escape carried. It also reads the GPU's memory as
// share limits take it (FB_GET_INFO_V2 HEAP_SIZE), to set beside
// nvidia-smi's total.
func (c *check) driverMemory(_ context.Context, s *Step) error {
	if c.act == nil || len(c.burners) == 0 {
		return fmt.Errorf("no burner to read through (the ownership step did not run)")
	}
	var pids []uint32
	for _, b := range c.burners {
		pids = append(pids, uint32(b.proc.Cmd.Process.Pid))
	}
	g := c.burners[0].groups[0]
	driver, err := c.act.VideoMemory(g, pids)
	if err != nil {
		return fmt.Errorf("GET_PID_INFO through pid %d: %w", g.PID, err)
	}
	var parts []string
	for _, pid := range pids {
		charged, _ := c.spy.Table().MemoryOf(pid)
		d, ok := driver[pid]
		s.Values[fmt.Sprintf("pid%d_driver_bytes", pid)] = d
		s.Values[fmt.Sprintf("pid%d_charged_bytes", pid)] = charged[int(g.GPU)]
		if !ok {
			parts = append(parts, fmt.Sprintf("pid %d: no answer", pid))
			continue
		}
		parts = append(parts, fmt.Sprintf("pid %d: driver %.1f MiB, charged %.1f MiB (difference %.1f MiB)", pid,
			float64(d)/(1<<20), float64(charged[int(g.GPU)])/(1<<20), (float64(d)-float64(charged[int(g.GPU)]))/(1<<20)))
	}
	size, sizeErr := c.act.MemorySize(g)
	s.Values["gpu_heap_bytes"] = size
	parts = append(parts, fmt.Sprintf("GPU heap (FB_GET_INFO_V2 HEAP_SIZE) %.0f MiB (%v)", float64(size)/(1<<20), sizeErr))
	s.Summary = strings.Join(parts, "; ")
	switch {
	case len(driver) == 0:
		return fmt.Errorf("the driver answered for none of pids %v", pids)
	case sizeErr != nil:
		return fmt.Errorf("FB_GET_INFO_V2 through pid %d: %w", g.PID, sizeErr)
	}
	return nil
}

func (c *check) ready() error {
	if len(c.burners) < 3 || c.act == nil {
		return errors.New("no burners: the ownership step failed")
	}
	return nil
}

// defaultTimeslice is the burners' timeslice as the driver reads it back
// before a step changes it (the default CUDA set), once they are ready.
func (c *check) defaultTimeslice() (time.Duration, error) {
	if err := c.ready(); err != nil {
		return 0, err
	}
	return c.act.Timeslice(c.burners[0].groups[0])
}

// rates are the burners' iterations per second over the next d, the
// first half second left out.
func (c *check) rates(ctx context.Context, d time.Duration) ([]float64, error) {
	from := monotonic() + int64(500*time.Millisecond)
	if err := lab.Sleep(ctx, d); err != nil {
		return nil, err
	}
	to := monotonic()
	out := make([]float64, len(c.burners))
	for i, b := range c.burners {
		out[i] = b.rate(from, to)
	}
	return out, nil
}

func (c *check) apply(changes ...gpusched.Change) error {
	_, err := c.act.Apply(changes)
	return err
}

func (c *check) setSlices(slices ...time.Duration) error {
	var changes []gpusched.Change
	for i, b := range c.burners {
		for _, g := range b.groups {
			changes = append(changes, gpusched.Change{Group: g, Timeslice: slices[i]})
		}
	}
	return c.apply(changes...)
}

// timeslices sets 8000 µs on the first burner and 500 µs on the others,
// committed by a runlist restart, and compares throughput before and
// after; the default is put back after.
func (c *check) timeslices(ctx context.Context, s *Step) error {
	def, err := c.defaultTimeslice()
	if err != nil {
		return err
	}
	before, err := c.rates(ctx, 4*time.Second)
	if err != nil {
		return err
	}
	if err := c.setSlices(8000*time.Microsecond, 500*time.Microsecond, 500*time.Microsecond); err != nil {
		return fmt.Errorf("SET_TIMESLICE: %w", err)
	}
	after, err := c.rates(ctx, 4*time.Second)
	restore := c.setSlices(def, def, def)
	if err != nil {
		return err
	}
	ratio := func(r []float64) float64 { return r[0] / max((r[1]+r[2])/2, 1e-9) }
	shares := timeShares(before, after)
	s.Values["rates_before"], s.Values["rates_after"] = before, after
	s.Values["ratio_before"], s.Values["ratio_after"] = ratio(before), ratio(after)
	s.Values["time_shares_after"] = shares
	s.Summary = fmt.Sprintf("iterations/s %.1f/%.1f/%.1f at the default %v, %.1f/%.1f/%.1f at 8000/500/500 µs: first to others %.2f → %.2f (timeslices 16:1); GPU time %.3f/%.3f/%.3f, first to others %.1f:1",
		before[0], before[1], before[2], def, after[0], after[1], after[2], ratio(before), ratio(after),
		shares[0], shares[1], shares[2], shares[0]/max((shares[1]+shares[2])/2, 1e-9))
	if restore != nil {
		return fmt.Errorf("put the default timeslice back: %w", restore)
	}
	return nil
}

// timeShares are the burners' shares of GPU time after a change, from
// their iterations per second before (every burner at the same timeslice,
// so each had a third) and after: a burner's kernels differ in length
// (each calibrates beside the others), so its iterations count its time
// only against its own rate.
func timeShares(before, after []float64) []float64 {
	out := make([]float64, len(after))
	var total float64
	for i := range after {
		out[i] = after[i] / max(before[i], 1e-9)
		total += out[i]
	}
	for i := range out {
		out[i] /= max(total, 1e-9)
	}
	return out
}

// shortSlices are the timeslices the switch-cost step gives every burner:
// around gpuarb's shortest (arbiter.MinSlice) and below it, where the
// closed loops the fuzzer finds latency-held would need their neighbours.
var shortSlices = []time.Duration{4096 * time.Microsecond, 1024 * time.Microsecond, 512 * time.Microsecond, 200 * time.Microsecond, 100 * time.Microsecond, 50 * time.Microsecond}

// switchWindow is how long the switch-cost step measures each timeslice:
// the burners finish about 25 kernels of burnerMS a second between them,
// so a shorter window would not resolve a loss of a few percent.
const switchWindow = 5 * time.Second

// switchCost measures what a channel-group switch costs the GPU: every
// burner gets the same timeslice, the default and then each of
// shortSlices (a slice the driver refuses is recorded and skipped), and
// the burners' iterations per second against the default's give each
// switch's cost (switchCostAt). The default is put back after. It decides
// how short gpuarb's slices may go (arbiter.MinSlice) and what the
// simulated GPU's switches cost.
func (c *check) switchCost(ctx context.Context, s *Step) error {
	def, err := c.defaultTimeslice()
	if err != nil {
		return err
	}
	total := func(r []float64) float64 {
		var t float64
		for _, x := range r {
			t += x
		}
		return t
	}
	base, err := c.rates(ctx, switchWindow)
	if err != nil {
		return err
	}
	s.Values["default_us"], s.Values["rate_default"] = def.Microseconds(), total(base)
	var parts []string
	for _, slice := range shortSlices {
		key := fmt.Sprintf("%dus", slice.Microseconds())
		if err := c.setSlices(slice, slice, slice); err != nil {
			s.Values["refused_"+key] = err.Error()
			parts = append(parts, fmt.Sprintf("%v refused", slice))
			continue
		}
		r, err := c.rates(ctx, switchWindow)
		if err != nil {
			_ = c.setSlices(def, def, def)
			return err
		}
		q := total(r) / max(total(base), 1e-9)
		s.Values["rate_"+key], s.Values["throughput_"+key] = total(r), q
		part := fmt.Sprintf("%v: %.3f of the default's throughput", slice, q)
		if cost, ok := switchCostAt(slice, def, q); ok {
			us := cost.Seconds() * 1e6
			s.Values["switch_us_"+key] = us
			part += fmt.Sprintf(", a switch ≈ %.1f µs", us)
		}
		parts = append(parts, part)
	}
	s.Summary = fmt.Sprintf("every burner at the same timeslice, %.1f iterations/s at the default %v; %s",
		total(base), def, strings.Join(parts, "; "))
	if err := c.setSlices(def, def, def); err != nil {
		return fmt.Errorf("put the default timeslice back: %w", err)
	}
	return nil
}

// switchCostAt is the cost of one switch that makes saturating channel
// groups at timeslice slice run q times as fast as at timeslice def: each
// slice of useful work pays one switch, so the throughputs stand as
// slice/(slice+cost) to def/(def+cost). ok is false where q says nothing
// (at or above what no switch cost at all would give, or no faster than
// nothing).
func switchCostAt(slice, def time.Duration, q float64) (time.Duration, bool) {
	s, d := float64(slice), float64(def)
	if q <= 0 || q >= 1 || q*d <= s {
		return 0, false
	}
	return time.Duration(s * d * (1 - q) / (q*d - s)), true
}

// pauseResume disables the first burner's channels (FIFO_DISABLE_CHANNELS
// and a runlist restart), sees when it stops and whether the others take
// its time, then enables them and sees it carry on.
func (c *check) pauseResume(ctx context.Context, s *Step) error {
	if err := c.ready(); err != nil {
		return err
	}
	before, err := c.rates(ctx, 3*time.Second)
	if err != nil {
		return err
	}
	pause, resume := true, false
	var changes []gpusched.Change
	for _, g := range c.burners[0].groups {
		changes = append(changes, gpusched.Change{Group: g, Pause: &pause})
	}
	t0 := monotonic()
	if err := c.apply(changes...); err != nil {
		return fmt.Errorf("disable: %w", err)
	}
	during, err := c.rates(ctx, 3*time.Second)
	if err != nil {
		return err
	}
	last := t0
	for _, t := range c.burners[0].completions() {
		last = max(last, t)
	}
	for i := range changes {
		changes[i].Pause = &resume
	}
	t1 := monotonic()
	if err := c.apply(changes...); err != nil {
		return fmt.Errorf("enable: %w", err)
	}
	after, err := c.rates(ctx, 3*time.Second)
	if err != nil {
		return err
	}
	first := int64(-1)
	for _, t := range c.burners[0].completions() {
		if t > t1 {
			first = t - t1
			break
		}
	}
	stopMS := float64(last-t0) / 1e6
	s.Values["rates_before"], s.Values["rates_paused"], s.Values["rates_resumed"] = before, during, after
	s.Values["last_completion_after_pause_ms"] = stopMS
	s.Values["first_completion_after_resume_ms"] = float64(first) / 1e6
	s.Summary = fmt.Sprintf("last iteration of the paused burner %.0f ms after the disable; iterations/s %.1f/%.1f/%.1f before, %.1f/%.1f/%.1f paused, %.1f/%.1f/%.1f resumed (first %.0f ms after the enable)",
		stopMS, before[0], before[1], before[2], during[0], during[1], during[2], after[0], after[1], after[2], float64(first)/1e6)
	switch {
	case during[0] > 0:
		return fmt.Errorf("the paused burner kept running (%.1f iterations/s)", during[0])
	case first < 0:
		return errors.New("the paused burner did not resume")
	}
	return nil
}

// holdCycles and holdPeriod shape the hold-cost step: a cycle a
// holdPeriod, each pausing two burners for holdLength, as gpuarb's latency
// holds do around an inference request (enforce/hold.go).
const (
	holdCycles = 50
	holdPeriod = 20 * time.Millisecond
	holdLength = 2 * time.Millisecond
)

// holdCost times what a latency hold asks of the driver: the pause of two
// burners' groups (FIFO_DISABLE_CHANNELS for each, one RESTART_RUNLIST)
// and their resume, holdCycles times for each way of pausing the daemon
// has (evicting what runs, and only descheduling it), with the burners'
// throughput during the cycles against before. gpuarb turns holds on only
// where the pause returns (plus the daemon's wake-up) sooner than the
// others' shortest slices bound the wait (1024 µs each here); on the
// simulated GPU a pause took about 320 µs.
func (c *check) holdCost(ctx context.Context, s *Step) error {
	if err := c.ready(); err != nil {
		return err
	}
	before, err := c.rates(ctx, 2*time.Second)
	if err != nil {
		return err
	}
	s.Values["rates_before"] = before
	parts := []string{fmt.Sprintf("iterations/s %.1f/%.1f/%.1f before", before[0], before[1], before[2])}
	for _, mode := range []struct {
		name        string
		keepRunning bool
	}{{"evict", false}, {"deschedule", true}} {
		pauses, resumes, during, err := c.cycleHolds(ctx, mode.keepRunning)
		if err != nil {
			return fmt.Errorf("%s: %w", mode.name, err)
		}
		s.Values[mode.name] = map[string]any{"pause_us": pauses, "resume_us": resumes, "rates_during": during}
		parts = append(parts, fmt.Sprintf("%s: pausing two burners p50 %.0f µs, p99 %.0f µs; resuming them p50 %.0f µs, p99 %.0f µs; iterations/s %.1f/%.1f/%.1f during",
			mode.name, lab.Percentile(pauses, 50), lab.Percentile(pauses, 99), lab.Percentile(resumes, 50), lab.Percentile(resumes, 99),
			during[0], during[1], during[2]))
	}
	s.Summary = fmt.Sprintf("%d cycles of %v in %v each way; %s", holdCycles, holdLength, holdPeriod, strings.Join(parts, "; "))
	return nil
}

// cycleHolds pauses the second and third burners for holdLength every
// holdPeriod, holdCycles times, evicting them or (keepRunning) only
// descheduling them, and returns each pause's and resume's time (µs) and
// every burner's iterations a second meanwhile.
func (c *check) cycleHolds(ctx context.Context, keepRunning bool) (pauses, resumes, during []float64, err error) {
	var changes []gpusched.Change
	for _, b := range c.burners[1:] {
		for _, g := range b.groups {
			changes = append(changes, gpusched.Change{Group: g})
		}
	}
	set := func(pause bool) (float64, error) {
		for i := range changes {
			changes[i].Pause, changes[i].KeepRunning = &pause, pause && keepRunning
		}
		start := time.Now()
		err := c.apply(changes...)
		return float64(time.Since(start).Microseconds()), err
	}
	from := monotonic()
	for range holdCycles {
		us, err := set(true)
		if err != nil {
			_, _ = set(false)
			return nil, nil, nil, fmt.Errorf("pause: %w", err)
		}
		pauses = append(pauses, us)
		time.Sleep(holdLength)
		if us, err = set(false); err != nil {
			return nil, nil, nil, fmt.Errorf("resume: %w", err)
		}
		resumes = append(resumes, us)
		if err := lab.Sleep(ctx, holdPeriod-holdLength); err != nil {
			return nil, nil, nil, err
		}
	}
	to := monotonic()
	for _, b := range c.burners {
		during = append(during, b.rate(from, to))
	}
	return pauses, resumes, during, nil
}

// latencySlices are the timeslices the latency step gives the burners
// beside the probe: gpuarb's floor on the nvidia driver and below it.
var latencySlices = []time.Duration{1024 * time.Microsecond, 512 * time.Microsecond, 200 * time.Microsecond}

// latencyWindow is how long the latency step measures each setting: 300
// requests at 100 a second.
const latencyWindow = 3 * time.Second

// latency measures an inference service's shape (latency.py: a request of
// one ~1 ms matrix multiply and a sync, 100 a second) alone (the burners
// paused), beside the three burners at their default timeslice, and
// beside them at each of latencySlices: its p50 and p99 against alone's
// and the burners' throughput against their default's. It tells what
// shorter slices for the others buy a latency tenant on this GPU, and at
// what cost: where a switch costs hundreds of µs, the other way is to take
// them off the GPU while it has work.
func (c *check) latency(ctx context.Context, s *Step) error {
	def, err := c.defaultTimeslice()
	if err != nil {
		return err
	}
	pauseAll := func(on bool) error {
		var changes []gpusched.Change
		for _, b := range c.burners {
			for _, g := range b.groups {
				changes = append(changes, gpusched.Change{Group: g, Pause: &on})
			}
		}
		return c.apply(changes...)
	}
	if err := pauseAll(true); err != nil {
		return fmt.Errorf("disable the burners: %w", err)
	}
	p, err := lab.Start(c.python(context.Background(), "latency.py", "1", "100", "120"), "")
	if err != nil {
		_ = pauseAll(false)
		return err
	}
	defer p.Stop()
	if _, err := c.groupsOf(ctx, p, "ready"); err != nil {
		_ = pauseAll(false)
		return err
	}
	measure := func(name string) (p50, p99, rate float64, err error) {
		from := monotonic() + int64(500*time.Millisecond)
		if err := lab.Sleep(ctx, latencyWindow+500*time.Millisecond); err != nil {
			return 0, 0, 0, err
		}
		to := monotonic()
		var lats []float64
		for _, pr := range progressLines(p) {
			if pr.at >= from && pr.at < to {
				lats = append(lats, float64(pr.count)/1e6)
			}
		}
		if len(lats) == 0 {
			return 0, 0, 0, fmt.Errorf("%s: no request completed", name)
		}
		for _, b := range c.burners {
			rate += b.rate(from, to)
		}
		p50, p99 = lab.Percentile(lats, 50), lab.Percentile(lats, 99)
		s.Values[name] = map[string]any{"p50_ms": p50, "p99_ms": p99, "requests": len(lats), "burner_rate": rate}
		return p50, p99, rate, nil
	}
	_, alone, _, err := measure("alone")
	if resume := pauseAll(false); err == nil {
		err = resume
	}
	if err != nil {
		return err
	}
	var parts []string
	_, p99, base, err := measure("default")
	if err != nil {
		return err
	}
	parts = append(parts, fmt.Sprintf("beside the burners at %v p99 %.2f ms (%.2f×)", def, p99, p99/alone))
	for _, slice := range latencySlices {
		if err := c.setSlices(slice, slice, slice); err != nil {
			return fmt.Errorf("SET_TIMESLICE %v: %w", slice, err)
		}
		_, p99, rate, err := measure(fmt.Sprintf("others_%dus", slice.Microseconds()))
		if err != nil {
			_ = c.setSlices(def, def, def)
			return err
		}
		parts = append(parts, fmt.Sprintf("them at %v p99 %.2f ms (%.2f×, their throughput %.3f of the default's)", slice, p99, p99/alone, rate/max(base, 1e-9)))
	}
	s.Summary = fmt.Sprintf("requests of one ~1 ms matrix multiply, 100 a second: alone p99 %.2f ms; %s", alone, strings.Join(parts, "; "))
	return c.setSlices(def, def, def)
}

// preempt times PREEMPT (bWait) on the second burner's group.
func (c *check) preempt(ctx context.Context, s *Step) error {
	if err := c.ready(); err != nil {
		return err
	}
	g := c.burners[1].groups[0]
	var us []float64
	for i := 0; i < 10; i++ {
		start := time.Now()
		if err := c.act.Preempt(g); err != nil {
			return err
		}
		us = append(us, float64(time.Since(start).Microseconds()))
		if err := lab.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	sort.Float64s(us)
	s.Values["preempt_us"] = us
	s.Summary = fmt.Sprintf("PREEMPT (wait) median %.0f µs, max %.0f µs over 10", us[len(us)/2], us[len(us)-1])
	return nil
}

// sliceRatios are the timeslice pairs (1:3) the slice-shares step gives
// its two loops: gpuarb's floor beside three times it on the nvidia
// driver, and its base beside three times that.
var sliceRatios = [][2]time.Duration{
	{1024 * time.Microsecond, 3072 * time.Microsecond},
	{2048 * time.Microsecond, 6144 * time.Microsecond},
}

// sliceWindow is how long the slice-shares step measures each pair.
const sliceWindow = 4 * time.Second

// sliceShares gives two equal PyTorch loops (4096² matrix multiplies, a
// sync every 10: kernels of a few ms, where the burners' are 40 ms) equal
// timeslices, then each pair of sliceRatios, without gpuarb, and measures
// the second loop's part of their GPU time by their iterations and by
// NVML: whether a slice buys its length of GPU time with such kernels
// (the arbitration step's loops) and what NVML counts of it.
func (c *check) sliceShares(ctx context.Context, s *Step) error {
	if err := c.startProbes(); err != nil {
		return err
	}
	if c.act == nil {
		c.act = gpusched.New("") // the nvidia driver
	}
	var loops []*lab.Proc
	var groups [][]gpusched.Group
	for i := 0; i < 2; i++ {
		p, err := lab.Start(c.python(context.Background(), "eager.py", "120", "4096"), "")
		if err != nil {
			return err
		}
		defer p.Stop()
		loops = append(loops, p)
	}
	for _, p := range loops {
		// The first progress line: a sync done, its groups allocated.
		gs, err := c.groupsOf(ctx, p, "")
		if err != nil {
			return err
		}
		for len(progressLines(p)) == 0 {
			if p.Done() {
				_, stderr := p.Output()
				return fmt.Errorf("pid %d exited: %s", p.Cmd.Process.Pid, lastLine(stderr))
			}
			if err := lab.Sleep(ctx, 100*time.Millisecond); err != nil {
				return err
			}
		}
		groups = append(groups, gs)
	}
	def, err := c.act.Timeslice(groups[0][0])
	if err != nil {
		return fmt.Errorf("GET_TIMESLICE: %w", err)
	}
	set := func(a, b time.Duration) error {
		var changes []gpusched.Change
		for i, d := range []time.Duration{a, b} {
			for _, g := range groups[i] {
				changes = append(changes, gpusched.Change{Group: g, Timeslice: d})
			}
		}
		return c.apply(changes...)
	}
	var parts []string
	for _, pair := range append([][2]time.Duration{{def, def}}, sliceRatios...) {
		if err := set(pair[0], pair[1]); err != nil {
			return fmt.Errorf("SET_TIMESLICE %v/%v: %w", pair[0], pair[1], err)
		}
		if err := lab.Sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
		pm, err := startPmon(ctx, int(sliceWindow/time.Second))
		if err != nil {
			return err
		}
		from := monotonic()
		if err := lab.Sleep(ctx, sliceWindow); err != nil {
			return err
		}
		to := monotonic()
		nvml, text, err := pm.wait()
		if err != nil {
			return err
		}
		var rates, sm []float64
		for _, p := range loops {
			rates = append(rates, rateOf(progressLines(p), from, to))
			sm = append(sm, lab.Mean(nvml[p.Cmd.Process.Pid]))
		}
		byIterations := rates[1] / max(rates[0]+rates[1], 1e-9)
		byNVML := sm[1] / max(sm[0]+sm[1], 1e-9)
		key := fmt.Sprintf("%dus_%dus", pair[0].Microseconds(), pair[1].Microseconds())
		s.Values[key] = map[string]any{"rates": rates, "nvml_sm": sm, "second_share": byIterations, "second_share_nvml": byNVML, "pmon": text}
		parts = append(parts, fmt.Sprintf("%v/%v: the second %.1f%% of their iterations, %.1f%% by NVML (%.1f/%.1f iterations/s)",
			pair[0], pair[1], 100*byIterations, 100*byNVML, rates[0], rates[1]))
	}
	s.Summary = strings.Join(parts, "; ")
	return set(def, def)
}

// progressLines are a running workload's progress so far.
func progressLines(p *lab.Proc) []progress {
	out, _ := p.Output()
	return progressOf(out)
}

// census runs PyTorch eager and CUDA-graph replay and records which libcuda
// entry points and RM allocations the probes saw for each.
func (c *check) census(ctx context.Context, s *Step) error {
	if err := c.startProbes(); err != nil {
		return err
	}
	var parts []string
	for _, script := range []string{"eager.py", "graph.py"} {
		cmd := c.python(ctx, script, "5")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %w: %s", script, err, lastLine(string(out)))
		}
		time.Sleep(200 * time.Millisecond) // the ring's last records
		pid := uint32(cmd.Process.Pid)
		c.mu.Lock()
		seen, allocs := c.seen[pid], c.allocs[pid]
		c.mu.Unlock()
		name := strings.TrimSuffix(script, ".py")
		s.Values[name] = seen
		s.Values[name+"_allocations"] = allocs
		s.Values[name+"_output"] = lastLine(string(out))
		parts = append(parts, fmt.Sprintf("%s: %s", name, top(seen, 6)))
		if len(seen) == 0 {
			return fmt.Errorf("%s: the probes saw nothing of pid %d", script, pid)
		}
	}
	s.Summary = strings.Join(parts, "; ")
	return nil
}

// top formats the n most frequent entries of m.
func top(m map[string]int, n int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	var parts []string
	for i, k := range keys {
		if i == n {
			break
		}
		parts = append(parts, fmt.Sprintf("%s×%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// xidLines are the kernel log's Xid reports.
func xidLines() []string {
	out, _ := exec.Command("dmesg").Output()
	var xs []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "Xid") {
			xs = append(xs, l)
		}
	}
	return xs
}

// xids reports the Xid errors the check caused.
func (c *check) xids(_ context.Context, s *Step) error {
	now := xidLines()
	var fresh []string
	if len(now) > len(c.xidsBefore) {
		fresh = now[len(c.xidsBefore):]
	}
	s.Values["new_xids"] = fresh
	s.Summary = fmt.Sprintf("%d new Xid reports in the kernel log", len(fresh))
	if len(fresh) > 0 {
		return fmt.Errorf("Xid errors: %s", strings.Join(fresh, "; "))
	}
	return nil
}

// costWith times launches while the daemon's probes are attached.
func (c *check) costWith(ctx context.Context, s *Step) error {
	if c.daemon == nil {
		return errors.New("no daemon: the meter step failed")
	}
	ns, err := c.launchCost(ctx)
	s.Values["ns_per_launch"] = ns
	if err != nil {
		return err
	}
	var without float64
	for _, st := range c.report.Steps {
		if v, ok := st.Values["ns_per_launch"].(float64); ok && st.OK {
			without = v
		}
	}
	s.Values["probe_ns_per_launch"] = ns - without
	s.Summary = fmt.Sprintf("%.0f ns per launch with the daemon's probes (%+.0f ns)", ns, ns-without)
	return nil
}

func (c *check) stopDaemon() {
	if c.daemon != nil {
		c.daemon.Interrupt(10 * time.Second)
		c.daemon = nil
	}
	_ = os.RemoveAll(pinPath)
}
