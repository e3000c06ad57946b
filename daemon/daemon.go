// Package daemon is gpuarb's host daemon: it loads and pins the probes,
// feeds their events to the meter and serves the status on a local Unix
// socket. One daemon runs per host; a second refuses to start.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/exact"
	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/meter"
)

// Config configures the daemon.
type Config struct {
	Socket   string        // API socket (default api.DefaultSocket)
	PinPath  string        // where maps are pinned (default bpf.DefaultPinPath)
	Devices  []bpf.Device  // the device table
	Libcudas []string      // libcuda copies to probe besides the ones found
	Window   time.Duration // the meter's window (default 1s)
	Period   time.Duration // control period: meter ticks (default 100ms)
	Version  string
	Log      *slog.Logger
	// Exact is an exact per-process GPU time source to report beside the
	// estimate; nil picks DRM fdinfo when a DRM client exists at start.
	Exact exact.Source
}

// ErrAlreadyRunning is returned when another daemon holds the lock.
var ErrAlreadyRunning = errors.New("another gpuarb daemon is running")

// Daemon is a running gpuarb daemon.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	lock     *os.File
	probes   *bpf.Probes
	spy      *ioctlspy.Spy
	meter    *meter.Meter
	resolver *cgroup.Resolver
	server   *http.Server
	listener net.Listener
	mu       sync.Mutex

	// exact figures, under mu
	exactPrev   exact.Sample
	exactAt     time.Time
	exactShares map[string]float64
}

func (c *Config) setDefaults() {
	if c.Socket == "" {
		c.Socket = api.DefaultSocket
	}
	if c.PinPath == "" {
		c.PinPath = bpf.DefaultPinPath
	}
	if c.Window <= 0 {
		c.Window = time.Second
	}
	if c.Period <= 0 {
		c.Period = 100 * time.Millisecond
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
}

// Start takes the host lock, loads and pins the probes, and starts
// serving. Stop (or Run's context) undoes all of it.
func Start(cfg Config) (_ *Daemon, err error) {
	cfg.setDefaults()
	d := &Daemon{cfg: cfg, log: cfg.Log, meter: meter.New(meter.Config{Window: cfg.Window, Lag: 20 * time.Millisecond})}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.Stop())
		}
	}()
	if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", filepath.Dir(cfg.Socket), err)
	}
	if err := d.takeLock(); err != nil {
		return nil, err
	}
	mounted, err := bpf.EnsureFilesystems()
	if err != nil {
		return nil, err
	}
	for _, m := range mounted {
		d.log.Info("mounted", "path", m)
	}
	if root, err := cgroup.UnifiedMount(); err == nil {
		d.resolver = cgroup.NewResolver(root)
	} else {
		d.log.Warn("no cgroup v2 hierarchy: tenants are shown by cgroup id", "err", err)
	}
	opts := bpf.Options{PinPath: cfg.PinPath, Devices: cfg.Devices}
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
	if err := d.listen(); err != nil {
		return nil, err
	}
	d.log.Info("gpuarb daemon started", "socket", cfg.Socket, "pins", cfg.PinPath,
		"devices", len(cfg.Devices), "libcudas", len(d.probes.Libcudas()))
	return d, nil
}

func (d *Daemon) takeLock() error {
	path := filepath.Join(filepath.Dir(d.cfg.Socket), "gpuarb.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("%w (lock %s held)", ErrAlreadyRunning, path)
		}
		return fmt.Errorf("lock %s: %w", path, err)
	}
	d.lock = f
	return nil
}

func (d *Daemon) attachLibcudas() {
	for _, p := range d.cfg.Libcudas {
		if _, err := d.probes.AttachLibcuda(p); err != nil {
			d.log.Warn("libcuda", "path", p, "err", err)
		}
	}
	for _, p := range append(bpf.LinkerCacheLibcudas(), bpf.ProcessLibcudas()...) {
		if _, err := d.probes.AttachLibcuda(p); err != nil {
			d.log.Warn("libcuda", "path", p, "err", err)
		}
	}
}

func (d *Daemon) listen() error {
	_ = os.Remove(d.cfg.Socket) // the lock is ours: a socket left here is stale
	ln, err := net.Listen("unix", d.cfg.Socket)
	if err != nil {
		return fmt.Errorf("listen %s: %w", d.cfg.Socket, err)
	}
	if err := os.Chmod(d.cfg.Socket, 0o660); err != nil {
		ln.Close()
		return fmt.Errorf("chmod %s: %w", d.cfg.Socket, err)
	}
	d.listener = ln
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+api.StatusPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(d.Status()); err != nil {
			d.log.Warn("status", "err", err)
		}
	})
	d.server = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return nil
}

// Run serves until ctx ends, then stops everything.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() {
		errs <- d.spy.Run(ctx, d.meter.Observe)
	}()
	go func() {
		if err := d.server.Serve(d.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("serve: %w", err)
		}
	}()
	tick := time.NewTicker(d.cfg.Period)
	defer tick.Stop()
	d.sampleExact()
	exactTick := time.NewTicker(d.cfg.Window)
	defer exactTick.Stop()
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			d.meter.Tick()
		case <-exactTick.C:
			d.sampleExact()
		case err := <-errs:
			runErr = err
			break loop
		}
	}
	cancel()
	return errors.Join(runErr, d.Stop())
}

// sampleExact reads the exact source and turns the interval since the last
// sample into shares per cgroup path.
func (d *Daemon) sampleExact() {
	if d.cfg.Exact == nil {
		return
	}
	cur, err := d.cfg.Exact.Sample()
	if err != nil {
		d.log.Warn("exact source", "source", d.cfg.Exact.Name(), "err", err)
		return
	}
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.exactPrev != nil {
		d.exactShares = exact.Shares(d.exactPrev, cur, uint64(now.Sub(d.exactAt)), func(pid uint32) string {
			p, _ := cgroup.ProcessPath(int(pid))
			return p
		})
	}
	d.exactPrev, d.exactAt = cur, now
}

// Stop shuts the API down, detaches the probes, removes the pins, the
// socket and the lock. It is safe to call more than once.
func (d *Daemon) Stop() error {
	var errs []error
	if d.server != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		errs = append(errs, d.server.Shutdown(sctx))
		cancel()
		d.server = nil
	}
	if d.spy != nil {
		_ = d.spy.Close() // also ends a running Run; closing twice is harmless
		d.spy = nil
	}
	if d.probes != nil {
		errs = append(errs, d.probes.Close(), d.probes.Unpin())
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
	return errors.Join(errs...)
}

// Status builds the status document from the meter.
func (d *Daemon) Status() api.Status {
	snap := d.meter.Snapshot()
	st := api.Status{Version: d.cfg.Version, WindowNS: snap.WindowNS, Tenants: []api.Tenant{}, GPUs: []api.GPU{}}
	for _, t := range snap.Tenants {
		path := ""
		if d.resolver != nil {
			path = d.resolver.Path(t.CgroupID)
		}
		state := "idle"
		if t.Busy {
			state = "running"
		}
		st.Tenants = append(st.Tenants, api.Tenant{
			Name: TenantName(path), Cgroup: path, CgroupID: t.CgroupID, GPU: t.GPU, Share: t.Share,
			GPUNS: t.GPUNS, LongRunShare: t.LongRunShare, LaunchesPerS: t.LaunchesPerS, SyncsPerS: t.SyncsPerS,
			MemBytes: t.MemBytes, QueueNS: t.QueueNS, Processes: t.Processes, State: state,
		})
	}
	sort.SliceStable(st.Tenants, func(i, j int) bool { return st.Tenants[i].Share > st.Tenants[j].Share })
	for _, g := range snap.GPUs {
		st.GPUs = append(st.GPUs, api.GPU{Index: g.Index, BusyShare: g.BusyShare, Tenants: g.Tenants})
	}
	if d.probes != nil {
		st.Probes.Libcudas = d.probes.Libcudas()
		st.Probes.LostEvents, _ = d.probes.Lost()
	}
	if d.spy != nil {
		st.Probes.Events, _ = d.spy.Counts()
	}
	for _, dev := range d.cfg.Devices {
		st.Probes.Devices = append(st.Probes.Devices, dev.String())
	}
	d.mu.Lock()
	if d.cfg.Exact != nil {
		st.ExactSource = d.cfg.Exact.Name()
		for i := range st.Tenants {
			if v, ok := d.exactShares[st.Tenants[i].Cgroup]; ok {
				st.Tenants[i].ExactShare = &v
			}
		}
	}
	d.mu.Unlock()
	st.Probes.PinPath = d.cfg.PinPath
	return st
}
