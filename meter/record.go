package meter

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"time"

	"github.com/gpuarb/gpuarb/ioctlspy"
)

// A recording is every input a meter took, one JSON object a line in the
// order taken (Config.Record), after the meter's configuration: each
// event Observe took (the probes' and the actuators' effects alike),
// SetPreexisting, the processes Reconcile ended, what the GPUs'
// scheduling said, and each settling of the replay (Tick,
// Contexts) with the clock's reading then.
// Play feeds one to a new meter, which then computes what the recorded
// one did: a misreading seen once in a live run, under a mix of tenants
// that rarely recurs, is replayed at will.
type recordLine struct {
	Op  string `json:"op"`
	Now uint64 `json:"now"` // the meter's clock at the call
	// Kind and Event are an observed event: its Go type's name and the
	// event itself.
	Kind  string          `json:"kind,omitempty"`
	Event json.RawMessage `json:"event,omitempty"`

	PID    uint32   `json:"pid,omitempty"`
	Ctx    uint64   `json:"ctx,omitempty"`
	PIDs   []uint32 `json:"pids,omitempty"`
	Cgroup uint64   `json:"cgroup,omitempty"`
	GPU    int      `json:"gpu,omitempty"`
	On     bool     `json:"on,omitempty"` // paused, preemptive
	From   uint64   `json:"from,omitempty"`
	To     uint64   `json:"to,omitempty"`
	NS     int64    `json:"ns,omitempty"` // a timeslice; a window
	// Config is the recorded meter's (its clock and recording aside).
	Config *Config `json:"config,omitempty"`
}

// The operations of a recording. An actuator's effect is an observe line
// of its kind; recordings made before that have the effects' own
// operations (timeslice, paused, descheduled, released, frozen), which
// still play.
const (
	opConfig      = "config"
	opObserve     = "observe"
	opTimeslice   = "timeslice"
	opPaused      = "paused"
	opDescheduled = "descheduled"
	opUnprobed    = "unprobed"
	opReleased    = "released"
	opFrozen      = "frozen"
	opPreexisting = "preexisting"
	opBacklog     = "backlog"
	opReconcile   = "reconcile"
	opScheduling  = "scheduling"
	opTick        = "tick"
	opSettle      = "settle"
)

// recordedKinds are the events whose own fields the meter reads; any
// other is played back as its header alone (an ioctlspy.Unknown), which
// is all the meter takes of it.
var recordedKinds = map[string]func() ioctlspy.Event{}

func init() {
	for _, ev := range []ioctlspy.Event{&ioctlspy.Launch{}, &ioctlspy.GraphLaunch{}, &ioctlspy.EventRecord{},
		&ioctlspy.StreamCapture{}, &ioctlspy.StreamWaitEvent{}, &ioctlspy.Submission{}, &ioctlspy.WaitBegin{},
		&ioctlspy.Sync{}, &ioctlspy.TSGControl{}, &ioctlspy.TSGAllocated{}, &ioctlspy.ContextCreated{},
		&ioctlspy.MemAlloc{}, &ioctlspy.MemFree{}, &ioctlspy.ProcessExit{},
		&ProcessUnprobed{}, &TimesliceSet{}, &GroupPaused{}, &GroupDescheduled{}, &HoldReleased{}, &CgroupFrozen{}} {
		t := reflect.TypeOf(ev).Elem()
		recordedKinds[t.Name()] = func() ioctlspy.Event { return reflect.New(t).Interface().(ioctlspy.Event) }
	}
}

// recorder writes a meter's inputs; the meter's lock orders its writes.
// The first failed write ends the recording (err keeps why). It reads the
// meter's clock itself, so that a meter that records nothing never reads
// it for the recording.
type recorder struct {
	w   *bufio.Writer
	enc *json.Encoder
	now func() uint64
	err error
}

func newRecorder(cfg Config) *recorder {
	if cfg.Record == nil {
		return nil
	}
	b := bufio.NewWriterSize(cfg.Record, 1<<20)
	r := &recorder{w: b, enc: json.NewEncoder(b), now: cfg.Now}
	kept := Config{Window: cfg.Window, HalfLife: cfg.HalfLife, Timeslice: cfg.Timeslice, Lag: cfg.Lag}
	r.put(recordLine{Op: opConfig, Now: cfg.Now(), Config: &kept})
	return r
}

// put writes one line, at the clock's reading now where l has none; a nil
// recorder writes nothing.
func (r *recorder) put(l recordLine) {
	if r == nil || r.err != nil {
		return
	}
	if l.Now == 0 {
		l.Now = r.now()
	}
	r.err = r.enc.Encode(l)
}

// observe writes an event.
func (r *recorder) observe(ev ioctlspy.Event) {
	if r == nil || r.err != nil {
		return
	}
	raw, err := json.Marshal(ev)
	if err != nil {
		r.err = fmt.Errorf("encode %T: %w", ev, err)
		return
	}
	r.put(recordLine{Op: opObserve, Kind: reflect.TypeOf(ev).Elem().Name(), Event: raw})
}

// flush writes out what is buffered.
func (r *recorder) flush() {
	if r == nil || r.err != nil {
		return
	}
	r.err = r.w.Flush()
}

// FlushRecording writes out the recording's buffered lines (the meter
// flushes at every Tick) and returns the error that ended it, if one did.
func (m *Meter) FlushRecording() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rec == nil {
		return nil
	}
	m.rec.flush()
	return m.rec.err
}

// PlayOptions are what Play calls back.
type PlayOptions struct {
	// Settled, when set, is called where the recorded meter answered with
	// figures (its Contexts and Snapshot), once the meter played into
	// settled there too, with the clock then.
	Settled func(m *Meter, now uint64)
	// Proofs is the played meter's Config.Proofs.
	Proofs func(Proof)
}

// Play makes a meter configured as the recorded one (Config.Record) was
// and feeds it the recording, in order, its clock reading what the
// recorded meter's read at each input. It returns the meter at the
// recording's end.
func Play(r io.Reader, o PlayOptions) (*Meter, error) {
	dec := json.NewDecoder(r)
	n := 0 // lines read
	read := func() (recordLine, bool, error) {
		var l recordLine
		if err := dec.Decode(&l); errors.Is(err, io.EOF) {
			return l, false, nil
		} else if err != nil {
			return l, false, fmt.Errorf("recording line %d: %w", n+1, err)
		}
		n++
		return l, true, nil
	}
	first, ok, err := read()
	if err != nil {
		return nil, err
	}
	if !ok || first.Op != opConfig || first.Config == nil {
		return nil, errors.New("not a meter recording: it does not begin with the meter's configuration")
	}
	var clock uint64
	cfg := *first.Config
	cfg.Now = func() uint64 { return clock }
	cfg.Proofs = o.Proofs
	m := New(cfg)
	// What the recorded meter's GPUs' scheduling said. Its lines follow
	// the input during which the meter asked (or a policy's reload), so
	// they are taken in before that input is played.
	sched := map[int]recordLine{}
	told := func(gpu int) (time.Duration, bool) {
		l := sched[gpu]
		return time.Duration(l.NS), l.On
	}
	m.SetScheduling(told)
	l, ok, err := read()
	for ok && err == nil {
		at := n
		next, more, nerr := read()
		changed := false
		for more && nerr == nil && next.Op == opScheduling {
			if was, seen := sched[next.GPU]; !seen || was.NS != next.NS || was.On != next.On {
				sched[next.GPU], changed = next, true
			}
			next, more, nerr = read()
		}
		if changed {
			m.SetScheduling(told)
		}
		if perr := playLine(m, &clock, sched, l, o); perr != nil {
			return nil, fmt.Errorf("recording line %d: %w", at, perr)
		}
		l, ok, err = next, more, nerr
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// playLine plays one input of a recording into m.
func playLine(m *Meter, clock *uint64, sched map[int]recordLine, l recordLine, o PlayOptions) error {
	*clock = l.Now
	switch l.Op {
	case opObserve:
		ev, err := decodeEvent(l)
		if err != nil {
			return err
		}
		m.Observe(ev)
	case opTimeslice: // recordings made before effects were observed
		m.Observe(Timeslice(l.PID, l.GPU, time.Duration(l.NS)))
	case opPaused:
		m.Observe(Pause(l.PID, l.GPU, l.On, l.From))
	case opDescheduled:
		m.Observe(Deschedule(l.PID, l.GPU, l.From))
	case opReleased:
		m.Observe(Release(l.PID, l.From, l.To))
	case opFrozen:
		m.Observe(Freeze(l.Cgroup, l.From, l.To))
	case opUnprobed:
		m.Observe(Unprobed(l.PID, l.Cgroup, l.GPU, l.From))
	case opPreexisting:
		m.SetPreexisting(l.PIDs)
	case opBacklog:
		m.RestoreBacklog(l.PID, l.Ctx, float64(l.NS))
	case opReconcile:
		m.Reconcile(func(pid uint32) bool { return !slices.Contains(l.PIDs, pid) })
	case opTick:
		m.Tick()
	case opSettle:
		m.Contexts(time.Duration(l.NS))
		if o.Settled != nil {
			o.Settled(m, l.Now)
		}
	case opScheduling:
		sched[l.GPU] = l
	default:
		return fmt.Errorf("unknown operation %q", l.Op)
	}
	return nil
}

// decodeEvent rebuilds a recorded event.
func decodeEvent(l recordLine) (ioctlspy.Event, error) {
	mk, ok := recordedKinds[l.Kind]
	if !ok {
		var u ioctlspy.Unknown
		if err := json.Unmarshal(l.Event, &u.Header); err != nil {
			return nil, fmt.Errorf("decode %s: %w", l.Kind, err)
		}
		return &u, nil
	}
	ev := mk()
	if err := json.Unmarshal(l.Event, ev); err != nil {
		return nil, fmt.Errorf("decode %s: %w", l.Kind, err)
	}
	return ev, nil
}
