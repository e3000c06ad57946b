package enforce

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/gpuarb/gpuarb/arbiter"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/gpusched"
	"github.com/gpuarb/gpuarb/ledger"
	"github.com/gpuarb/gpuarb/meter"
)

// groupKey names one channel group of one process.
type groupKey struct{ pid, client, tsg uint32 }

func keyOf(g gpusched.Group) groupKey { return groupKey{g.PID, g.Client, g.TSG} }

// steered is what gpuarb set on one channel group.
type steered struct {
	rec   gpusched.Steered
	slice time.Duration // 0: untouched
	// pausedBy says who has the group off the GPU (none: it runs).
	pausedBy pauseCause
}

// pauseCause is who takes a channel group off the GPU; the group runs
// again when none of them holds it.
type pauseCause uint8

const (
	// byDuty: its tenant's window gater, for the rest of each period its
	// decision's run fraction leaves.
	byDuty pauseCause = 1 << iota
	// ByHold: a latency tenant's hold, while its work is pending.
	ByHold
)

// Steering is the daemon's hold on the GPUs' own schedulers: whether this
// host allows it, per GPU whether the driver answers, and per channel
// group what gpuarb set. Its methods are safe for concurrent use; they
// talk to the driver, so the daemon calls them without its own lock.
type Steering struct {
	act        *gpusched.Actuator
	fakeSocket string // the simulated GPU's socket, recorded with each group
	ledger     *gpusched.Ledger
	meter      *meter.Meter
	log        *slog.Logger
	Off        string // why this host cannot be steered ("": it can)
	// unreadable is why the driver cannot be asked through the tenants'
	// files at all ("": it can), steering on or off.
	unreadable string
	// Reprobe is how long a GPU counts as not steerable before it is
	// probed again (0: defaultReprobe); set before the first step.
	Reprobe time.Duration

	pauseMu sync.Mutex // serializes pause
	mu      sync.Mutex
	gpus    map[int]gpuVerdict // per GPU probed: whether it can be steered
	slices  map[int]gpusched.Slices
	groups  map[groupKey]*steered
	refused refusals
}

// gpuRefusalQuorum is how many processes' controls the driver must refuse
// on a GPU where it has accepted none before the GPU itself counts as not
// steerable (a vGPU guest, a driver that does not allow it): fewer, or
// beside accepted ones, say something of those processes alone (a client
// bound to a file the process has since closed, handles reused), and
// only their tenants are paced at the launch gate instead: one odd
// process must not turn steering off for every other on its GPU.
const gpuRefusalQuorum = 3

// refusals remembers the processes that cannot be steered (with their GPU,
// and whether the driver itself refused them), and per GPU whether it has
// accepted any: what decides between one process's trouble and a GPU that
// cannot be steered. Not safe for concurrent use.
type refusals struct {
	pids     map[uint32]refusedProcess
	accepted map[int]bool
}

// refusedProcess is a process that cannot be steered: its GPU, and
// whether the driver refused it (rather than its descriptor no longer
// being its control file).
type refusedProcess struct {
	gpu    int
	driver bool
}

// note records that pid's control on gpu failed (byDriver: the driver
// refused it) and tells whether that was news, and whether the GPU itself
// now counts as refused: only refusals of the driver count for that.
func (r *refusals) note(gpu int, pid uint32, byDriver bool) (fresh, gpuRefused bool) {
	if r.pids == nil {
		r.pids = map[uint32]refusedProcess{}
	}
	_, known := r.pids[pid]
	r.pids[pid] = refusedProcess{gpu: gpu, driver: byDriver}
	n := 0
	for _, p := range r.pids {
		if p.gpu == gpu && p.driver {
			n++
		}
	}
	return !known, !r.accepted[gpu] && n >= gpuRefusalQuorum
}

// accept records that the driver took a control on gpu.
func (r *refusals) accept(gpu int) {
	if r.accepted == nil {
		r.accepted = map[int]bool{}
	}
	r.accepted[gpu] = true
}

// forget drops the processes no longer live.
func (r *refusals) forget(live map[uint32]bool) {
	for pid := range r.pids {
		if !live[pid] {
			delete(r.pids, pid)
		}
	}
}

// NewSteering prepares steering, or says why it is off: disabled by the
// daemon's flag, or not allowed on this host (gpusched.Available).
func NewSteering(disabled bool, fakeSocket, ledgerPath string, m *meter.Meter, log *slog.Logger) (*Steering, error) {
	s := &Steering{act: gpusched.New(fakeSocket), fakeSocket: fakeSocket, meter: m, log: log, gpus: map[int]gpuVerdict{},
		slices: map[int]gpusched.Slices{}, groups: map[groupKey]*steered{}}
	if err := gpusched.Available(); err != nil {
		s.unreadable = err.Error()
	}
	switch {
	case disabled:
		s.Off = "disabled (--gpu-scheduler off)"
	default:
		s.Off = s.unreadable
	}
	l, err := gpusched.OpenLedger(ledgerPath)
	if errors.Is(err, ledger.ErrUnreadable) {
		log.Error("the steering ledger", "err", err)
	} else if err != nil {
		return nil, err
	}
	s.ledger = l
	return s, nil
}

// DriverMemory reads the driver's own figure of each of pids' video memory
// on probe's GPU, through probe's group (gpusched.Actuator.VideoMemory). It
// reads and changes nothing, so it needs what steering needs of the host,
// not steering itself: it answers with steering off too.
func (s *Steering) DriverMemory(probe gpusched.Group, pids []uint32) (map[uint32]uint64, error) {
	if s.unreadable != "" {
		return nil, errors.New(s.unreadable)
	}
	return s.act.VideoMemory(probe, pids)
}

// GPUMemorySize reads the memory of probe's GPU from the driver
// (gpusched.Actuator.MemorySize); like DriverMemory, with steering off too.
func (s *Steering) GPUMemorySize(probe gpusched.Group) (uint64, error) {
	if s.unreadable != "" {
		return 0, errors.New(s.unreadable)
	}
	return s.act.MemorySize(probe)
}

// gpuVerdict is what gpuarb found of one GPU: whether it can be steered
// ("" when it can, else why not) and when it decided.
type gpuVerdict struct {
	why string
	at  time.Time
}

// defaultReprobe is how long a GPU counts as not steerable before it is
// probed again (Steering.Reprobe), through the group of a process the
// driver has not refused: a quorum of one tenant's processes must not keep
// every other tenant off the GPU's scheduler for good.
const defaultReprobe = 10 * time.Second

// GPUState says whether a GPU can be steered, probing it through one of its
// groups the first time, and again Reprobe after it found it could
// not: "" when it can, else why not. Only the driver can make a GPU
// unsteerable (it refused a quorum of processes, accepted none); any other
// failure of the probe (a process's descriptor no longer its control
// file, a process gone) is that process's trouble: it is refused, and
// its tenant paced, while the GPU is probed through the next one.
func (s *Steering) GPUState(gpu int, probe gpusched.Group) string {
	if s.Off != "" {
		return s.Off
	}
	s.mu.Lock()
	v, known := s.gpus[gpu]
	_, refusedProbe := s.refused.pids[probe.PID]
	s.mu.Unlock()
	if known && (v.why == "" || time.Since(v.at) < cmp.Or(s.Reprobe, defaultReprobe) || refusedProbe) {
		return v.why
	}
	err := s.act.Probe(probe)
	switch {
	case err == nil:
		s.mu.Lock()
		s.gpus[gpu] = gpuVerdict{at: time.Now()}
		s.refused.accept(gpu)
		s.mu.Unlock()
		return ""
	case errors.Is(err, gpusched.ErrGone):
		return v.why // probed again through the next tenant's group
	}
	// Refused (the driver answered) or not that process's control file
	// any more: the GPU only once the driver has refused a quorum of
	// processes and accepted none.
	s.noteRefused(probe, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gpus[gpu].why
}

// SlicesOf returns the timeslices GPU gpu runs its channel groups well at,
// read through group g the first time (before gpuarb changes any of the
// GPU's groups: a steerable GPU's slices are read in the step that first
// finds it steerable); ok is false while they could not be read.
func (s *Steering) SlicesOf(gpu int, g gpusched.Group) (_ gpusched.Slices, ok bool) {
	s.mu.Lock()
	sl, known := s.slices[gpu]
	s.mu.Unlock()
	if known {
		return sl, true
	}
	sl, err := s.act.Slices(g)
	if err != nil {
		s.log.Warn("read a GPU's timeslices: its default bounds hold", "gpu", gpu, "pid", g.PID, "err", err)
		return sl, false
	}
	s.log.Info("GPU timeslices", "gpu", gpu, "base", sl.Base, "min", sl.Min)
	s.mu.Lock()
	s.slices[gpu] = sl
	s.mu.Unlock()
	return sl, true
}

// noteRefused records that the driver refused a control of group g's
// process (its tenant is paced at the launch gate from the next step),
// logging it once, and refuses g's GPU at the quorum.
func (s *Steering) noteRefused(g gpusched.Group, err error) {
	s.mu.Lock()
	fresh, gpuRefused := s.refused.note(int(g.GPU), g.PID, isRefusal(err))
	if gpuRefused && s.gpus[int(g.GPU)].why == "" {
		s.gpus[int(g.GPU)] = gpuVerdict{why: fmt.Sprintf("the driver refused a control of pid %d: %v", g.PID, err), at: time.Now()}
	}
	s.mu.Unlock()
	if fresh {
		s.log.Warn("gpu scheduler: the driver refused a process's control; its tenant is paced at the launch gate",
			"gpu", g.GPU, "pid", g.PID, "err", err, "gpu_refused", gpuRefused)
	}
}

// noteOutcomes records, per group of a batch of controls, whether the
// driver accepted it (nil), refused it, or neither (a process that ended,
// a group not ready yet).
func (s *Steering) noteOutcomes(gs []gpusched.Group, failed []error) {
	for i, err := range failed {
		switch {
		case err == nil:
			s.mu.Lock()
			s.refused.accept(int(gs[i].GPU))
			s.mu.Unlock()
		case isRefusal(err) || errors.Is(err, gpusched.ErrNotItsFile):
			s.noteRefused(gs[i], err)
		}
	}
}

// Refused tells whether the driver refused a control of pid's.
func (s *Steering) Refused(pid uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.refused.pids[pid]
	return ok
}

// TenantGroups are one tenant's channel groups on one GPU, with its
// decision there.
type TenantGroups struct {
	Decision arbiter.Decision
	Groups   []gpusched.Group
}

// sliceDeadband is the relative change of a group's timeslice below which
// gpuarb leaves the one it set: every change costs a control and, per
// GPU, a runlist restart, and the arbiter's slices drift by a few percent
// a step as its feedback corrects them. The feedback on measured shares
// takes up what the band leaves.
const sliceDeadband = 0.05

// nearSlice tells whether a group set to slice set may keep it when want
// is asked: set within sliceDeadband of want.
func nearSlice(set, want time.Duration) bool {
	return set > 0 && math.Abs(float64(want-set)) <= sliceDeadband*float64(set)
}

// maxSliceChanges, sliceBatch and sliceBudget bound the timeslice
// changes of one control step. Each change costs a control through the
// driver and each batch a runlist restart: on the simulated GPU here,
// with a thousand tenants of short requests whose slices follow their
// bursts, 100–280 changes a step took the 100 ms step to 120–240 ms
// (BENCHMARKS.md section 8), and 64 changes up to 100 ms more. Batches go
// out, the tenants entitled to most of the GPU first, until the budget is
// spent; the rest wait for the next steps.
const (
	maxSliceChanges = 64
	sliceBatch      = 16
	sliceBudget     = 20 * time.Millisecond
)

// sliceWant is the timeslice a group should have, and the share of the
// GPU its tenant is entitled to (which orders the changes).
type sliceWant struct {
	Slice  time.Duration
	Target float64
}

// sliceChange is a change setSlices may make: the group's slice now (0:
// not set by gpuarb yet) and the one wanted.
type sliceChange struct {
	key       groupKey
	set, want time.Duration
	target    float64
}

// pickSliceChanges returns the changes to make this step: those not near
// the slice already set (nearSlice), at most limit, the ones of tenants
// entitled to more of the GPU first and, between equals, the largest
// relative change first.
func pickSliceChanges(cands []sliceChange, limit int) []sliceChange {
	out := slices.DeleteFunc(slices.Clone(cands), func(c sliceChange) bool { return nearSlice(c.set, c.want) })
	gap := func(c sliceChange) float64 {
		if c.set <= 0 {
			return math.Inf(1)
		}
		return math.Abs(math.Log(float64(c.want) / float64(c.set)))
	}
	slices.SortStableFunc(out, func(a, b sliceChange) int {
		if a.target != b.target {
			return cmp.Compare(b.target, a.target)
		}
		return cmp.Compare(gap(b), gap(a))
	})
	return out[:min(len(out), limit)]
}

// Apply gives the channel groups of the GPUs in scheduler mode the
// timeslices their tenants' decisions set (plan: per GPU, each tenant's
// decision with its groups; an idle tenant's groups keep theirs). A
// process whose control the driver refuses is noted, its tenant paced at
// the launch gate from the next step, and a GPU where the driver refuses
// a quorum of processes and accepts none is not steered at all.
func (s *Steering) Apply(plan map[int][]TenantGroups) {
	for gpu, ts := range plan {
		byKey := map[groupKey]gpusched.Group{}
		for _, t := range ts {
			for _, g := range t.Groups {
				byKey[keyOf(g)] = g
			}
		}
		want := map[groupKey]sliceWant{}
		for _, t := range ts {
			if t.Decision.Timeslice == 0 {
				continue
			}
			for _, g := range t.Groups {
				want[keyOf(g)] = sliceWant{Slice: time.Duration(t.Decision.Timeslice), Target: t.Decision.Target}
			}
		}
		if err := s.setSlices(want, byKey); err != nil && !isRefusal(err) { // refusals are logged as noted
			s.log.Debug("gpu scheduler: timeslices", "gpu", gpu, "err", err)
		}
	}
}

// setSlices gives groups their timeslices, recording each group in the
// ledger before its first change; groups already near theirs
// (nearSlice) are left, and a step makes at most maxSliceChanges, in
// batches while sliceBudget lasts (pickSliceChanges orders them).
func (s *Steering) setSlices(want map[groupKey]sliceWant, groups map[groupKey]gpusched.Group) error {
	keys := make([]groupKey, 0, len(want))
	gs := make([]gpusched.Group, 0, len(want))
	for k := range want {
		keys = append(keys, k)
		gs = append(gs, groups[k])
	}
	sts, errs := s.track(gs)
	var cands []sliceChange
	tracked := map[groupKey]*steered{}
	s.mu.Lock()
	for i, st := range sts {
		if st != nil {
			tracked[keys[i]] = st
			cands = append(cands, sliceChange{key: keys[i], set: st.slice, want: want[keys[i]].Slice, target: want[keys[i]].Target})
		}
	}
	s.mu.Unlock()
	picks := pickSliceChanges(cands, maxSliceChanges)
	start := time.Now()
	for len(picks) > 0 && time.Since(start) < sliceBudget {
		n := min(len(picks), sliceBatch)
		errs = append(errs, s.applySlices(picks[:n], groups, tracked))
		picks = picks[n:]
	}
	return errors.Join(errs...)
}

// applySlices makes one batch of timeslice changes, with one runlist
// restart per GPU. Only what took effect is recorded (and told to the
// meter): a group whose channels are not allocated yet gets its slice at
// a later step.
func (s *Steering) applySlices(picks []sliceChange, groups map[groupKey]gpusched.Group, tracked map[groupKey]*steered) error {
	changes := make([]gpusched.Change, 0, len(picks))
	changed := make([]*steered, 0, len(picks)) // beside changes; forget may drop them from s.groups meanwhile
	for _, c := range picks {
		changes = append(changes, gpusched.Change{Group: groups[c.key], Timeslice: c.want})
		changed = append(changed, tracked[c.key])
	}
	failed, err := s.act.Apply(changes)
	s.noteOutcomes(groupsIn(changes), failed)
	s.mu.Lock()
	for i, c := range changes {
		if failed[i] == nil {
			changed[i].slice = c.Timeslice
		}
	}
	s.mu.Unlock()
	for i, c := range changes {
		if failed[i] == nil {
			s.meter.Observe(meter.Timeslice(c.Group.PID, int(c.Group.GPU), c.Timeslice))
		}
	}
	return err
}

// tracked returns what gpuarb set on each group it tracks (nil for the
// others).
func (s *Steering) tracked(gs []gpusched.Group) []*steered {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*steered, len(gs))
	for i, g := range gs {
		out[i] = s.groups[keyOf(g)]
	}
	return out
}

// track returns what gpuarb set on each group (nil where it failed),
// recording the groups seen for the first time (with their own
// timeslices, read first) in the ledger, in one write.
func (s *Steering) track(gs []gpusched.Group) ([]*steered, []error) {
	var fresh []*steered
	var freshAt []int // fresh[j] is out[freshAt[j]]
	var errs []error
	out := s.tracked(gs)
	for i, g := range gs {
		if out[i] != nil {
			continue
		}
		start, err := cgroup.StartTime(int(g.PID))
		if err != nil {
			errs = append(errs, fmt.Errorf("pid %d: %w", g.PID, err))
			continue
		}
		orig, err := s.act.Timeslice(g)
		if err != nil {
			if isRefusal(err) || errors.Is(err, gpusched.ErrNotItsFile) {
				s.noteRefused(g, err)
			}
			errs = append(errs, err)
			continue
		}
		out[i] = &steered{rec: gpusched.Steered{Group: g, Start: start, Original: orig, FakeGPU: s.fakeSocket}}
		fresh, freshAt = append(fresh, out[i]), append(freshAt, i)
	}
	if len(fresh) == 0 {
		return out, errs
	}
	recs := make([]gpusched.Steered, len(fresh))
	for i, st := range fresh {
		recs[i] = st.rec
	}
	if err := s.ledger.Add(recs...); err != nil {
		// Not recorded, so never changed.
		for _, i := range freshAt {
			out[i] = nil
		}
		return out, append(errs, err)
	}
	s.mu.Lock()
	for _, st := range fresh {
		s.groups[keyOf(st.rec.Group)] = st
	}
	s.mu.Unlock()
	return out, errs
}

// Pause takes groups off the GPU for by (off), or lets them go for by,
// at once. A group runs while no pauseCause holds it: a latency tenant's hold
// ending does not resume a group its tenant's gater has paused, nor the
// other way round. Calls are serialized, so that two pausers' changes to
// one group do not cross between their decision and the driver's answer.
// With keepRunning a Pause leaves what runs of a group now to finish its
// slice (gpusched.Change.KeepRunning).
func (s *Steering) Pause(groups []gpusched.Group, by pauseCause, off, keepRunning bool) error {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	var changes []gpusched.Change
	var changed []*steered // beside changes; forget may drop them from s.groups meanwhile
	var masks []pauseCause // beside changed: who holds each after the change
	var sts []*steered
	var errs []error
	if off {
		sts, errs = s.track(groups)
	} else {
		// A group gpuarb does not track has nothing to resume (put back
		// by a thaw, or never paused): tracking it now would record it
		// in the ledger again.
		sts = s.tracked(groups)
	}
	s.mu.Lock()
	for i, st := range sts {
		if st == nil {
			continue
		}
		mask := st.pausedBy &^ by
		if off {
			mask |= by
		}
		if (mask != 0) == (st.pausedBy != 0) {
			st.pausedBy = mask // no change on the GPU
			continue
		}
		paused := mask != 0
		changes = append(changes, gpusched.Change{Group: groups[i], Pause: &paused, KeepRunning: paused && keepRunning})
		changed, masks = append(changed, st), append(masks, mask)
	}
	s.mu.Unlock()
	if len(changes) == 0 {
		return errors.Join(errs...)
	}
	failed, err := s.act.Apply(changes)
	s.noteOutcomes(groupsIn(changes), failed)
	now := meter.MonotonicNow()
	s.mu.Lock()
	for i, st := range changed {
		if failed[i] == nil {
			st.pausedBy = masks[i]
		}
	}
	s.mu.Unlock()
	for i, c := range changes {
		switch {
		case failed[i] != nil:
		case c.KeepRunning:
			s.meter.Observe(meter.Deschedule(c.Group.PID, int(c.Group.GPU), now))
		default:
			s.meter.Observe(meter.Pause(c.Group.PID, int(c.Group.GPU), *c.Pause, now))
		}
	}
	return errors.Join(append(errs, err)...)
}

// Forget drops the groups of processes no longer listed (they exited):
// their duplicates close and the ledger lets them go.
func (s *Steering) Forget(live map[uint32]bool) {
	s.mu.Lock()
	var gone []*steered
	for k, st := range s.groups {
		if !live[k.pid] {
			gone = append(gone, st)
			delete(s.groups, k)
		}
	}
	s.refused.forget(live)
	s.mu.Unlock()
	recs := make([]gpusched.Steered, len(gone))
	for i, st := range gone {
		s.act.Forget(st.rec.Group.PID)
		recs[i] = st.rec
	}
	_ = s.ledger.Remove(recs...)
	s.act.Sweep()
}

// PutBackAll resumes every group gpuarb paused and restores every
// timeslice it changed, then forgets them all.
func (s *Steering) PutBackAll() error {
	s.mu.Lock()
	all := make([]*steered, 0, len(s.groups))
	for _, st := range s.groups {
		all = append(all, st)
	}
	s.groups = map[groupKey]*steered{}
	s.mu.Unlock()
	return s.restore(all)
}

// PutBack does what PutBackAll does for groups gs only.
func (s *Steering) PutBack(gs []gpusched.Group) error {
	s.mu.Lock()
	var some []*steered
	for _, g := range gs {
		if st := s.groups[keyOf(g)]; st != nil {
			some = append(some, st)
			delete(s.groups, keyOf(g))
		}
	}
	s.mu.Unlock()
	return s.restore(some)
}

// restore puts groups gpuarb no longer tracks back as they were, in one
// Apply (a runlist restart per GPU), and lets the ledger go of those put
// back and those whose processes ended, in one rewrite; a group that
// could not be put back stays in the ledger for the guardian.
func (s *Steering) restore(all []*steered) error {
	sort.Slice(all, func(i, j int) bool { return all[i].rec.Group.PID < all[j].rec.Group.PID })
	resume := false
	var changes []gpusched.Change
	var live, done []gpusched.Steered
	for _, st := range all {
		if cgroup.Exited(int(st.rec.Group.PID), st.rec.Start) {
			done = append(done, st.rec)
			continue
		}
		changes = append(changes, gpusched.Change{Group: st.rec.Group, Pause: &resume, Timeslice: st.rec.Original})
		live = append(live, st.rec)
	}
	var err error
	if len(changes) > 0 {
		var failed []error
		failed, err = s.act.Apply(changes)
		now := meter.MonotonicNow()
		for i, rec := range live {
			if failed[i] != nil {
				continue
			}
			// The meter follows: a group it still thought paused would get
			// no GPU in its replay, and a later resume of the group,
			// tracked afresh as running, would never tell it.
			s.meter.Observe(meter.Timeslice(rec.Group.PID, int(rec.Group.GPU), rec.Original))
			s.meter.Observe(meter.Pause(rec.Group.PID, int(rec.Group.GPU), false, now))
			done = append(done, rec)
		}
	}
	_ = s.ledger.Remove(done...)
	return err
}

// Close puts everything back and closes the duplicates.
func (s *Steering) Close() error {
	err := s.PutBackAll()
	return errors.Join(err, s.act.Close())
}

// onlyGone tells whether every error err joins is one of a process that
// has ended (gpusched.ErrGone): nothing to report.
func onlyGone(err error) bool {
	errs := flatten(err)
	for _, e := range errs {
		if !errors.Is(e, gpusched.ErrGone) {
			return false
		}
	}
	return len(errs) > 0
}

// isRefusal tells whether an error says the driver will not be steered (a
// status it refused with), as opposed to a process that ended or another
// passing failure.
func isRefusal(err error) bool {
	var se *gpusched.StatusError
	for _, e := range flatten(err) {
		if errors.As(e, &se) && !errors.Is(e, gpusched.ErrGone) {
			return true
		}
	}
	return false
}

// flatten lists the errors joined in err.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// pauseGate is a tenant's gate in scheduler mode: freezing it pauses its
// channel groups (their queued work stays on the GPU, and runs at the
// thaw), so a window gater holds it to the part of each period its
// decision allows.
type pauseGate struct {
	s      *Steering
	name   string
	groups func() []gpusched.Group // the tenant's groups now
}

// newPauseGate returns the gate that pauses the channel groups groups
// lists, through s, for the tenant name.
func newPauseGate(s *Steering, name string, groups func() []gpusched.Group) pauseGate {
	return pauseGate{s: s, name: name, groups: groups}
}

func (p pauseGate) Freeze() error { return p.s.Pause(p.groups(), byDuty, true, false) }
func (p pauseGate) Thaw() error   { return p.s.Pause(p.groups(), byDuty, false, false) }

// Target describes the gate for the freeze ledger: nothing to freeze
// there, the steering ledger records the groups.
func (p pauseGate) Target() cgroup.Target { return cgroup.Target{Kind: "gpusched", Path: p.name} }

// groupsIn lists the groups of changes, in order.
func groupsIn(changes []gpusched.Change) []gpusched.Group {
	out := make([]gpusched.Group, len(changes))
	for i, c := range changes {
		out[i] = c.Group
	}
	return out
}
