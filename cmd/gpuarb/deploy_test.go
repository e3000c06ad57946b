package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"
	"github.com/urfave/cli/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpuarb/gpuarb/api"
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

func TestKubernetesManifest(t *testing.T) {
	data, err := os.ReadFile("../../deploy/kubernetes/gpuarb.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	configMaps := map[string]*corev1.ConfigMap{}
	var namespaces []string
	var netpols []*networkingv1.NetworkPolicy
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
			namespaces = append(namespaces, o.Name)
		case *corev1.ConfigMap:
			configMaps[o.Name] = o
		case *appsv1.DaemonSet:
			ds = o
		case *networkingv1.NetworkPolicy:
			netpols = append(netpols, o)
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet")
	}
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
