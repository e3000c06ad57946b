package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"
	"github.com/urfave/cli/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpuarb/gpuarb/api"
	nriplugin "github.com/gpuarb/gpuarb/nri-plugin"
	ocihook "github.com/gpuarb/gpuarb/oci-hook"
	"github.com/gpuarb/gpuarb/policy"
)

// checkCommandLine fails unless args is a gpuarb command line this binary
// accepts: known (sub)commands, known flags, values where flags take them.
func checkCommandLine(args []string) error {
	if len(args) == 0 || filepath.Base(args[0]) != "gpuarb" {
		return fmt.Errorf("%q does not run gpuarb", args)
	}
	cmds := newApp().Commands
	var cmd *cli.Command
	i := 1
	for ; i < len(args) && !strings.HasPrefix(args[i], "-"); i++ {
		var next *cli.Command
		for _, c := range cmds {
			if c.HasName(args[i]) {
				next = c
			}
		}
		if next == nil {
			if cmd != nil && len(cmd.Subcommands) == 0 {
				break // a positional argument
			}
			return fmt.Errorf("%q: no command %q", args, args[i])
		}
		cmd, cmds = next, next.Subcommands
	}
	if cmd == nil {
		return fmt.Errorf("%q names no command", args)
	}
	for ; i < len(args); i++ {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") {
			continue // a positional argument
		}
		var flag cli.Flag
		for _, f := range cmd.Flags {
			for _, n := range f.Names() {
				if n == name {
					flag = f
				}
			}
		}
		if flag == nil {
			return fmt.Errorf("%q: %s has no flag --%s", args, cmd.Name, name)
		}
		if _, isBool := flag.(*cli.BoolFlag); !isBool && !hasValue {
			if i+1 >= len(args) {
				return fmt.Errorf("%q: --%s needs a value", args, name)
			}
			i++
		}
	}
	return nil
}

func TestCheckCommandLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"/usr/bin/gpuarb", "daemon", "--policy", "/p", "--observe-only"}, true},
		{[]string{"gpuarb", "hooks", "install", "--runtime=crio"}, true},
		{[]string{"gpuarb", "oci-hook", "prestart"}, true},
		{[]string{"gpuarb", "daemon", "--polcy", "/p"}, false},
		{[]string{"gpuarb", "deamon"}, false},
		{[]string{"gpuarb", "daemon", "--policy"}, false},
		{[]string{"/bin/sh", "-c", "x"}, false},
	} {
		if err := checkCommandLine(c.args); (err == nil) != c.ok {
			t.Errorf("%q: %v", c.args, err)
		}
	}
}

// shellCommands returns the gpuarb command lines of a `sh -c` script of
// simple commands joined by &&.
func shellCommands(script string) [][]string {
	var out [][]string
	for _, part := range strings.Split(script, "&&") {
		if f := strings.Fields(part); len(f) > 0 && filepath.Base(f[0]) == "gpuarb" {
			out = append(out, f)
		}
	}
	return out
}

// manifest is deploy/kubernetes/gpuarb.yaml's objects.
type manifest struct {
	ds         *appsv1.DaemonSet
	configMaps map[string]*corev1.ConfigMap
	namespaces []string
	netpols    []*networkingv1.NetworkPolicy
}

// readManifest parses the manifest strictly (an unknown field fails).
func readManifest(t *testing.T) manifest {
	t.Helper()
	data, err := os.ReadFile("../../deploy/kubernetes/gpuarb.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := manifest{configMaps: map[string]*corev1.ConfigMap{}}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		var obj any
		switch meta.Kind {
		case "Namespace":
			obj = &corev1.Namespace{}
		case "ConfigMap":
			obj = &corev1.ConfigMap{}
		case "DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "NetworkPolicy":
			obj = &networkingv1.NetworkPolicy{}
		default:
			t.Fatalf("unexpected kind %q", meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
		switch o := obj.(type) {
		case *corev1.Namespace:
			m.namespaces = append(m.namespaces, o.Name)
		case *corev1.ConfigMap:
			m.configMaps[o.Name] = o
		case *appsv1.DaemonSet:
			m.ds = o
		case *networkingv1.NetworkPolicy:
			m.netpols = append(m.netpols, o)
		}
	}
	if m.ds == nil {
		t.Fatal("no DaemonSet")
	}
	return m
}

func TestKubernetesManifest(t *testing.T) {
	m := readManifest(t)
	ds, configMaps, namespaces, netpols := m.ds, m.configMaps, m.namespaces, m.netpols
	if ds.Namespace != namespaces[0] {
		t.Errorf("DaemonSet in %q, namespace %q", ds.Namespace, namespaces)
	}
	pod := ds.Spec.Template.Spec
	if !pod.HostPID {
		t.Error("not hostPID: the daemon cannot see or freeze the tenants")
	}
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the template", k, v)
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("containers %d", len(pod.Containers))
	}
	daemon := pod.Containers[0]
	if sc := daemon.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Error("the daemon is not privileged")
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		for _, m := range c.VolumeMounts {
			v, ok := volumes[m.Name]
			if !ok {
				t.Errorf("%s mounts missing volume %s", c.Name, m.Name)
			}
			if v.HostPath != nil && c.Name == daemon.Name && v.HostPath.Path != m.MountPath {
				t.Errorf("host %s at %s in the daemon: paths must be the host's", v.HostPath.Path, m.MountPath)
			}
			if c.Name == daemon.Name {
				mounts[m.MountPath] = m
			}
		}
	}
	for _, p := range []string{"/sys/fs/bpf", filepath.Dir(api.DefaultSocket), "/sys/fs/cgroup", "/etc/gpuarb"} {
		if _, ok := mounts[p]; !ok {
			t.Errorf("the daemon does not mount %s", p)
		}
	}
	if m := mounts["/sys/fs/bpf"]; m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
		t.Error("/sys/fs/bpf without Bidirectional propagation: pins would not reach the host")
	}
	// The policy the daemon reads is the ConfigMap's, and it is valid.
	pv := volumes[mounts["/etc/gpuarb"].Name]
	if pv.ConfigMap == nil || configMaps[pv.ConfigMap.Name] == nil {
		t.Fatalf("policy volume %+v names no ConfigMap of the manifest", pv)
	}
	pol := configMaps[pv.ConfigMap.Name].Data[filepath.Base(policy.DefaultPath)]
	if _, err := policy.Parse([]byte(pol)); err != nil {
		t.Errorf("policy ConfigMap: %v", err)
	}
	// Every command is one this binary accepts.
	if daemon.LivenessProbe == nil || daemon.LivenessProbe.Exec == nil {
		t.Fatal("no liveness probe: a hung daemon would never be restarted")
	}
	lines := [][]string{daemon.Command, daemon.Lifecycle.PreStop.Exec.Command, daemon.ReadinessProbe.Exec.Command,
		daemon.LivenessProbe.Exec.Command}
	for _, c := range pod.InitContainers {
		if len(c.Command) == 3 && c.Command[1] == "-c" {
			lines = append(lines, shellCommands(c.Command[2])...)
		} else {
			lines = append(lines, c.Command)
		}
	}
	if len(lines) < 4 {
		t.Errorf("the init container runs no gpuarb command: %d command lines", len(lines))
	}
	for _, l := range lines {
		if err := checkCommandLine(l); err != nil {
			t.Error(err)
		}
	}
	// Metrics: the port the daemon listens on is the one declared and
	// annotated for scraping.
	var addr string
	for i, a := range daemon.Command {
		if a == "--metrics-addr" && i+1 < len(daemon.Command) {
			addr = daemon.Command[i+1]
		}
	}
	_, port, _ := strings.Cut(addr, ":")
	if len(daemon.Ports) != 1 || fmt.Sprint(daemon.Ports[0].ContainerPort) != port ||
		ds.Spec.Template.Annotations["prometheus.io/port"] != port {
		t.Errorf("metrics on %q, ports %+v, annotations %v", addr, daemon.Ports, ds.Spec.Template.Annotations)
	}
	// and not open to the whole cluster network: a NetworkPolicy selects
	// the daemon's pods and admits the port from selected namespaces only.
	guarded := false
	for _, np := range netpols {
		selects := np.Namespace == ds.Namespace
		for k, v := range np.Spec.PodSelector.MatchLabels {
			selects = selects && ds.Spec.Template.Labels[k] == v
		}
		for _, in := range np.Spec.Ingress {
			for _, from := range in.From {
				if selects && from.NamespaceSelector != nil && len(from.NamespaceSelector.MatchLabels) > 0 &&
					len(in.Ports) == 1 && in.Ports[0].Port != nil && in.Ports[0].Port.String() == port {
					guarded = true
				}
			}
		}
	}
	if !guarded {
		t.Error("the metrics port is open to every pod: no NetworkPolicy limits it to selected namespaces")
	}
}

func TestSystemdUnit(t *testing.T) {
	f, err := os.Open("../../deploy/systemd/gpuarb.service")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	opts, err := unit.DeserializeOptions(f)
	if err != nil {
		t.Fatal(err)
	}
	service := map[string][]string{}
	for _, o := range opts {
		if o.Section == "Service" {
			service[o.Name] = append(service[o.Name], o.Value)
		}
	}
	for _, key := range []string{"ExecStart", "ExecStopPost"} {
		if len(service[key]) != 1 {
			t.Fatalf("%s: %q", key, service[key])
		}
		args := strings.Fields(service[key][0])
		if err := checkCommandLine(args); err != nil {
			t.Errorf("%s: %v", key, err)
		}
	}
	if got := strings.Fields(service["ExecStopPost"][0])[1:]; strings.Join(got, " ") != "thaw --all" {
		t.Errorf("ExecStopPost runs %q, want thaw --all", got)
	}
	if bin := strings.Fields(service["ExecStart"][0])[0]; bin != installedBinary(t) {
		t.Errorf("the unit runs %s, make install puts gpuarb in %s", bin, installedBinary(t))
	}
	want := map[string]string{
		"KillMode":                 "control-group",
		"RuntimeDirectory":         filepath.Base(filepath.Dir(api.DefaultSocket)),
		"RuntimeDirectoryPreserve": "yes",
		"Restart":                  "on-failure",
	}
	for k, v := range want {
		if got := service[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s=%q, want %q", k, got, v)
		}
	}
}

// installedBinary is where the Makefile's install target puts gpuarb.
func installedBinary(t *testing.T) string {
	f, err := os.Open("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), "?="); ok && strings.TrimSpace(k) == "PREFIX" {
			return filepath.Join(strings.TrimSpace(v), "bin", "gpuarb")
		}
	}
	t.Fatal("the Makefile sets no PREFIX")
	return ""
}

// The DaemonSet's init container picks the integration the node's runtime
// takes, on each runtime's layout of the host (the manifest's own command
// line, its --host a tree of that layout), and what it writes lies on the
// init container's writable host mounts; on NRI the daemon reaches the
// runtime's socket.
func TestManifestPicksTheIntegration(t *testing.T) {
	ds := readManifest(t).ds
	pod := ds.Spec.Template.Spec
	var setup []string
	writable := map[string]bool{}
	for _, c := range pod.InitContainers {
		if len(c.Command) == 3 && c.Command[1] == "-c" {
			for _, l := range shellCommands(c.Command[2]) {
				if len(l) > 2 && l[1] == "hooks" && l[2] == "setup" {
					setup = l
				}
			}
		}
		for _, m := range c.VolumeMounts {
			if !m.ReadOnly {
				writable[m.MountPath] = true
			}
		}
	}
	hostAt := slices.Index(setup, "--host")
	if hostAt < 0 || hostAt+1 >= len(setup) {
		t.Fatalf("no init container runs gpuarb hooks setup --host DIR: %q", setup)
	}
	mountedAt := setup[hostAt+1]

	socket := func(root, p string) {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("unix", filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
	}
	file := func(root, p, content string) {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name     string
		layout   func(root string)
		hooksDir string // where the hook must be; "" none
		fails    string // the error must say this
	}{
		{"containerd 2.x (NRI on by default), a hook an earlier install left", func(root string) {
			file(root, "/run/containerd/containerd.sock", "")
			socket(root, ocihook.NRISocketPath)
			file(root, "/etc/containers/oci/hooks.d/gpuarb-register.json", "{}")
		}, "", ""},
		{"CRI-O 1.30 (NRI on by default)", func(root string) {
			socket(root, "/run/crio/crio.sock")
			socket(root, ocihook.NRISocketPath)
		}, "", ""},
		{"CRI-O without NRI, hooks_dir in a drop-in", func(root string) {
			socket(root, "/run/crio/crio.sock")
			file(root, "/etc/crio/crio.conf", "[crio.runtime]\nhooks_dir = [\n  \"/usr/share/containers/oci/hooks.d\",  # default\n]\n")
			file(root, "/etc/crio/crio.conf.d/10-hooks.conf", "[crio.runtime]\nhooks_dir = [\"/etc/containers/oci/hooks.d\"]\n")
		}, "/etc/containers/oci/hooks.d", ""},
		{"CRI-O without NRI, its default hooks_dir", func(root string) {
			file(root, "/etc/crio/crio.conf", "[crio.runtime]\nlog_level = \"info\"\n")
		}, ocihook.CRIOHooksDir, ""},
		{"containerd 1.7 (NRI off by default)", func(root string) {
			file(root, "/run/containerd/containerd.sock", "")
		}, "", "NRI"},
		{"no runtime", func(string) {}, "", "neither containerd"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			c.layout(root)
			args := slices.Clone(setup[1:])
			args[hostAt] = root
			out, err := runApp(t, args...)
			if c.fails != "" {
				if err == nil || !strings.Contains(out+err.Error(), c.fails) {
					t.Errorf("%q: %v\n%s, want a failure saying %q", args, err, out, c.fails)
				}
				return
			}
			if err != nil {
				t.Fatalf("%q: %v\n%s", args, err, out)
			}
			for _, dir := range []string{"/etc/containers/oci/hooks.d", ocihook.CRIOHooksDir} {
				_, statErr := os.Stat(filepath.Join(root, dir, "gpuarb-register.json"))
				if want := dir == c.hooksDir; (statErr == nil) != want {
					t.Errorf("hook in %s: %v, want %v\n%s", dir, statErr == nil, want, out)
				}
			}
			if c.hooksDir != "" && !writable[filepath.Join(mountedAt, c.hooksDir)] {
				t.Errorf("the hook goes to %s, which the init container does not mount writable at %s", c.hooksDir, filepath.Join(mountedAt, c.hooksDir))
			}
			if c.hooksDir == "" && !strings.Contains(out, "NRI") {
				t.Errorf("output %q does not say NRI was chosen", out)
			}
		})
	}

	// On NRI the daemon reaches the socket where the runtime serves it.
	daemon := pod.Containers[0]
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	reached := false
	for _, m := range daemon.VolumeMounts {
		v := volumes[m.Name]
		if v.HostPath != nil && v.HostPath.Path == filepath.Dir(nriplugin.DefaultSocket) && m.MountPath == v.HostPath.Path && !m.ReadOnly {
			reached = true
		}
	}
	if !reached || slices.Contains(daemon.Command, "--nri-socket") {
		t.Errorf("the daemon does not reach the runtime's NRI socket at %s (mounts %+v, command %q)", nriplugin.DefaultSocket, daemon.VolumeMounts, daemon.Command)
	}
	if pod.NodeSelector == nil {
		t.Error("no nodeSelector: the DaemonSet would run on nodes without GPUs")
	}
}
