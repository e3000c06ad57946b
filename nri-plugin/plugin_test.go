package nriplugin

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/policy"
)

// registry records what the plugin registers; attach may be made to
// take a while.
type registry struct {
	mu       sync.Mutex
	tenants  map[string]policy.Tenant // by owner
	names    map[string]string        // owner by name, as the daemon refuses another's name
	own      string                   // the cgroup gpuarb runs in: refused as the daemon does
	attachIn time.Duration
}

func newRegistry() *registry {
	return &registry{tenants: map[string]policy.Tenant{}, names: map[string]string{}}
}

func (r *registry) Attach(t policy.Tenant, owner string) (api.AttachResult, error) {
	r.mu.Lock()
	slow := r.attachIn
	r.mu.Unlock()
	time.Sleep(slow)
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.Cgroup == r.own {
		return api.AttachResult{}, fmt.Errorf("%w: tenant %s: refusing to freeze %s", ErrOwnContainer, t.Name, t.Cgroup)
	}
	if o, ok := r.names[t.Name]; ok && o != owner {
		return api.AttachResult{}, fmt.Errorf("%w: %q is attached by %s", api.ErrConflict, t.Name, o)
	}
	r.tenants[owner], r.names[t.Name] = t, owner
	return api.AttachResult{}, nil
}

func (r *registry) Detach(name, owner string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.tenants[owner]; !ok || t.Name != name {
		return false, nil
	}
	delete(r.tenants, owner)
	delete(r.names, name)
	return true, nil
}

func (r *registry) Attached() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for o, t := range r.tenants {
		out[o] = t.Name
	}
	return out
}

func (r *registry) snapshot() map[string]policy.Tenant {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.tenants)
}

// lockedBuffer is a log destination for several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runtime is the runtime side of NRI (the library containerd and CRI-O
// run), serving a socket with the pods and containers it is given. Its
// connections pass through a relay, so that kill ends them as the end of
// a runtime's process does.
type runtime struct {
	*nri.Adaptation
	mu    sync.Mutex
	pods  []*nri.PodSandbox
	ctrs  []*nri.Container
	relay net.Listener
	conns []net.Conn
}

// kill ends the runtime and every connection to it.
func (rt *runtime) kill() {
	rt.Stop()
	_ = rt.relay.Close()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, c := range rt.conns {
		_ = c.Close()
	}
}

// serveRelay forwards each connection to socket to the runtime's own.
func (rt *runtime) serveRelay(inner string) {
	for {
		c, err := rt.relay.Accept()
		if err != nil {
			return
		}
		r, err := net.Dial("unix", inner)
		if err != nil {
			_ = c.Close()
			continue
		}
		rt.mu.Lock()
		rt.conns = append(rt.conns, c, r)
		rt.mu.Unlock()
		go func() { _, _ = io.Copy(r, c); _ = r.Close() }()
		go func() { _, _ = io.Copy(c, r); _ = c.Close() }()
	}
}

func startRuntime(t *testing.T, socket string, pods []*nri.PodSandbox, ctrs []*nri.Container) *runtime {
	t.Helper()
	rt := &runtime{pods: pods, ctrs: ctrs}
	inner := socket + ".runtime"
	sync := func(ctx context.Context, cb nri.SyncCB) error {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		_, err := cb(ctx, rt.pods, rt.ctrs)
		return err
	}
	update := func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil }
	a, err := nri.New("test-runtime", "v0", sync, update, nri.WithSocketPath(inner), nri.WithPluginPath(t.TempDir()), nri.WithPluginConfigPath(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	rt.Adaptation = a
	if rt.relay, err = net.Listen("unix", socket); err != nil {
		t.Fatal(err)
	}
	go rt.serveRelay(inner)
	t.Cleanup(rt.kill)
	return rt
}

func startPlugin(t *testing.T, reg Registry, socket string) *Plugin {
	t.Helper()
	return startPluginWith(t, reg, Options{Socket: socket})
}

func startPluginWith(t *testing.T, reg Registry, o Options) *Plugin {
	t.Helper()
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	p := New(reg, o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("the plugin did not stop within 5 s of its context's end")
		}
	})
	return p
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 5 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitServed waits until the runtime sends the plugin its events: a
// runtime adds a plugin to those it serves only after the plugin's
// Synchronize returned. A container with a bad annotation tells: the
// plugin refuses it.
func waitServed(t *testing.T, rt *runtime) {
	t.Helper()
	probe := &nri.CreateContainerRequest{Pod: &nri.PodSandbox{Id: "probe", Annotations: map[string]string{"gpuarb.io/weight": "0"}},
		Container: &nri.Container{Id: "probe", PodSandboxId: "probe"}}
	waitFor(t, "the runtime serving the plugin", func() bool {
		_, err := rt.CreateContainer(context.Background(), probe)
		return err != nil
	})
}

var pod = &nri.PodSandbox{Id: "pod1", Name: "web", Namespace: "prod",
	Annotations: map[string]string{"gpuarb.io/weight": "200", "gpuarb.io/name": "web"}}

func container(id string, state nri.ContainerState) *nri.Container {
	return &nri.Container{Id: id, PodSandboxId: pod.Id, Name: "c-" + id, State: state,
		Linux: &nri.LinuxContainer{CgroupsPath: "/kubepods/pod1/" + id}}
}

// At (re)connect the plugin registers the runtime's running containers
// with their pods' policy and removes its tenants of containers that are
// gone; after that it follows the containers' lifecycle.
func TestPluginFollowsTheRuntime(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nri.sock")
	reg := newRegistry()
	reg.tenants["container gone"], reg.names["gone"] = policy.Tenant{Name: "gone"}, "container gone"
	reg.own = "/kubepods/pod1/gpuarb" // the DaemonSet's container: no tenant, no error
	rt := startRuntime(t, socket, []*nri.PodSandbox{pod},
		[]*nri.Container{container("run", nri.ContainerState_CONTAINER_RUNNING), container("stopped", nri.ContainerState_CONTAINER_STOPPED),
			container("gpuarb", nri.ContainerState_CONTAINER_RUNNING)})
	var warnings lockedBuffer
	p := startPluginWith(t, reg, Options{Socket: socket, Log: slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	waitFor(t, "registration at synchronize", func() bool { _, ok := reg.snapshot()["container run"]; return ok })
	got := reg.snapshot()
	if want := (policy.Tenant{Name: "web", Selector: policy.Selector{Cgroup: "/kubepods/pod1/run"}, Rules: policy.Rules{Weight: 200}}); len(got) != 1 || got["container run"] != want {
		t.Errorf("after synchronize: %+v, want only %+v", got, want)
	}
	if st := p.Status(); !st.Connected || st.Runtime != "test-runtime" || st.Registered != 1 {
		t.Errorf("status %+v", st)
	}
	if w := warnings.String(); strings.Contains(w, "own container") {
		t.Errorf("gpuarb's own container is warned about:\n%s", w)
	}

	// A second container of the pod: the pod's name is the first's, so it
	// is registered under its id.
	waitServed(t, rt)
	ctx := context.Background()
	c2 := container("second", nri.ContainerState_CONTAINER_CREATED)
	if _, err := rt.CreateContainer(ctx, &nri.CreateContainerRequest{Pod: pod, Container: c2}); err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := rt.StartContainer(ctx, &nri.StateChangeEvent{Event: nri.Event_START_CONTAINER, Pod: pod, Container: c2}); err != nil {
		t.Fatalf("start: %v", err)
	}
	if tn := reg.snapshot()["container second"]; tn.Name != "second" || tn.Weight != 200 {
		t.Errorf("second container registered as %+v, want under its id with the pod's weight", tn)
	}
	if _, err := rt.StopContainer(ctx, &nri.StopContainerRequest{Pod: pod, Container: c2}); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, ok := reg.snapshot()["container second"]; ok {
		t.Error("a stopped container's tenant is still registered")
	}

	// A bad annotation refuses the container at its creation, naming it.
	bad := &nri.PodSandbox{Id: "pod2", Name: "bad", Namespace: "prod", Annotations: map[string]string{"gpuarb.io/weight": "banana"}}
	_, err := rt.CreateContainer(ctx, &nri.CreateContainerRequest{Pod: bad, Container: &nri.Container{Id: "b", PodSandboxId: "pod2"}})
	if err == nil || !strings.Contains(err.Error(), `gpuarb.io/weight="banana"`) {
		t.Errorf("create with gpuarb.io/weight=banana: %v, want refused naming the annotation", err)
	}

	// A runtime restart: the plugin connects again and reconciles.
	rt.kill()
	rt = startRuntime(t, socket, []*nri.PodSandbox{pod}, []*nri.Container{container("new", nri.ContainerState_CONTAINER_RUNNING)})
	waitFor(t, "reconciliation after the runtime's restart", func() bool {
		got := reg.snapshot()
		_, ok := got["container new"]
		return ok && len(got) == 1
	})
	if tn := reg.snapshot()["container new"]; tn.Name != "web" {
		t.Errorf("after the restart the pod's container registered as %q, want the name its predecessor left", tn.Name)
	}
}

// A daemon that takes longer than the runtime's deadline does not make
// the runtime drop the plugin: the answer comes within the plugin's
// timeout, and the registration lands after it.
func TestPluginAnswersInTimeWhateverTheDaemonDoes(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nri.sock")
	reg := newRegistry()
	rt := startRuntime(t, socket, nil, nil)
	p := startPlugin(t, reg, socket)
	waitFor(t, "connection", func() bool { return p.Status().Connected })
	waitServed(t, rt)
	reg.mu.Lock()
	reg.attachIn = 3 * time.Second
	reg.mu.Unlock()
	c := container("slow", nri.ContainerState_CONTAINER_CREATED)
	began := time.Now()
	err := rt.StartContainer(context.Background(), &nri.StateChangeEvent{Event: nri.Event_START_CONTAINER, Pod: pod, Container: c})
	took := time.Since(began)
	if err != nil || took > DefaultTimeout+300*time.Millisecond {
		t.Errorf("start answered in %v (%v), want within %v", took, err, DefaultTimeout)
	}
	waitFor(t, "the late registration", func() bool { _, ok := reg.snapshot()["container slow"]; return ok })
	if !p.Status().Connected {
		t.Error("the runtime dropped the plugin")
	}
}

// Per pod, the pod is one tenant: its cgroup, registered at its first
// container, kept while other containers come and go, removed when the
// pod stops; unnamed pods are NAMESPACE:POD.
func TestPluginPerPod(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nri.sock")
	reg := newRegistry()
	unnamed := &nri.PodSandbox{Id: "pod9", Name: "batch", Namespace: "ml"}
	rt := startRuntime(t, socket, []*nri.PodSandbox{pod, unnamed}, []*nri.Container{
		container("run", nri.ContainerState_CONTAINER_RUNNING),
		{Id: "u1", PodSandboxId: "pod9", State: nri.ContainerState_CONTAINER_RUNNING, Linux: &nri.LinuxContainer{CgroupsPath: "/kubepods/pod9/u1"}},
	})
	startPluginWith(t, reg, Options{Socket: socket, PerPod: true})
	waitFor(t, "registration at synchronize", func() bool { return len(reg.snapshot()) == 2 })
	got := reg.snapshot()
	if got["pod pod1"].Name != "web" || got["pod pod1"].Cgroup != "/kubepods/pod1" || got["pod pod1"].Weight != 200 ||
		got["pod pod9"].Name != "ml:batch" || got["pod pod9"].Cgroup != "/kubepods/pod9" {
		t.Errorf("per pod: %+v", got)
	}
	waitServed(t, rt)
	ctx := context.Background()
	c2 := container("second", nri.ContainerState_CONTAINER_CREATED)
	if err := rt.StartContainer(ctx, &nri.StateChangeEvent{Event: nri.Event_START_CONTAINER, Pod: pod, Container: c2}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.StopContainer(ctx, &nri.StopContainerRequest{Pod: pod, Container: c2}); err != nil {
		t.Fatal(err)
	}
	if got := reg.snapshot(); len(got) != 2 || got["pod pod1"].Name != "web" {
		t.Errorf("after a second container came and went: %+v, want the pod's tenant unchanged", got)
	}
	if err := rt.StopPodSandbox(ctx, &nri.StateChangeEvent{Event: nri.Event_STOP_POD_SANDBOX, Pod: pod}); err != nil {
		t.Fatal(err)
	}
	if got := reg.snapshot(); len(got) != 1 {
		t.Errorf("after the pod stopped: %+v, want its tenant gone", got)
	}
}
