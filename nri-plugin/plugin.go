// Package nriplugin makes the gpuarb daemon an NRI plugin (containerd ≥ 2.0
// and CRI-O ≥ 1.30 run NRI by default): it registers the containers of
// Kubernetes pods as tenants from their pods' gpuarb.io/* annotations,
// removes them when they stop, and reconciles with the runtime's list of
// running containers at every (re)connect, with no runtime configuration
// and no change to any container.
//
// A tenant is registered at StartContainer, which the runtime sends after
// it created the container (cgroup made, pid known) and before the
// container's process runs: the same point as an OCI prestart hook. A bad
// annotation fails the container's creation (CreateContainer) with a
// message that names it, as the OCI hook does. Every request is answered
// within Options.Timeout, below the runtime's 2 s deadline (a runtime
// drops a plugin that misses it): a registration the daemon has not made
// by then completes on its own after the answer.
//
// Registration goes through the same admission rules and name ownership
// as the OCI hook's (owner "container ID", ocihook.Owner), so the hook and
// the plugin on one host agree about every container.
package nriplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"path"
	"sync"
	"time"

	nriapi "github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/containerd/nri/pkg/stub"

	"github.com/gpuarb/gpuarb/api"
	ocihook "github.com/gpuarb/gpuarb/oci-hook"
	"github.com/gpuarb/gpuarb/policy"
)

// DefaultSocket is where containerd and CRI-O serve NRI.
const DefaultSocket = nriapi.DefaultSocketPath

// Defaults of Options.
const (
	DefaultName    = "gpuarb"
	DefaultIndex   = "50"
	DefaultTimeout = 1500 * time.Millisecond
	// maxRetry bounds the wait between connection attempts.
	maxRetry = 10 * time.Second
)

// ErrOwnContainer is what Registry.Attach answers for a container gpuarb
// itself runs in (the DaemonSet's): never a tenant, and no error.
var ErrOwnContainer = errors.New("gpuarb's own container")

// Registry is what the plugin needs of the daemon: registrations as the
// API makes a workload's (admission rules, name ownership), marked as the
// plugin's so that reconciliation touches no other.
type Registry interface {
	// Attach registers t for owner; an error wrapping api.ErrConflict
	// means the name is another's, one wrapping ErrOwnContainer that t is
	// gpuarb's own.
	Attach(t policy.Tenant, owner string) (api.AttachResult, error)
	// Detach removes the tenant name that owner attached; found is false
	// when owner has none of that name.
	Detach(name, owner string) (found bool, err error)
	// Attached lists the owner of each tenant the plugin attached, with
	// the tenant's name.
	Attached() map[string]string
}

// Options configure the plugin.
type Options struct {
	// Socket is the runtime's NRI socket (default DefaultSocket).
	Socket string
	// Name and Index identify the plugin to the runtime, which orders
	// plugins by index (defaults "gpuarb", "50").
	Name, Index string
	// Timeout bounds the answer to each request (default 1.5 s; the
	// runtime's deadline is 2 s).
	Timeout time.Duration
	// PerPod makes each pod one tenant (its cgroup, the parent of its
	// containers'; named by gpuarb.io/name, else NAMESPACE:POD), where
	// each container is one by default.
	PerPod bool
	// ProcRoot is where /proc is mounted (default "/proc"; tests).
	ProcRoot string
	Log      *slog.Logger
}

// Plugin is a running NRI plugin; Run connects it.
type Plugin struct {
	reg Registry
	o   Options

	mu     sync.Mutex
	status api.NRIStatus
}

// New returns a plugin that registers tenants in reg.
func New(reg Registry, o Options) *Plugin {
	if o.Socket == "" {
		o.Socket = DefaultSocket
	}
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.Index == "" {
		o.Index = DefaultIndex
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	// The library's logger is global: the first plugin's log takes it.
	libraryLog.Do(func() { nrilog.Set(logger{o.Log}) })
	return &Plugin{reg: reg, o: o, status: api.NRIStatus{Socket: o.Socket}}
}

var libraryLog sync.Once

// logger passes the NRI library's messages to the daemon's log, its
// routine ones (each connection's steps) at debug level.
type logger struct{ l *slog.Logger }

func (g logger) Debugf(_ context.Context, format string, args ...any) {
	g.l.Debug("NRI: " + fmt.Sprintf(format, args...))
}

func (g logger) Infof(_ context.Context, format string, args ...any) {
	g.l.Debug("NRI: " + fmt.Sprintf(format, args...))
}

func (g logger) Warnf(_ context.Context, format string, args ...any) {
	g.l.Warn("NRI: " + fmt.Sprintf(format, args...))
}

func (g logger) Errorf(_ context.Context, format string, args ...any) {
	g.l.Error("NRI: " + fmt.Sprintf(format, args...))
}

// Status is the plugin's state for `gpuarb status`.
func (p *Plugin) Status() api.NRIStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// Run connects to the runtime and serves it until ctx ends, connecting
// again whenever the connection is lost (a runtime restart, a request
// the runtime gave up on) or cannot be made (no socket yet), waiting
// 0.5 s at first and up to 10 s between attempts.
func (p *Plugin) Run(ctx context.Context) {
	wait := 500 * time.Millisecond
	for ctx.Err() == nil {
		err := p.serve(ctx)
		p.mu.Lock()
		wasUp := p.status.Connected
		p.status.Connected = false
		if err != nil {
			p.status.LastError = err.Error()
		}
		p.mu.Unlock()
		switch {
		case ctx.Err() != nil:
			return
		case wasUp:
			p.o.Log.Warn("NRI: connection to the runtime lost; connecting again", "socket", p.o.Socket, "err", err)
			wait = 500 * time.Millisecond
		case err != nil && wait == 500*time.Millisecond:
			p.o.Log.Warn("NRI: cannot connect to the runtime; trying again until it answers", "socket", p.o.Socket, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, maxRetry)
	}
}

// serve makes one connection and returns when it ends.
func (p *Plugin) serve(ctx context.Context) error {
	closed := make(chan struct{})
	var once sync.Once
	dialed := make(chan net.Conn, 1)
	s, err := stub.New(p,
		stub.WithPluginName(p.o.Name), stub.WithPluginIdx(p.o.Index), stub.WithSocketPath(p.o.Socket),
		stub.WithDialer(func(path string) (net.Conn, error) {
			c, err := net.DialTimeout("unix", path, p.o.Timeout)
			if err == nil {
				dialed <- c
			}
			return c, err
		}),
		// Without it the stub exits the process when the connection drops.
		stub.WithOnClose(func() { once.Do(func() { close(closed) }) }))
	if err != nil {
		return fmt.Errorf("NRI stub: %w", err)
	}
	started := make(chan error, 1)
	go func() { started <- s.Start(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		// The stub holds its lock until the runtime configures it: end the
		// connection under it rather than wait for that.
		select {
		case c := <-dialed:
			_ = c.Close()
		default:
		}
		return nil
	}
	select {
	case <-closed:
		return errors.New("the runtime closed the connection")
	case <-ctx.Done():
		s.Stop()
		return nil
	}
}

// Configure subscribes to the events the plugin handles.
func (p *Plugin) Configure(_ context.Context, _, runtime, version string) (stub.EventMask, error) {
	p.mu.Lock()
	p.status.Connected, p.status.Runtime, p.status.RuntimeVersion = true, runtime, version
	p.status.Since, p.status.LastError = time.Now().UTC(), ""
	p.mu.Unlock()
	p.o.Log.Info("NRI: connected", "runtime", runtime, "version", version, "socket", p.o.Socket)
	return 0, nil
}

// Synchronize reconciles with the runtime's containers: those created or
// running are registered, the plugin's tenants of containers that no
// longer exist are removed.
func (p *Plugin) Synchronize(ctx context.Context, pods []*nriapi.PodSandbox, ctrs []*nriapi.Container) ([]*nriapi.ContainerUpdate, error) {
	podOf := map[string]*nriapi.PodSandbox{}
	for _, pod := range pods {
		podOf[pod.GetId()] = pod
	}
	live := map[string]bool{}
	var reg []func() error
	for _, c := range ctrs {
		switch c.GetState() {
		case nriapi.ContainerState_CONTAINER_CREATED, nriapi.ContainerState_CONTAINER_RUNNING, nriapi.ContainerState_CONTAINER_PAUSED:
		default:
			continue
		}
		live[ocihook.Owner(c.GetId())] = true
		live[podOwner(c.GetPodSandboxId())] = true
		if pod := podOf[c.GetPodSandboxId()]; pod != nil {
			reg = append(reg, func() error { return p.register(pod, c) })
		}
	}
	var stale []func() error
	for owner, name := range p.reg.Attached() {
		if !live[owner] {
			stale = append(stale, func() error { return p.detach(owner, name) })
		}
	}
	p.bounded(ctx, "synchronize", func() error {
		var errs []error
		// The gone first: a new container may take a name one of them held.
		for _, f := range append(stale, reg...) {
			errs = append(errs, f())
		}
		return errors.Join(errs...)
	})
	p.o.Log.Info("NRI: synchronized with the runtime", "pods", len(pods), "containers", len(ctrs), "running", len(live), "gone", len(stale))
	return nil, nil
}

// CreateContainer refuses a container whose gpuarb.io/* annotations are
// invalid, with the reason, before the runtime makes it. It adjusts
// nothing.
func (p *Plugin) CreateContainer(_ context.Context, pod *nriapi.PodSandbox, c *nriapi.Container) (*nriapi.ContainerAdjustment, []*nriapi.ContainerUpdate, error) {
	if _, err := ocihook.RulesFromAnnotations(annotations(pod, c)); err != nil {
		p.o.Log.Warn("NRI: refused a container for its annotations", "pod", podName(pod), "container", c.GetName(), "err", err)
		return nil, nil, fmt.Errorf("gpuarb: pod %s: %w", podName(pod), err)
	}
	return nil, nil, nil
}

// StartContainer registers the container, before its process runs.
func (p *Plugin) StartContainer(ctx context.Context, pod *nriapi.PodSandbox, c *nriapi.Container) error {
	p.bounded(ctx, "register "+c.GetId(), func() error { return p.register(pod, c) })
	return nil
}

// StopContainer removes the container's tenant; the runtime sends it
// also when the container exits by itself. A pod's tenant stays until the
// pod stops.
func (p *Plugin) StopContainer(ctx context.Context, pod *nriapi.PodSandbox, c *nriapi.Container) ([]*nriapi.ContainerUpdate, error) {
	if !p.o.PerPod {
		p.bounded(ctx, "detach "+c.GetId(), func() error { return p.detachContainer(pod, c) })
	}
	return nil, nil
}

// RemoveContainer removes the container's tenant if StopContainer did not.
func (p *Plugin) RemoveContainer(ctx context.Context, pod *nriapi.PodSandbox, c *nriapi.Container) error {
	if !p.o.PerPod {
		p.bounded(ctx, "detach "+c.GetId(), func() error { return p.detachContainer(pod, c) })
	}
	return nil
}

// StopPodSandbox removes the pod's tenant (per-pod tenancy).
func (p *Plugin) StopPodSandbox(ctx context.Context, pod *nriapi.PodSandbox) error {
	if p.o.PerPod {
		p.bounded(ctx, "detach pod "+podName(pod), func() error { return p.detachPod(pod) })
	}
	return nil
}

// RemovePodSandbox removes the pod's tenant if StopPodSandbox did not.
func (p *Plugin) RemovePodSandbox(ctx context.Context, pod *nriapi.PodSandbox) error {
	return p.StopPodSandbox(ctx, pod)
}

// bounded runs f and waits for it until the plugin's timeout or ctx's
// deadline, whichever is first; f goes on after that, and its error is
// logged whenever it comes.
func (p *Plugin) bounded(ctx context.Context, what string, f func() error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := f(); err != nil {
			p.o.Log.Warn("NRI: "+what, "err", err)
		}
	}()
	wait := p.o.Timeout
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)-100*time.Millisecond)
	}
	select {
	case <-done:
	case <-time.After(max(wait, 0)):
		p.o.Log.Warn("NRI: the daemon did not finish in time; answered the runtime, finishing after", "what", what, "waited", wait)
	}
}

// register attaches container c of pod as the OCI hook would at prestart:
// the name of gpuarb.io/name, else the container id (also when the name is
// another's), the rules of the annotations, the container's cgroup. Per
// pod, it attaches the pod instead (again at each of its containers: the
// same tenant).
func (p *Plugin) register(pod *nriapi.PodSandbox, c *nriapi.Container) error {
	a := annotations(pod, c)
	rules, err := ocihook.RulesFromAnnotations(a)
	if err != nil {
		return fmt.Errorf("container %s of pod %s: %w", c.GetId(), podName(pod), err)
	}
	cg, warn, err := ocihook.ContainerCgroup(c.GetLinux().GetCgroupsPath(), c.GetId(), int(c.GetPid()), p.o.ProcRoot)
	if err != nil {
		return fmt.Errorf("container %s of pod %s: %w", c.GetId(), podName(pod), err)
	}
	if warn != "" {
		p.o.Log.Warn("NRI: container cgroup", "container", c.GetId(), "pod", podName(pod), "warning", warn)
	}
	owner, fallback := ocihook.Owner(c.GetId()), c.GetId()
	t := policy.Tenant{Name: ocihook.TenantName(fallback, a), Selector: policy.Selector{Cgroup: cg}, Rules: rules}
	if p.o.PerPod {
		owner, fallback = podOwner(pod.GetId()), podTenant(pod)
		t.Name, t.Cgroup = cmp.Or(a[ocihook.AnnotationName], fallback), path.Dir(cg)
		if t.Cgroup == "/" || t.Cgroup == "." {
			return fmt.Errorf("pod %s: its container's cgroup %s has no pod cgroup above it", podName(pod), cg)
		}
	}
	_, err = p.reg.Attach(t, owner)
	if errors.Is(err, ErrOwnContainer) {
		p.o.Log.Debug("NRI: not registering gpuarb's own container", "pod", podName(pod), "container", c.GetId())
		return nil
	}
	if errors.Is(err, api.ErrConflict) && t.Name != fallback {
		p.o.Log.Warn("NRI: the name is another's; registered under "+fallback, "pod", podName(pod), "container", c.GetId(), "why", err)
		t.Name = fallback
		_, err = p.reg.Attach(t, owner)
	}
	if err != nil {
		return fmt.Errorf("register container %s of pod %s: %w", c.GetId(), podName(pod), err)
	}
	p.mu.Lock()
	p.status.Registered++
	p.mu.Unlock()
	p.o.Log.Info("NRI: registered", "tenant", t.Name, "pod", podName(pod), "container", c.GetName(), "cgroup", t.Cgroup)
	return nil
}

// detachPod removes the tenant of pod (per-pod tenancy), under its name
// or the one it fell back to.
func (p *Plugin) detachPod(pod *nriapi.PodSandbox) error {
	owner, fallback := podOwner(pod.GetId()), podTenant(pod)
	name := cmp.Or(pod.GetAnnotations()[ocihook.AnnotationName], fallback)
	found, err := p.reg.Detach(name, owner)
	if err == nil && !found && name != fallback {
		found, err = p.reg.Detach(fallback, owner)
	}
	if found {
		p.o.Log.Info("NRI: detached", "pod", podName(pod))
	}
	return err
}

// podTenant is the name of a pod's tenant when no annotation names it:
// NAMESPACE:POD ('/' cannot be in a tenant's name), else, past the 128
// characters a name may have, the pod's sandbox id.
func podTenant(pod *nriapi.PodSandbox) string {
	if n := pod.GetNamespace() + ":" + pod.GetName(); len(n) <= 128 {
		return n
	}
	return pod.GetId()
}

// podOwner is how the plugin names a pod to the daemon: the owner of the
// pod's tenant under per-pod tenancy.
func podOwner(id string) string { return "pod " + id }

// detachContainer removes the tenant of container c, under its name or
// the id it fell back to.
func (p *Plugin) detachContainer(pod *nriapi.PodSandbox, c *nriapi.Container) error {
	owner := ocihook.Owner(c.GetId())
	name := ocihook.TenantName(c.GetId(), annotations(pod, c))
	found, err := p.reg.Detach(name, owner)
	if err == nil && !found && name != c.GetId() {
		found, err = p.reg.Detach(c.GetId(), owner)
	}
	if found {
		p.o.Log.Info("NRI: detached", "pod", podName(pod), "container", c.GetName())
	}
	return err
}

// detach removes a tenant the plugin attached for a container that is gone.
func (p *Plugin) detach(owner, name string) error {
	found, err := p.reg.Detach(name, owner)
	if found {
		p.o.Log.Info("NRI: detached a tenant whose container is gone", "tenant", name, "owner", owner)
	}
	return err
}

// annotations are the pod's annotations (where Kubernetes users set
// gpuarb.io/*), then the container's over them.
func annotations(pod *nriapi.PodSandbox, c *nriapi.Container) map[string]string {
	a := maps.Clone(pod.GetAnnotations())
	if a == nil {
		a = map[string]string{}
	}
	maps.Copy(a, c.GetAnnotations())
	return a
}

func podName(pod *nriapi.PodSandbox) string {
	return pod.GetNamespace() + "/" + pod.GetName()
}
