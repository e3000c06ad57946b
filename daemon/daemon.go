// Package daemon is gpuarb's host daemon: it loads and pins the probes,
// feeds their events to the meter and serves the status on a local Unix
// socket. One daemon runs per host; a second refuses to start.
package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/arbiter"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/classify"
	"github.com/gpuarb/gpuarb/enforce"
	"github.com/gpuarb/gpuarb/exact"
	"github.com/gpuarb/gpuarb/gpusched"
	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/ledger"
	"github.com/gpuarb/gpuarb/meter"
	nriplugin "github.com/gpuarb/gpuarb/nri-plugin"
	"github.com/gpuarb/gpuarb/policy"
	"github.com/gpuarb/gpuarb/registry"
)

// LedgerBeside is the thaw ledger's path for a daemon socket.
func LedgerBeside(socket string) string { return filepath.Join(filepath.Dir(socket), "gated.json") }

// ErrAlreadyRunning is returned when another daemon holds the lock.
var ErrAlreadyRunning = errors.New("another gpuarb daemon is running")

// Daemon is a running gpuarb daemon.
type Daemon struct {
	cfg  Config
	log  *slog.Logger
	lock *os.File // beside the socket
	// pinLock is the pin directory, locked: one daemon per pinned maps.
	pinLock *os.File
	probes  *bpf.Probes
	spy     *ioctlspy.Spy
	meter   *meter.Meter
	hold    *enforce.LatencyHold
	nri     *nriplugin.Plugin // nil without --nri-socket
	// recording is the file the meter records to (Config.RecordMeter);
	// recordingFailed once a write to it failed.
	recording       *os.File
	recordingFailed bool
	resolver        *cgroup.Resolver
	server          *http.Server
	listener        net.Listener
	// the Prometheus endpoint, when configured
	metricsServer   *http.Server
	metricsListener net.Listener
	// stepMu serializes the control steps with what ends enforcement or
	// replaces what it enforces (a thaw, a new policy, Stop): a step that
	// began before would otherwise steer, pause or gate again after them
	// with what it read at its start. Taken before mu.
	stepMu sync.Mutex
	mu     sync.Mutex
	// policy and arbitration, under mu: policy is base (the file or the
	// last `policy apply`) with the attached tenants
	policy   *policy.Config
	base     *policy.Config
	attached *registry.Registry
	// policyFile is the policy file's part as last read (or the last good
	// copy, or the defaults, at a start on a file that could not be read);
	// policyErr why the file was refused the last time it was read ("":
	// it was not), under mu.
	policyFile *policy.Config
	// policySum is the policy file's content at the last look of
	// watchPolicy (the sampling goroutine's alone).
	policySum [32]byte
	policyErr string
	// pidStarts pins each pid tenant to its process: the start time of
	// the process its pid named when it was attached or first appeared
	// in the policy. A pid reused by another process is not the tenant's.
	pidStarts map[int]uint64
	// trees follows the pid tenants' trees (Daemon.pidTrees), made at the
	// first step; the control loop owns it.
	trees     *bpf.TreeFollower
	enforcing bool
	arb       *arbiter.Arbiter
	tenants   map[string]*tenant
	counted   contextCounts
	ledger    *cgroup.Ledger
	mode      cgroup.Mode
	mount     string
	epoch     time.Time
	env       *enforce.Env      // what the tenants' actuators share
	guardian  *enforce.Guardian // nil without Config.Guardian
	// memory holds the limited tenants' GPU memory in the probes.
	memory *enforce.MemoryLimits
	// savedObjects is the version of the RM object table last saved
	// (saveObjects); objectsUnsaved is set once a save failed (logged
	// once). The control loop owns both.
	savedObjects   uint64
	objectsUnsaved bool

	// exact figures, under mu
	exactPrev   exact.Sample
	exactAt     time.Time
	exactShares map[string]float64

	controlTimes []time.Duration // the control steps of the last window, under mu
	// wakers, as the last control step left them, read by the event reader
	wakers atomic.Pointer[enforce.Wakers]
	// steer is the hold on the GPUs' own schedulers; steerWhy, under mu,
	// says per GPU why the last step could not use it.
	steer    *enforce.Steering
	steerWhy map[int]string
	// ungroupedSince is when a busy tenant was first seen on a GPU without
	// a channel group (used by the control loop only).
	ungroupedSince map[tenantGPU]time.Time
	// unprobed are the processes the last control step metered as using
	// the GPU through a driver gpuarb does not probe (control loop only).
	unprobed map[uint32]bool
	// published is the last control step's view for status and metrics.
	published atomic.Pointer[stepView]
	// driverMem reads the driver's own memory figures.
	driverMem *enforce.DriverMemory
	// exitsReconciled counts the processes reconcileExits ended;
	// meteredStarts are the start times it last found for the metered
	// processes (its goroutine only).
	exitsReconciled atomic.Uint64
	meteredStarts   map[uint32]uint64
}

// reconcileExits ends in the meter the processes that are gone from /proc
// though no exit event said so (events lost when the ring buffer was
// full): their modeled queues would otherwise run on, and their state
// would never be pruned. A pid whose process started at another time than
// at the last pass is another process's now (the exit lost, the pid
// reused): the old one is ended too, and the new one starts afresh at its
// next event. Once a window, a read of /proc/PID/stat per metered process.
func (d *Daemon) reconcileExits() {
	starts := make(map[uint32]uint64, len(d.meteredStarts))
	n := d.meter.Reconcile(func(pid uint32) bool {
		start := classify.PIDStart(int(pid))
		if was, ok := d.meteredStarts[pid]; start == 0 || ok && was != start {
			return false
		}
		starts[pid] = start
		return true
	})
	d.meteredStarts = starts
	if n > 0 {
		d.exitsReconciled.Add(uint64(n))
		d.log.Info("ended processes whose exit events were lost", "processes", n)
	}
}

// Start takes the host lock, loads and pins the probes, and starts
// serving. Stop (or Run's context) undoes all of it.
func Start(cfg Config) (_ *Daemon, err error) {
	cfg.setDefaults()
	mcfg := meter.Config{Window: cfg.Window, Lag: cfg.Tuning.MeterLag}
	var recording *os.File
	if cfg.RecordMeter != "" {
		if recording, err = os.Create(cfg.RecordMeter); err != nil {
			return nil, fmt.Errorf("record the meter's inputs: %w", err)
		}
		mcfg.Record = recording
	}
	d := &Daemon{cfg: cfg, log: cfg.Log, ungroupedSince: map[tenantGPU]time.Time{}, meter: meter.New(mcfg), recording: recording,
		arb: arbiter.New(arbiter.DefaultParams()), tenants: map[string]*tenant{}, pidStarts: map[int]uint64{}, enforcing: !cfg.ObserveOnly,
		epoch: time.Now(), mode: cgroup.DetectMode()}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.Stop())
		}
	}()
	if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", filepath.Dir(cfg.Socket), err)
	}
	mounted, err := bpf.EnsureFilesystems()
	if err != nil {
		return nil, err
	}
	for _, m := range mounted {
		d.log.Info("mounted", "path", m)
	}
	if err := d.takeLocks(); err != nil {
		return nil, err
	}
	// A daemon that died may have left tenants frozen, held or paused:
	// resume them first, before anything that could keep this one from
	// starting. What could not be resumed stays in the ledger, tried again
	// by the guardian, `thaw --all` or the next start; a ledger that
	// cannot be read is set aside (PATH.bad).
	if done, err := enforce.ThawLeftovers(cfg.Ledger, cfg.PinPath); err != nil {
		d.log.Error("resuming what an earlier daemon left", "err", err)
	} else if len(done) > 0 {
		d.log.Info("resumed what an earlier daemon left", "targets", len(done))
	}
	d.policySum = policy.FileSum(cfg.PolicyPath)
	d.loadPolicy()
	d.policy, d.base = d.policyFile, d.policyFile
	d.meter.SetScheduling(d.policy.Scheduling)
	if d.ledger, err = cgroup.OpenLedger(cfg.Ledger); errors.Is(err, ledger.ErrUnreadable) {
		d.log.Error("the thaw ledger", "err", err)
	} else if err != nil {
		return nil, err
	}
	if d.steer, err = enforce.NewSteering(cfg.NoGPUScheduler || cfg.ObserveOnly, cfg.FakeGPUSocket, enforce.SteerLedgerBeside(cfg.Ledger), d.meter, d.log); err != nil {
		return nil, err
	}
	d.steer.Reprobe = cfg.Tuning.SteerReprobe
	if d.steer.Off != "" {
		d.log.Info("not steering the GPUs' own schedulers: pacing at the launch gate", "why", d.steer.Off)
	}
	d.env = &enforce.Env{Steer: d.steer, Ledger: d.ledger, Meter: d.meter, Log: d.log, Epoch: d.epoch}
	if len(cfg.Guardian) > 0 {
		cgroupDir := ""
		if cfg.GuardianCgroup != "" {
			if root, err := cgroup.UnifiedMount(); err != nil {
				d.log.Warn("no cgroup v2 hierarchy: the thaw guardian runs in the daemon's cgroup", "err", err)
			} else {
				cgroupDir = filepath.Join(root, filepath.Clean("/"+cfg.GuardianCgroup))
			}
		}
		d.guardian = enforce.NewGuardian(cfg.Guardian, cgroupDir, d.log)
		if err := d.guardian.Start(); err != nil {
			return nil, err
		}
	}
	if root, err := cgroup.UnifiedMount(); err == nil {
		d.resolver = cgroup.NewResolver(root)
		d.mount = root
	} else {
		d.log.Warn("no cgroup v2 hierarchy: tenants are shown by cgroup id", "err", err)
	}
	if err := d.restoreAttachments(); err != nil {
		return nil, err
	}
	opts := bpf.Options{PinPath: cfg.PinPath, Devices: cfg.Devices, RingSize: cfg.RingSize}
	d.probes, err = bpf.Load(opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		// Pins of an older gpuarb with other map layouts: replace them.
		d.log.Warn("replacing incompatible pinned maps", "path", cfg.PinPath)
		if rerr := bpf.RemovePins(cfg.PinPath); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		d.probes, err = bpf.Load(opts)
	}
	if err != nil {
		return nil, err
	}
	d.memory = enforce.NewMemoryLimits(d.probes)
	d.limitMemoryNow(d.policy)
	d.attachLibcudas()
	if cfg.Exact == nil {
		if src := (exact.DRMFdinfo{}); src.Available() {
			d.cfg.Exact = src
		}
	}
	if d.cfg.Exact != nil {
		d.log.Info("exact GPU time source", "source", d.cfg.Exact.Name())
	}
	if d.spy, err = ioctlspy.NewSpy(d.probes); err != nil {
		return nil, err
	}
	d.spy.OnError = func(err error) { d.log.Warn("probe", "err", err) }
	d.restoreObjects()
	if cfg.NRISocket != "" {
		d.nri = nriplugin.New(nriRegistry{d}, nriplugin.Options{Socket: cfg.NRISocket, PerPod: cfg.NRIPerPod, Log: d.log})
	}
	steer := d.steer // Close forgets d.steer while the hold loop may still release
	deschedule := cfg.LatencyHolds == enforce.HoldDeschedule
	d.hold = enforce.NewLatencyHold(func(gs []gpusched.Group, off bool) error { return steer.Pause(gs, enforce.ByHold, off, deschedule) },
		d.probes.SetUrgent, deschedule, d.log)
	d.hold.MaxHold = cfg.Tuning.MaxHold
	d.driverMem = enforce.NewDriverMemory(steer, d.probes, d.log)
	if err := d.listen(); err != nil {
		return nil, err
	}
	if err := d.listenMetrics(); err != nil {
		return nil, err
	}
	d.replaySpool()
	d.log.Info("gpuarb daemon started", "socket", cfg.Socket, "pins", cfg.PinPath,
		"devices", len(cfg.Devices), "libcudas", len(d.probes.Libcudas()), "latency_holds", cfg.LatencyHolds)
	return d, nil
}

// takeLocks takes the daemon's two locks: a file beside its socket (one
// daemon per API) and its pin directory (one daemon per set of pinned
// maps: a second with another socket must not clear the first one's
// gates, leases and held table).
func (d *Daemon) takeLocks() error {
	path := filepath.Join(filepath.Dir(d.cfg.Socket), "gpuarb.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := lockFile(f, path); err != nil {
		f.Close()
		return err
	}
	d.lock = f
	if err := os.MkdirAll(d.cfg.PinPath, 0o700); err != nil {
		return fmt.Errorf("create pin path %s: %w", d.cfg.PinPath, err)
	}
	pins, err := os.Open(d.cfg.PinPath)
	if err != nil {
		return fmt.Errorf("open pin path %s: %w", d.cfg.PinPath, err)
	}
	if err := lockFile(pins, d.cfg.PinPath); err != nil {
		pins.Close()
		return err
	}
	d.pinLock = pins
	return nil
}

// lockFile takes an exclusive lock on f, named path in errors.
func lockFile(f *os.File, path string) error {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("%w (lock %s held)", ErrAlreadyRunning, path)
		}
		return fmt.Errorf("lock %s: %w", path, err)
	}
	return nil
}

// attachLibcudas probes the libcuda copies the operator names, those in
// the linker cache and those running processes map, and tells the meter
// which processes ran before the probes could see them.
func (d *Daemon) attachLibcudas() {
	defer d.meter.SetPreexisting(cgroup.RunningPIDs())
	for _, p := range d.cfg.Libcudas {
		if _, err := d.probes.AttachLibcuda(p); err != nil {
			d.log.Warn("libcuda", "path", p, "err", err)
		}
	}
	if err := d.probes.AttachHost(); err != nil {
		d.log.Warn("libcuda", "err", err)
	}
}

// Stop shuts the API down, detaches the probes, removes the pins (but
// GPU memory limits and charges that running processes hold), the socket
// and the lock. It is safe to call more than once.
func (d *Daemon) Stop() error {
	var errs []error
	if d.probes != nil {
		errs = append(errs, d.probes.EndLease()) // no gate stops anyone from here on
	}
	d.stepMu.Lock()
	if d.ledger != nil {
		d.stopAllGates()
		if _, err := cgroup.ThawAll(d.cfg.Ledger); err != nil {
			errs = append(errs, err) // what failed stays in the ledger
		}
		d.ledger = nil
	}
	// Limits whose tenants hold charged memory stay in the pins with
	// those charges, for the next daemon to carry on.
	keepMemory := d.probes.HoldsMemory()
	switch {
	case d.memory == nil:
	case keepMemory:
		d.memory.Leave()
	default:
		errs = append(errs, d.memory.Close())
	}
	d.saveObjects() // under stepMu, as the control steps save
	d.saveBacklogs()
	d.stepMu.Unlock()
	if d.steer != nil {
		// The ledger lets go of each group put back; one that could not
		// be stays listed for the guardian, thaw --all or the next start.
		errs = append(errs, d.steer.Close())
		d.steer = nil
	}
	if d.guardian != nil {
		d.guardian.Stop()
	}
	if d.server != nil {
		errs = append(errs, d.shutdown("API", d.server))
		d.server = nil
	}
	if d.metricsListener != nil {
		// Shutdown closes the listener of a serving server; before Run the
		// listener is closed by hand.
		errs = append(errs, d.shutdown("metrics", d.metricsServer))
		_ = d.metricsListener.Close()
		d.metricsServer, d.metricsListener = nil, nil
	}
	if d.spy != nil {
		_ = d.spy.Close() // also ends a running Run; closing twice is harmless
		d.spy = nil
	}
	if d.recording != nil {
		if err := d.meter.FlushRecording(); err != nil {
			errs = append(errs, fmt.Errorf("record the meter's inputs: %w", err))
		}
		errs = append(errs, d.recording.Close())
		d.recording = nil
	}
	if d.probes != nil {
		errs = append(errs, d.probes.Close(), d.probes.Unpin(keepMemory))
		d.probes = nil
	}
	if d.listener != nil {
		_ = os.Remove(d.cfg.Socket)
		d.listener = nil
	}
	if d.lock != nil {
		_ = os.Remove(d.lock.Name())
		errs = append(errs, d.lock.Close())
		d.lock = nil
	}
	if d.pinLock != nil {
		errs = append(errs, d.pinLock.Close())
		d.pinLock = nil
	}
	return errors.Join(errs...)
}
