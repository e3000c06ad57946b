package ocihook

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/policy"
)

func TestSpecCgroupPath(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"", "/abc", ""},
		{"/kubepods/pod1/ctr", "/kubepods/pod1/ctr", ""},
		{"/kubepods//pod1/../pod2/", "/kubepods/pod2", ""},
		{"machine/ctr", "/machine/ctr", ""},
		{"system.slice:runc:abc", "/system.slice/runc-abc.scope", ""},
		{":crio:abc", "/system.slice/crio-abc.scope", ""},
		{"kubepods-besteffort-pod12.slice:cri-containerd:abc", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12.slice/cri-containerd-abc.scope", ""},
		{"-.slice::abc", "/abc.scope", ""},
		{"machine.slice:libpod:abc", "/machine.slice/libpod-abc.scope", ""},
		{"user.slice:p:sub.slice", "/user.slice/sub.slice", ""},
		{"notaslice:runc:abc", "", "not a valid systemd slice"},
		{"a--b.slice:runc:abc", "", "not a valid systemd slice"},
		{"system.slice:runc:", "", "slice:prefix:name"},
		{"a:b", "", "neither a path nor"},
	} {
		got, err := SpecCgroupPath(tc.in, "abc")
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %q %v, want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestContainerCgroup(t *testing.T) {
	root := t.TempDir()
	write := func(pid int, body string) {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(10, "0::/kubepods/pod1/ctr\n")                                             // v2
	write(11, "12:freezer:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n") // hybrid
	write(12, "12:freezer:/legacy/abc\n1:name=systemd:/legacy/abc\n")                // v1 only
	write(13, "4:cpu:/x\n")
	for pid, want := range map[int]string{10: "/kubepods/pod1/ctr", 11: "/docker/abc", 12: "/legacy/abc"} {
		if got, err := cgroup.GatePath(root, pid); err != nil || got != want {
			t.Errorf("pid %d: %q %v, want %q", pid, got, err, want)
		}
	}
	if _, err := cgroup.GatePath(root, 13); err == nil {
		t.Error("a process with neither v2 nor freezer cgroup resolved")
	}
	// The kernel's answer wins over the spec, with a warning.
	cg, warn, err := ContainerCgroup("/elsewhere", "abc", 10, root)
	if err != nil || cg != "/kubepods/pod1/ctr" || !strings.Contains(warn, "/elsewhere") {
		t.Errorf("disagreement: %q %q %v", cg, warn, err)
	}
	cg, warn, err = ContainerCgroup("/kubepods/pod1/ctr", "abc", 10, root)
	if err != nil || cg != "/kubepods/pod1/ctr" || warn != "" {
		t.Errorf("agreement: %q %q %v", cg, warn, err)
	}
	// Without a pid (poststop) the spec decides.
	cg, _, err = ContainerCgroup("system.slice:runc:abc", "abc", 0, root)
	if err != nil || cg != "/system.slice/runc-abc.scope" {
		t.Errorf("no pid: %q %v", cg, err)
	}
}

func TestRulesFromAnnotations(t *testing.T) {
	for _, tc := range []struct {
		a    map[string]string
		want policy.Rules
		err  string // the annotation the error must name
	}{
		{nil, policy.Rules{}, ""},
		{map[string]string{"io.kubernetes.pod.name": "x"}, policy.Rules{}, ""},
		{map[string]string{AnnotationWeight: "300", AnnotationLimit: "30%", AnnotationPriority: "batch"},
			policy.Rules{Weight: 300, Limit: 0.3, Priority: policy.Batch}, ""},
		{map[string]string{AnnotationSLOP99MS: "20"}, policy.Rules{Priority: policy.Latency, SLO: policy.SLO{P99SyncMS: 20}}, ""},
		{map[string]string{AnnotationSLOFPS: "60", AnnotationPriority: "latency"}, policy.Rules{Priority: policy.Latency, SLO: policy.SLO{FPS: 60}}, ""},
		{map[string]string{AnnotationWeight: "0"}, policy.Rules{}, AnnotationWeight},
		{map[string]string{AnnotationWeight: "10001"}, policy.Rules{}, AnnotationWeight},
		{map[string]string{AnnotationWeight: "heavy"}, policy.Rules{}, AnnotationWeight},
		{map[string]string{AnnotationLimit: "150%"}, policy.Rules{}, AnnotationLimit},
		{map[string]string{AnnotationLimit: "0"}, policy.Rules{}, AnnotationLimit},
		{map[string]string{AnnotationPriority: "urgent"}, policy.Rules{}, AnnotationPriority},
		{map[string]string{AnnotationSLOFPS: "NaN"}, policy.Rules{}, AnnotationSLOFPS},
		{map[string]string{AnnotationMemLimit: "512Mi"}, policy.Rules{MemoryLimit: policy.MemoryLimit{Bytes: 512 << 20}}, ""},
		{map[string]string{AnnotationMemLimit: "50%"}, policy.Rules{MemoryLimit: policy.MemoryLimit{Share: 0.5}}, ""},
		{map[string]string{AnnotationMemLimit: "150%"}, policy.Rules{}, AnnotationMemLimit},
		{map[string]string{AnnotationLimit: "NaN%"}, policy.Rules{}, AnnotationLimit},
		{map[string]string{AnnotationName: "a\x1b[2Jb"}, policy.Rules{}, AnnotationName},
		{map[string]string{AnnotationSLOP99MS: "-1"}, policy.Rules{}, AnnotationSLOP99MS},
		{map[string]string{AnnotationSLOFPS: "60", AnnotationSLOP99MS: "5"}, policy.Rules{}, AnnotationSLOFPS},
		{map[string]string{AnnotationSLOFPS: "60", AnnotationPriority: "batch"}, policy.Rules{}, AnnotationPriority},
		{map[string]string{"gpuarb.io/wieght": "3"}, policy.Rules{}, "gpuarb.io/wieght"},
		{map[string]string{AnnotationName: "a/b"}, policy.Rules{}, AnnotationName},
	} {
		got, err := RulesFromAnnotations(tc.a)
		if tc.err != "" {
			var ae *AnnotationError
			if !errors.As(err, &ae) || ae.Key != tc.err || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err %v, want one naming %s", tc.a, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: %+v %v, want %+v", tc.a, got, err, tc.want)
		}
		// What the hook accepts, the daemon's validation accepts.
		tn := policy.Tenant{Name: "x", Selector: policy.Selector{Cgroup: "/x"}, Rules: got}
		cfg := policy.Default()
		if _, err := cfg.With(tn); err != nil {
			t.Errorf("%v: daemon would refuse %+v: %v", tc.a, got, err)
		}
	}
}

func TestReadState(t *testing.T) {
	good := `{"ociVersion":"1.0.2","id":"c1","status":"created","pid":42,"bundle":"/run/b"}`
	st, err := ReadState(strings.NewReader(good))
	if err != nil || st.ID != "c1" || st.Pid != 42 || st.Bundle != "/run/b" {
		t.Fatalf("%+v %v", st, err)
	}
	for _, bad := range []string{"", "not json", `{"id":"c1"}`, `{"id":"","bundle":"/b"}`,
		`{"id":"c1","bundle":"rel/b"}`, `{"id":"c1","bundle":"/b","pid":-3}`, strings.Repeat(" ", maxState+1)} {
		if _, err := ReadState(strings.NewReader(bad)); !errors.Is(err, ErrBadState) {
			t.Errorf("%.40q: %v, want ErrBadState", bad, err)
		}
	}
}

func FuzzReadState(f *testing.F) {
	f.Add([]byte(`{"ociVersion":"1.0.2","id":"c1","status":"created","pid":42,"bundle":"/run/b"}`))
	f.Add([]byte(`{"id":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ReadState(strings.NewReader(string(b)))
		if err == nil && (st.ID == "" || !filepath.IsAbs(st.Bundle) || st.Pid < 0) {
			t.Fatalf("accepted %+v", st)
		}
		if err != nil && !errors.Is(err, ErrBadState) {
			t.Fatalf("error not ErrBadState: %v", err)
		}
	})
}

// bundle writes a bundle with config.json and returns the state document.
func bundle(t *testing.T, cgroupsPath string, annotations map[string]string, pid int) string {
	t.Helper()
	dir := t.TempDir()
	cfg := map[string]any{"ociVersion": "1.0.2", "annotations": annotations, "linux": map[string]any{"cgroupsPath": cgroupsPath}}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	st, _ := json.Marshal(specs.State{Version: "1.0.2", ID: "ctr1", Status: "created", Pid: pid, Bundle: dir})
	return string(st)
}

func TestRunDaemonDown(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	state := bundle(t, "/gpuarb-test/ctr1", map[string]string{AnnotationWeight: "300"}, 0)
	act, err := Run(t.Context(), Prestart, strings.NewReader(state), Options{Socket: sock})
	if err != nil || len(act.Warnings) != 1 || !strings.Contains(act.Warnings[0], "fail-open") || !strings.Contains(act.Warnings[0], "spooled") {
		t.Errorf("fail-open: %+v %v", act, err)
	}
	spooled := func() []string {
		files, _ := filepath.Glob(filepath.Join(api.SpoolBeside(sock), "*.json"))
		return files
	}
	if len(spooled()) != 1 {
		t.Errorf("spooled %v, want the container's registration", spooled())
	}
	if _, err := Run(t.Context(), Poststop, strings.NewReader(state), Options{Socket: sock}); err != nil {
		t.Errorf("poststop fail-open: %v", err) // a warning, never a failure when open
	}
	if len(spooled()) != 0 {
		t.Errorf("spooled %v after the container's poststop", spooled())
	}
	// Fail-closed: the container does not run, so nothing is spooled.
	if _, err := Run(t.Context(), Prestart, strings.NewReader(state), Options{Socket: sock, FailClosed: true}); err == nil ||
		!strings.Contains(err.Error(), "not running") {
		t.Errorf("fail-closed: %v", err)
	}
	if len(spooled()) != 0 {
		t.Errorf("spooled %v for a container refused", spooled())
	}
}

// A daemon that accepts and never answers: the hook gives up within its
// timeout.
func TestRunDaemonHangs(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "slow.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	state := bundle(t, "/gpuarb-test/ctr1", nil, 0)
	start := time.Now()
	act, err := Run(context.Background(), Prestart, strings.NewReader(state), Options{Socket: sock, Timeout: 300 * time.Millisecond})
	took := time.Since(start)
	if err != nil || len(act.Warnings) != 1 || !strings.Contains(act.Warnings[0], "did not answer within 300ms") {
		t.Errorf("%+v %v", act, err)
	}
	if took > time.Second {
		t.Errorf("hook took %v with a hung daemon", took)
	}
	_, err = Run(context.Background(), Prestart, strings.NewReader(state), Options{Socket: sock, Timeout: 300 * time.Millisecond, FailClosed: true})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("fail-closed with a hung daemon: %v", err)
	}
}

func TestRunBadInput(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	if _, err := Run(t.Context(), Prestart, strings.NewReader("{"), Options{Socket: sock}); !errors.Is(err, ErrBadState) {
		t.Errorf("malformed state: %v", err)
	}
	state := bundle(t, "/x", map[string]string{AnnotationLimit: "2"}, 0)
	_, err := Run(t.Context(), Prestart, strings.NewReader(state), Options{Socket: sock})
	if err == nil || !strings.Contains(err.Error(), AnnotationLimit) {
		t.Errorf("bad annotation: %v", err)
	}
	act, err := Run(t.Context(), Prestart, strings.NewReader(state), Options{Socket: sock, DefaultOnBadPolicy: true})
	if err != nil || len(act.Warnings) != 2 || !strings.Contains(act.Warnings[0], "default policy") {
		t.Errorf("default on bad policy: %+v %v", act, err)
	}
	missing := `{"ociVersion":"1.0.2","id":"c","status":"created","pid":1,"bundle":"/nonexistent/bundle"}`
	if _, err := Run(t.Context(), Prestart, strings.NewReader(missing), Options{Socket: sock}); err == nil ||
		!strings.Contains(err.Error(), "config.json") {
		t.Errorf("missing bundle: %v", err)
	}
}

// Annotations are the pod author's bytes: RulesFromAnnotations never
// panics, and what it accepts is a valid tenant once the defaults fill it.
func FuzzRulesFromAnnotations(f *testing.F) {
	f.Add("weight", "300", "name", "a")
	f.Add("priority", "latency", "slo-p99-ms", "20")
	f.Add("limit", "30%", "slo-fps", "NaN")
	f.Add("name", "a\u202eb", "weight", "1e9")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		a := map[string]string{annotationKeyPrefix + k1: v1, annotationKeyPrefix + k2: v2}
		r, err := RulesFromAnnotations(a)
		if err != nil {
			var ae *AnnotationError
			if !errors.As(err, &ae) {
				t.Fatalf("error %v names no annotation", err)
			}
			return
		}
		tn := policy.Tenant{Name: TenantName("ctr1", a), Selector: policy.Selector{Cgroup: "/c"}, Rules: r}
		if _, err := policy.Default().With(tn); err != nil {
			t.Fatalf("accepted %v as %+v, which the daemon refuses: %v", a, tn, err)
		}
	})
}
