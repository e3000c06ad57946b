package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/exact"
	"github.com/gpuarb/gpuarb/ioctlspy"
)

// observe meters an event; a latency tenant's launch takes the others off
// the GPU, the end of its wait puts them back (enforce.LatencyHold); a held launch
// wakes its tenant's gater, which releases the process when the tenant's
// credit pays for the launch.
func (d *Daemon) observe(ev ioctlspy.Event) {
	d.hold.Observe(ev)
	d.meter.Observe(ev)
	if m, ok := ev.(*ioctlspy.MemoryAllocated); ok && m.OOMKilled {
		d.noteOOMKill(m)
	}
	if h := ev.Hdr(); h.Held {
		if w := d.wakers.Load(); w != nil {
			w.Wake(h.PID, h.CgroupID)
		}
	}
}

// Run serves until ctx ends, then stops everything.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 3)
	go func() {
		errs <- d.spy.Run(ctx, d.observe)
	}()
	go func() {
		if err := d.server.Serve(d.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("serve: %w", err)
		}
	}()
	if d.metricsServer != nil {
		go func() {
			if err := d.metricsServer.Serve(d.metricsListener); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errs <- fmt.Errorf("serve metrics: %w", err)
			}
		}()
	}
	tick := time.NewTicker(d.period())
	defer tick.Stop()
	period := d.period()
	d.sampleExact()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		d.sampleEveryWindow(ctx)
	}()
	held := make(chan struct{})
	go func() {
		defer close(held)
		d.hold.Run(ctx)
	}()
	plugged := make(chan struct{})
	go func() {
		defer close(plugged)
		if d.nri != nil {
			d.nri.Run(ctx)
		}
	}()
	leased := make(chan struct{})
	go func() {
		defer close(leased)
		d.renewLease(ctx)
	}()
	readMemory := make(chan struct{})
	go func() { defer close(readMemory); d.driverMem.Run(ctx, d.cfg.Window) }()
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			began := time.Now()
			d.meter.Tick()
			d.checkRecording()
			d.stepMu.Lock()
			d.control(ctx)
			d.stepMu.Unlock()
			d.noteControl(time.Since(began))
			if p := d.period(); p != period {
				period = p
				tick.Reset(p)
			}
		case err := <-errs:
			runErr = err
			break loop
		}
	}
	cancel()
	<-sampled
	<-held
	<-leased
	<-plugged
	<-readMemory
	return errors.Join(runErr, d.Stop())
}

// gateLease is how long the launch gates may stop processes unless the
// daemon renews their lease, which it does every gateLeaseRenew while it
// runs: once it is gone, or stalled that long, no gate stops anyone, so
// nothing is stopped that nobody is left to release. A lapse lets launches
// through uncounted by no one: the gate still counts them, and the pacer
// charges them when it runs again.
const (
	gateLease      = 250 * time.Millisecond
	gateLeaseRenew = 50 * time.Millisecond
)

// renewLease keeps the launch gates' lease until ctx ends, then ends it.
func (d *Daemon) renewLease(ctx context.Context) {
	tick := time.NewTicker(gateLeaseRenew)
	defer tick.Stop()
	for {
		if err := d.probes.RenewLease(gateLease); err != nil {
			d.log.Warn("launch gates: renew their lease", "err", err)
		}
		select {
		case <-ctx.Done():
			if err := d.probes.EndLease(); err != nil {
				d.log.Warn("launch gates: end their lease", "err", err)
			}
			return
		case <-tick.C:
		}
	}
}

// sampleEveryWindow reads the exact source and ends the processes whose
// exit was lost, once a window until ctx ends. Both scan /proc (every
// process's fds, every process's stat), which on a host of many processes
// can take longer than a control period: off the control loop, they never
// delay a step.
func (d *Daemon) sampleEveryWindow(ctx context.Context) {
	tick := time.NewTicker(d.cfg.Window)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			d.sampleExact()
			d.saveBacklogs()
			d.reconcileExits()
			d.replaySpool()
			if d.cfg.WatchPolicy {
				d.watchPolicy()
			}
		}
	}
}

// noteControl keeps the durations of the control steps of the last window.
func (d *Daemon) noteControl(took time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.controlTimes = append(d.controlTimes, took)
	if n := int(d.cfg.Window / d.policy.Period); len(d.controlTimes) > max(n, 1) {
		d.controlTimes = d.controlTimes[len(d.controlTimes)-max(n, 1):]
	}
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
	// Only the run loop writes the previous sample: it reads it back
	// without the lock, which the shares' /proc reads must not hold.
	d.mu.Lock()
	prev, at := d.exactPrev, d.exactAt
	d.mu.Unlock()
	var shares map[string]float64
	if prev != nil {
		shares = exact.Shares(prev, cur, uint64(now.Sub(at)), func(pid uint32) string {
			p, _ := cgroup.ProcessPath(int(pid))
			return p
		})
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if prev != nil {
		d.exactShares = shares
	}
	d.exactPrev, d.exactAt = cur, now
}

// checkRecording logs, once, that the meter's recording ended on an error
// (a full disk): the daemon runs on without it.
func (d *Daemon) checkRecording() {
	if d.recording == nil || d.recordingFailed {
		return
	}
	if err := d.meter.FlushRecording(); err != nil {
		d.recordingFailed = true
		d.log.Warn("the meter's recording stopped", "path", d.cfg.RecordMeter, "err", err)
	}
}
