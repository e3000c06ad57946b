package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

func runApp(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := newApp()
	app.Writer = &out
	app.ErrWriter = &out
	err := app.Run(append([]string{"gpuarb"}, args...))
	return out.String(), err
}

func TestHelpOnEveryCommand(t *testing.T) {
	app := newApp()
	for _, c := range app.Commands {
		out, err := runApp(t, c.Name, "--help")
		if err != nil || !strings.Contains(out, "gpuarb "+c.Name) || !strings.Contains(out, c.Usage) {
			t.Errorf("%s --help: %v\n%s", c.Name, err, out)
		}
	}
	out, err := runApp(t, "--help")
	if err != nil || !strings.Contains(out, "trace") || !strings.Contains(out, "doctor") {
		t.Errorf("--help: %v\n%s", err, out)
	}
}

func TestVersion(t *testing.T) {
	out, err := runApp(t, "version")
	if err != nil || out != "gpuarb "+version+"\n" {
		t.Errorf("version: %q %v", out, err)
	}
}

// The daemon refuses a bad mode before it starts anything, naming the
// ones there are.
func TestDaemonRejectsBadModes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the daemon checks for root first")
	}
	for _, tc := range []struct{ flag, want string }{
		{"--gpu-scheduler", "want auto or off"},
		{"--latency-holds", "want one of evict, deschedule, off"},
	} {
		_, err := runApp(t, "daemon", "--socket", t.TempDir()+"/s", tc.flag, "nope")
		if err == nil || !strings.Contains(err.Error(), tc.flag) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("daemon %s nope: %v, want an error naming the flag and %q", tc.flag, err, tc.want)
		}
	}
}

func TestTraceRejectsBadDevice(t *testing.T) {
	for _, arg := range []string{"1:7", "1:7=amd", "x:1=drm"} {
		_, err := runApp(t, "trace", "--device", arg)
		if err == nil || !strings.Contains(err.Error(), "--device") {
			t.Errorf("--device %s: %v", arg, err)
		}
	}
}

func TestMapsWithNothingPinned(t *testing.T) {
	out, err := runApp(t, "maps", "--pin-path", t.TempDir())
	if err != nil || !strings.Contains(out, "nothing is pinned") || !strings.Contains(out, "gpuarb_cgroups") {
		t.Errorf("maps: %v\n%s", err, out)
	}
}

func TestDoctor(t *testing.T) {
	testutil.Privileged(t)
	out, err := runApp(t, "doctor", "--json")
	if err != nil {
		t.Fatalf("doctor: %v\n%s", err, out)
	}
	var rep doctorReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	ok := map[string]bool{}
	for _, f := range rep.Features {
		ok[f.Name] = f.OK
	}
	if !rep.Root || !rep.BPFFS || !rep.Tracefs || !ok["btf"] || !ok["ringbuf"] || !ok["tracepoints"] || !ok["uprobes"] {
		t.Errorf("doctor on this host: %+v", rep)
	}
	if rep.Cgroup.UnifiedMount == "" || !rep.Cgroup.Freeze {
		t.Errorf("cgroup: %+v", rep.Cgroup)
	}
	text, err := runApp(t, "doctor")
	if err != nil || !strings.Contains(text, "verdict      gpuarb can run here") {
		t.Errorf("doctor: %v\n%s", err, text)
	}
}

// TestTraceJSON runs the real binary against the simulated GPU and checks
// the JSON lines a workload in a test cgroup produces.
func TestTraceJSON(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	cg := testutil.NewCgroup(t, "trace")
	// A daemon killed earlier may have left its pins there: trace must add
	// none, whatever the host had.
	pinsBefore := pinNames(t)
	trace := exec.Command(testutil.Bin(t, "gpuarb"), "trace", "--json", "--duration", "4s", "--no-host-devices",
		"--device", "1:7=nvidia", "--libcuda", testutil.Bin(t, "libcuda.so.1"))
	tp := testutil.Start(t, nil, trace)
	waitFor(t, func() bool { return strings.Contains(tp.Stderr.String(), "tracing") }, 10*time.Second, "trace start")

	hog := testutil.Start(t, cg, gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "1"))
	if err := hog.Wait(t, 20*time.Second); err != nil {
		t.Fatalf("hog: %v %s", err, hog.Stderr)
	}
	if err := tp.Wait(t, 20*time.Second); err != nil {
		t.Fatalf("trace: %v\n%s", err, tp.Stderr)
	}
	pid := float64(hog.Cmd.Process.Pid)
	seen := map[string]int{}
	sc := bufio.NewScanner(tp.Stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not JSON: %q", sc.Text())
		}
		if m["pid"] != pid {
			continue
		}
		typ, _ := m["type"].(string)
		seen[typ]++
		if m["comm"] != "gpuwork" || m["cgroup_id"] != float64(cg.ID) || m["cgroup"] != cg.Rel {
			t.Errorf("%s: comm %v cgroup %v %v, want gpuwork %d %s", typ, m["comm"], m["cgroup_id"], m["cgroup"], cg.ID, cg.Rel)
		}
		switch typ {
		case "tsg_alloc":
			if m["class"] != float64(0xA06C) || m["device"] != "1:7" {
				t.Errorf("tsg_alloc: %v", m)
			}
		case "channel_alloc":
			if m["class"] != float64(0xC86F) {
				t.Errorf("channel_alloc: %v", m)
			}
		case "work_submit_token", "rm_control":
			if m["ctrl_cmd"] == nil {
				t.Errorf("%s without ctrl_cmd: %v", typ, m)
			}
		case "launch":
			g, _ := m["grid"].([]any)
			if m["func"] != "cuLaunchKernel" || len(g) != 3 || g[0] != float64(2000) {
				t.Errorf("launch: %v", m)
			}
		case "sync":
			if m["func"] == nil || m["duration_ns"] == nil {
				t.Errorf("sync: %v", m)
			}
		}
	}
	for _, typ := range []string{"tsg_alloc", "channel_alloc", "work_submit_token", "launch", "sync", "ctx_create", "process_exit"} {
		if seen[typ] == 0 {
			t.Errorf("no %s event for the workload; saw %v", typ, seen)
		}
	}
	if seen["launch"] < 300 {
		t.Errorf("%d launches traced, want ≥ 300 of a 1 s hog of 2 ms kernels", seen["launch"])
	}
	if !strings.Contains(tp.Stderr.String(), " 0 lost") {
		t.Errorf("trace summary: %s", tp.Stderr)
	}
	if after := pinNames(t); after != pinsBefore {
		t.Errorf("trace changed the pins at %s: %q before, %q after", bpf.DefaultPinPath, pinsBefore, after)
	}
}

// pinNames lists what is pinned at the default pin path.
func pinNames(t *testing.T) string {
	entries, err := os.ReadDir(bpf.DefaultPinPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}

func TestTraceStopsOnSIGINT(t *testing.T) {
	testutil.Privileged(t)
	trace := exec.Command(testutil.Bin(t, "gpuarb"), "trace", "--no-host-devices", "--device", "1:7=nvidia")
	tp := testutil.Start(t, nil, trace)
	waitFor(t, func() bool { return strings.Contains(tp.Stderr.String(), "tracing") }, 10*time.Second, "trace start")
	trace.Process.Signal(syscall.SIGINT)
	if err := tp.Wait(t, 5*time.Second); err != nil {
		t.Fatalf("trace after SIGINT: %v\n%s", err, tp.Stderr)
	}
	if !strings.Contains(tp.Stderr.String(), "events") {
		t.Errorf("no summary: %s", tp.Stderr)
	}
}

func waitFor(t *testing.T, cond func() bool, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDoctorLibcuda(t *testing.T) {
	out, err := runApp(t, "doctor", "--libcuda", testutil.Bin(t, "libcuda.so.1"))
	if err != nil {
		t.Fatalf("doctor --libcuda: %v\n%s", err, out)
	}
	for _, want := range []string{"cuLaunchKernel_ptsz", "cuCtxSynchronize_v2", "cuEventQuery", "127 cu* entry points exported, 73 probed"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor --libcuda lacks %q:\n%s", want, out)
		}
	}
	out, err = runApp(t, "doctor", "--libcuda", testutil.Bin(t, "libcuda.so.1"), "--json")
	var exports []bpf.LibcudaExport
	if err != nil || json.Unmarshal([]byte(out), &exports) != nil || len(exports) != 127 {
		t.Errorf("doctor --libcuda --json: %v, %d exports\n%s", err, len(exports), out)
	}
	if _, err := runApp(t, "doctor", "--libcuda", "/bin/sh"); err == nil || !strings.Contains(err.Error(), "not a libcuda") {
		t.Errorf("doctor --libcuda /bin/sh: %v", err)
	}
}

// What a tenant names reaches the operator's terminal escaped: an escape
// sequence in a cgroup or process name must not act on it, and truncation
// never cuts a character in two.
func TestNamesAreShownEscaped(t *testing.T) {
	for in, want := range map[string]string{
		"train-a":                  "train-a",
		"evil\x1b]0;pwned\x07name": `evil\x1b]0;pwned\aname`,
		"/gpu/\x1b[2Jclear":        `/gpu/\x1b[2Jclear`,
		"bad\xffutf8":              `bad\xffutf8`,
		"rtl\u202eoverride":        `rtl\u202eoverride`,
		"名前":                       "名前",
	} {
		if got := shown(in); got != want {
			t.Errorf("shown(%q) = %q, want %q", in, got, want)
		}
	}
	if got := truncate("/a/名前名前名前", 5); got != "…名前名前" || !utf8.ValidString(got) {
		t.Errorf("truncate = %q, want …名前名前", got)
	}
	var b strings.Builder
	if err := printTable(&b, api.Status{WindowNS: 1e9, Enforcing: true, Tenants: []api.Tenant{{Name: "x\x1b[31m", Cgroup: "/c\x1b[2J"}}}, "share"); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsRune(b.String(), 0x1b) {
		t.Errorf("the table carries an escape:\n%q", b.String())
	}
}

// A tenant whose freezes or pauses fail says so under the table, with the
// last error; one with processes gpuarb cannot probe names them.
func TestStatusShowsGateErrors(t *testing.T) {
	var b strings.Builder
	st := api.Status{WindowNS: 1e9, Enforcing: true, Tenants: []api.Tenant{
		{Name: "ok", Cgroup: "/ok"},
		{Name: "stuck", Cgroup: "/stuck", GateErrors: 3, LastGateError: "freeze /sys/fs/cgroup/stuck: freeze not confirmed within 100ms"},
		{Name: "own-driver", Cgroup: "/own", UnprobedPIDs: []int{4242}, Actuator: "freeze (launches unseen)"},
	}}
	if err := printTable(&b, st, "share"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "(stuck: 3 failed freeze, thaw or pause operations; last: freeze /sys/fs/cgroup/stuck: freeze not confirmed within 100ms)") ||
		!strings.Contains(out, "(own-driver: pids [4242] use the GPU through a driver gpuarb does not probe: metered as busy whenever they may run, held by freeze (launches unseen))") ||
		strings.Contains(out, "(ok:") {
		t.Errorf("status table:\n%s", out)
	}
}

// Containers of pods that use a GPU unregistered are named under the
// table, with what the NRI plugin's state says of why.
func TestStatusShowsUnregisteredPods(t *testing.T) {
	pod := api.Tenant{Name: "/kubepods/pod1/abc", Label: "abc", Cgroup: "/kubepods/pod1/abc", Unregistered: true}
	for _, c := range []struct {
		nri  *api.NRIStatus
		want string
	}{
		{nil, "runs without its NRI plugin"},
		{&api.NRIStatus{Socket: "/var/run/nri/nri.sock", LastError: "dial unix: no such file"}, "not connected to /var/run/nri/nri.sock: dial unix: no such file"},
		{&api.NRIStatus{Socket: "/s", Since: time.Unix(1, 0), LastError: "the runtime closed the connection"}, "(NRI: the runtime's connection at /s is lost (the runtime closed the connection); new pods are not registered until it is back)"},
		{&api.NRIStatus{Socket: "/s", Connected: true, Runtime: "containerd", RuntimeVersion: "v2.1.9"}, "connected to containerd v2.1.9, and registering these failed"},
	} {
		var b strings.Builder
		st := api.Status{WindowNS: 1e9, Enforcing: true, NRI: c.nri, Tenants: []api.Tenant{{Name: "web", Cgroup: "/kubepods/pod2/def"}, pod}}
		if err := printTable(&b, st, "share"); err != nil {
			t.Fatal(err)
		}
		if out := b.String(); !strings.Contains(out, "gpuarb.io/* annotations not applied: abc;") || !strings.Contains(out, c.want) || strings.Contains(out, "def;") {
			t.Errorf("status table with NRI %+v:\n%s", c.nri, out)
		}
	}
}

// hooks install --runtime containerd edits a base spec made the usual way
// (its RLIMIT_NOFILE 1024 would reach every pod): the hooks in, the
// rlimits out, every other field kept, and the config.toml lines left to
// add printed with the file's path.
func TestHooksInstallContainerdBaseSpec(t *testing.T) {
	base := filepath.Join(t.TempDir(), "base.json")
	spec := `{"ociVersion":"1.1.0","process":{"args":["sh"],"rlimits":[{"type":"RLIMIT_NOFILE","hard":1024,"soft":1024}],"noNewPrivileges":true},"root":{"path":"rootfs"},"x-unknown":{"kept":true}}`
	if err := os.WriteFile(base, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runApp(t, "hooks", "install", "--runtime", "containerd", "--base", base, "--binary", "/opt/gpuarb/bin/gpuarb")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	data, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Process map[string]any `json:"process"`
		Hooks   struct {
			Prestart, Poststop []struct{ Path string }
		} `json:"hooks"`
		Unknown map[string]any `json:"x-unknown"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Process["rlimits"]; ok || got.Process["noNewPrivileges"] != true || got.Unknown["kept"] != true ||
		len(got.Hooks.Prestart) != 1 || got.Hooks.Prestart[0].Path != "/opt/gpuarb/bin/gpuarb" || len(got.Hooks.Poststop) != 1 {
		t.Errorf("base spec after install:\n%s", data)
	}
	for _, want := range []string{`dropped process.rlimits [{"type":"RLIMIT_NOFILE","hard":1024,"soft":1024}]`,
		`base_runtime_spec = "` + base + `"`, `pod_annotations = ["gpuarb.io/*"]`, "every runtime handler", "NRI"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestDoctorSaysWhatTheDaemonsNRIPluginDoes(t *testing.T) {
	since := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		n    *api.NRIStatus
		want string
	}{
		{nil, "off (--nri-socket empty)"},
		{&api.NRIStatus{Socket: "/var/run/nri/nri.sock"}, "not connected to /var/run/nri/nri.sock: no runtime answered yet"},
		{&api.NRIStatus{Socket: "/s", Connected: true, Runtime: "containerd", RuntimeVersion: "v2.1.9", Since: since, Registered: 7},
			"connected to containerd v2.1.9 at /s since 2026-12-02T12:00:00Z, 7 containers registered"},
	} {
		if got := daemonNRIReport(c.n); !strings.Contains(got, c.want) {
			t.Errorf("daemonNRIReport(%+v) = %q, want %q in it", c.n, got, c.want)
		}
	}
}
