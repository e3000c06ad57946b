package daemon

import (
	"log/slog"
	"os"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/enforce"
	"github.com/gpuarb/gpuarb/exact"
	"github.com/gpuarb/gpuarb/policy"
	"github.com/gpuarb/gpuarb/tuning"
)

// Config configures the daemon.
type Config struct {
	Socket   string        // API socket (default api.DefaultSocket)
	PinPath  string        // where maps are pinned (default bpf.DefaultPinPath)
	Devices  []bpf.Device  // the device table
	Libcudas []string      // libcuda copies to probe besides the ones found
	Window   time.Duration // the meter's window (default 1s)
	// RingSize is the probes' ring buffer in bytes (0: bpf.DefaultRingSize);
	// tests make it small to lose events for real.
	RingSize uint32
	Version  string
	// PolicyPath is the policy file (default policy.DefaultPath; missing:
	// default policy). Reload re-reads it.
	PolicyPath string
	// Ledger records what the arbiter may stop (default: gated.json beside
	// the socket).
	Ledger string
	// Attached keeps the tenants registered through the API across
	// restarts (default: attached.json beside the socket).
	Attached string
	// GuardianCgroup is the cgroup v2 path (below the unified mount) the
	// guardian runs in, made if missing, so that what kills the daemon's
	// cgroup does not kill it; "" runs it in the daemon's cgroup.
	GuardianCgroup string
	// Guardian is the command line of the thaw guardian (`gpuarb guardian
	// --ledger PATH`); nil runs none.
	Guardian []string
	// ObserveOnly measures without throttling anyone.
	ObserveOnly bool
	// NoGPUScheduler keeps gpuarb off the GPUs' own schedulers: tenants are
	// paced at the launch gate (or frozen) everywhere. The channel groups
	// gpuarb changed are recorded in steered.json beside the Ledger
	// (SteerLedgerBeside).
	NoGPUScheduler bool
	// FakeGPUSocket is the simulated GPU's socket (--fakegpu-socket): where
	// the scheduling controls of a control file that is no nvidia node go.
	// Only the operator names it; "" steers the nvidia driver alone.
	FakeGPUSocket string
	// LatencyHolds is how a latency tenant's launch takes the other
	// tenants' channel groups off a GPU whose scheduler gpuarb steers.
	LatencyHolds enforce.HoldMode
	// MetricsAddr, when set, serves Prometheus metrics over HTTP there (a
	// bare port listens on 127.0.0.1 only).
	MetricsAddr string
	// RecordMeter, when set, is a file the meter records its every input
	// to (meter.Config.Record), for meter.Play to replay a misreading at
	// will; about 0.3 KB an event. It is created, or truncated.
	RecordMeter string
	Log         *slog.Logger
	// Exact is an exact per-process GPU time source to report beside the
	// estimate; nil picks DRM fdinfo when a DRM client exists at start.
	Exact exact.Source
	// NRISocket is the container runtime's NRI socket, where the daemon
	// connects as a plugin to register the runtime's pods (nriplugin);
	// "" runs no plugin.
	NRISocket string
	// WatchPolicy reloads the policy file whenever its content changes
	// (checked once a window), besides at SIGHUP and Reload.
	WatchPolicy bool
	// Tuning are the control constants an operator may change (zero
	// fields: their defaults).
	Tuning tuning.Tunables
	// NRIPerPod makes each pod one tenant, where each container is one by
	// default (nriplugin.Options.PerPod).
	NRIPerPod bool
}

// setDefaults fills what the operator left unset.
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
	if c.PolicyPath == "" {
		c.PolicyPath = policy.DefaultPath
	}
	if c.Ledger == "" {
		c.Ledger = LedgerBeside(c.Socket)
	}
	if c.Attached == "" {
		c.Attached = AttachedBeside(c.Socket)
	}
	c.Tuning = c.Tuning.Filled()
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
}
