package e2e

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/e2e/fakegpu"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

// Tests of issue 56: what a hostile tenant can make the root daemon do.
// Each runs the attack for real and asserts the harm does not happen.

// hostileFilesEnv makes the test binary a hostile tenant (hostileFiles):
// the value is a directory holding a character device node "dev" and a
// FIFO "fifo", then the simulated GPU's control node, comma-separated.
const hostileFilesEnv = "GPUARB_E2E_HOSTILE_FILES"

// hostileFiles names dir's device node and FIFO through crafted paths a
// probe once reported and the daemon opened after cleaning them lexically
// (relative ones through ../libcuda.so/.., absolute ones through
// libcuda.so.x/.., and one relative to an open directory), maps the device
// node executable, as a library, then issues an ioctl on the GPU's control
// node (a GPU process's first ioctl has its mappings scanned) and waits.
func hostileFiles(spec string) error {
	dir, ctl, ok := strings.Cut(spec, ",")
	if !ok {
		return fmt.Errorf("%s=%q: want DIR,CONTROL_NODE", hostileFilesEnv, spec)
	}
	if err := os.Chdir(dir); err != nil {
		return err
	}
	up := strings.Repeat("../", strings.Count(dir, "/")+2)
	dirfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	for _, name := range []string{"dev", "fifo"} {
		for _, p := range []string{up + "libcuda.so/.." + dir + "/" + name, dir + "/libcuda.so.x/../" + name} {
			if fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK, 0); err == nil { // fails: no libcuda.so there
				unix.Close(fd)
			}
		}
		if fd, err := unix.Openat(dirfd, "libcuda.so.1/../"+name, unix.O_RDONLY|unix.O_NONBLOCK, 0); err == nil {
			unix.Close(fd)
		}
	}
	dev, err := unix.Open(filepath.Join(dir, "dev"), unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	if _, err := unix.Mmap(dev, 0, 4096, unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE); err != nil {
		return fmt.Errorf("map the device node: %w", err)
	}
	nv, err := unix.Open(ctl, unix.O_RDWR, 0)
	if err != nil {
		return err
	}
	_, _ = unix.IoctlGetInt(nv, 0xC020462A) // RM_CONTROL-shaped: a GPU ioctl the probes see
	fmt.Println("ready")
	time.Sleep(time.Minute)
	return nil
}

// unprivilegedDir makes a directory an unprivileged process can use
// (under /tmp, mode 0777), removed at cleanup.
func unprivilegedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "gpuarb-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// copyTestBinary copies the test binary into dir, executable by anyone,
// for a helper run as another user.
func copyTestBinary(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "e2e.test")
	if err := os.WriteFile(exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return exe
}

// Issue 56, item 1: a process names a character device node and a FIFO
// through crafted relative and absolute paths with libcuda.so components
// and "..", and maps the device node executable before its first GPU
// ioctl: nothing the daemon does opens either (inotify watches them), and
// it still meters a hog. On 3197c47 the daemon opened the node the paths
// cleaned to, as root (a watchdog armed, a tape rewound).
func TestDaemonOpensNoFileATenantNames(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	dir := unprivilegedDir(t)
	dev, fifo := filepath.Join(dir, "dev"), filepath.Join(dir, "fifo")
	if err := unix.Mknod(dev, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))); err != nil { // as /dev/zero
		t.Fatal(err)
	}
	if err := unix.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	// A node of the simulated GPU's control device (1:7), for the
	// unprivileged attacker's GPU ioctl.
	ctl := filepath.Join(dir, "nvidiactl")
	if err := unix.Mknod(ctl, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dev, fifo, ctl} {
		if err := os.Chmod(p, 0o666); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	watches := map[int32]string{}
	for _, p := range []string{dev, fifo} {
		wd, err := unix.InotifyAddWatch(in, p, unix.IN_OPEN)
		if err != nil {
			t.Fatal(err)
		}
		watches[int32(wd)] = filepath.Base(p)
	}
	hogCg := testutil.NewCgroup(t, "hog")
	testutil.Start(t, hogCg, gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "20"))
	cmd := exec.Command(copyTestBinary(t, dir))
	cmd.Env = append(os.Environ(), hostileFilesEnv+"="+dir+","+ctl)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	attacker := testutil.Start(t, testutil.NewCgroup(t, "attacker"), cmd)
	if _, err := out.Read(make([]byte, 5)); err != nil {
		_, stderr := attacker.Output()
		t.Fatalf("the attacker: %v: %s", err, stderr)
	}
	time.Sleep(2 * time.Second) // a scan, and the polls of any record
	_, share, took := probesAndShare(t, d, hogCg)
	opens := map[string]int{}
	buf := make([]byte, 4096)
	n, _ := unix.Read(in, buf)
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		opens[watches[int32(binary.NativeEndian.Uint32(buf[off:]))]]++
		off += unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(buf[off+12:]))
	}
	t.Logf("opens: %v; hog's share %.1f%%, status in %v", opens, 100*share, took)
	// The attacker opens the node once itself, to map it.
	if opens["dev"] != 1 || opens["fifo"] != 0 {
		t.Errorf("the node opened %d times, the FIFO %d: want once (the tenant's own open) and never", opens["dev"], opens["fifo"])
	}
	if share < 0.9 {
		t.Errorf("the hog's metered share %.1f%% beside the attacker", 100*share)
	}
}

// simulatorImpostor listens on a Unix socket as the simulated GPU would
// and answers every scheduling control with success, doing nothing: what a
// tenant's own server beside its own node would do. It returns how many
// connections it took.
func simulatorImpostor(t *testing.T, sock string) func() int {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var mu sync.Mutex
	conns := 0
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns++
			mu.Unlock()
			go func() {
				defer c.Close()
				req := make([]byte, 64)
				for {
					if _, err := io.ReadFull(c, req); err != nil {
						return
					}
					params := make([]byte, binary.LittleEndian.Uint32(req[4:]))
					if _, err := io.ReadFull(c, params); err != nil {
						return
					}
					resp := make([]byte, 32)
					binary.LittleEndian.PutUint64(resp[8:], uint64(len(params)))
					if _, err := c.Write(append(resp, params...)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return conns
	}
}

// Issue 56, item 4: a tenant puts its own control node (with a server
// answering every control with success beside it) under the descriptor
// its RM client was allocated on. The daemon steers only through the very
// file the client was allocated on and only to the simulated GPU the
// operator named: the impostor is never dialled, the tenant is paced at
// the launch gate instead, and the two others stay steered — 25, 25 and
// 50% ± 3 pp at weights 100:100:200. On 3197c47 the daemon dialled the
// tenant's server, took its "success" for steering, and the tenant kept
// its unarbitrated third.
func TestSteeringTrustsNoFileATenantSwaps(t *testing.T) {
	measureTwice(t, func(t *testing.T, miss missFunc) {
		gpu := testutil.StartFakeGPU(t)
		cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "impostor"), "b": testutil.NewCgroup(t, "steered1"),
			"c": testutil.NewCgroup(t, "steered2")}
		d := startDaemon(t, gpu)
		dir := t.TempDir()
		node := filepath.Join(dir, "nvidiactl")
		if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 7))); err != nil {
			t.Fatal(err)
		}
		dialled := simulatorImpostor(t, filepath.Join(dir, "fakegpu.sock"))
		swapped := gpu.Workload(t, "hog", "--duration", "25")
		swapped.Env = append(swapped.Env, "GPUWORK_REOPEN_CTL="+node)
		testutil.Start(t, cgs["a"], swapped)
		testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--duration", "25"))
		testutil.Start(t, cgs["c"], gpu.Workload(t, "hog", "--duration", "25"))
		requireOnePacedBesideSteered(t, miss, gpu, d, cgs)
		if n := dialled(); n != 0 {
			t.Errorf("the tenant's own server took %d connections from the daemon", n)
		}
	})
}

// killDaemonAndGuardian SIGKILLs the daemon (started by the test) and its
// guardian (started by that daemon), the guardian first, so that nothing
// releases what the daemon held.
func killDaemonAndGuardian(t *testing.T, d runningDaemon) {
	t.Helper()
	st, err := d.Status(t.Context())
	if err != nil || st.Guardian == nil || st.Guardian.PID == 0 {
		t.Fatalf("guardian: %+v, %v", st.Guardian, err)
	}
	for _, p := range []int{st.Guardian.PID, d.Proc.Cmd.Process.Pid} {
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); !cgroup.Gone(st.Guardian.PID) || !d.Proc.Done(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("daemon or guardian not gone 5 s after SIGKILL")
		}
	}
}

// Issue 56, item 10: a daemon that died holding a tenant, its guardian
// dead too, and the policy file since broken: the next daemon resumes the
// tenant before anything else, starts on the last good policy (its copy
// of the file as last read) and says why in status. On 3197c47 it refused
// to start, and the tenant stayed stopped.
func TestStartResumesLeftoversDespiteABrokenPolicy(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	dir := t.TempDir()
	cg := testutil.NewCgroup(t, "held")
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte("tenants:\n  - {name: held, cgroup: "+cg.Rel+", limit: 0.1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemonIn(t, gpu, dir, "--gpu-scheduler", "off")
	hog := testutil.Start(t, cg, gpu.Workload(t, "hog", "--duration", "30")).Cmd.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); !cgroup.Stopped(hog); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the tenant was never held")
		}
	}
	killDaemonAndGuardian(t, d)
	if !cgroup.Stopped(hog) {
		t.Fatal("released with no daemon and no guardian: the test needs it held")
	}
	if err := os.WriteFile(file, []byte("tenants: [{name: held, limit: 300%}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	d = startDaemonIn(t, gpu, dir, "--gpu-scheduler", "off")
	took := time.Since(started)
	for cgroup.Stopped(hog) {
		if time.Since(started) > 5*time.Second {
			t.Fatal("the tenant is still stopped 5 s after the daemon's start")
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("the tenant running %v after the start (%v to the API)", time.Since(started), took)
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	pol, err := d.Policy(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.PolicyError == "" || !strings.Contains(string(pol), cg.Rel) {
		t.Errorf("status policy_error %q, policy in force:\n%s\nwant the file's error shown and the last good policy (limiting %s)",
			st.PolicyError, pol, cg.Rel)
	}
}

// Issue 56, item 10: ledgers that cannot be read (garbage in gated.json
// and steered.json) are set aside, named in the log, and the daemon
// starts. On 3197c47 they kept it from starting, for good.
func TestUnreadableLedgersAreSetAside(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	dir := t.TempDir()
	for _, name := range []string{"gated.json", "steered.json"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("{not json"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d := startDaemonIn(t, gpu, dir)
	if _, err := d.Status(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gated.json", "steered.json"} {
		if _, err := os.Stat(filepath.Join(dir, name+".bad")); err != nil {
			t.Errorf("%s not set aside: %v", name, err)
		}
	}
}

// Issue 56, item 10: a second daemon with its own socket but the same
// pinned maps is refused (exit status 3), and the first one's launch gate
// still holds its tenant. On 3197c47 it started, cleared the first one's
// gates and released the tenant.
func TestSecondDaemonOnThePinsIsRefused(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	cg := testutil.NewCgroup(t, "held")
	d := startDaemon(t, gpu, "--gpu-scheduler", "off")
	if err := d.ApplyPolicy(t.Context(), []byte("tenants:\n  - {name: held, cgroup: "+cg.Rel+", limit: 0.1}\n")); err != nil {
		t.Fatal(err)
	}
	hog := testutil.Start(t, cg, gpu.Workload(t, "hog", "--duration", "30")).Cmd.Process.Pid
	held := 0
	second := exec.Command(testutil.Bin(t, "gpuarb"), "daemon", "--socket", filepath.Join(t.TempDir(), "other.sock"), "--pin-path",
		d.PinPath, "--no-host-devices", "--device", "1:7=nvidia", "--guardian-cgroup=")
	out, err := second.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(string(out), "another gpuarb daemon") {
		t.Fatalf("a second daemon on the same pins: %v\n%s", err, out)
	}
	for i := 0; i < 200; i++ { // 2 s: the first one still paces the hog
		if cgroup.Stopped(hog) {
			held++
		}
		time.Sleep(10 * time.Millisecond)
	}
	if held < 100 {
		t.Errorf("the hog held %d of 200 samples beside the refused second daemon, want most (a 10%% limit)", held)
	}
}

// Issue 56, item 9: a daemon stopped while the simulated GPU does not
// answer cannot put a paused channel group back (the simulator makes no
// control its caller gave up on); its steering ledger keeps the group,
// and `gpuarb thaw --all` resumes it once the GPU answers. On 3197c47 the
// ledger was deleted anyway, and the group stayed paused.
func TestStopKeepsWhatItCouldNotPutBack(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	cg := testutil.NewCgroup(t, "paused")
	dir := t.TempDir()
	d := startDaemonIn(t, gpu, dir)
	if err := d.ApplyPolicy(t.Context(), []byte("tenants:\n  - {name: paused, cgroup: "+cg.Rel+", limit: 0.1}\n")); err != nil {
		t.Fatal(err)
	}
	hog := testutil.Start(t, cg, gpu.Workload(t, "hog", "--duration", "60")).Cmd.Process.Pid
	paused := func() int {
		st, err := fakegpu.ReadStats(gpu.Socket, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range st.GPUs[0].Contexts {
			if c.PID == hog && c.Alive {
				return c.Disabled
			}
		}
		return 0
	}
	for deadline := time.Now().Add(10 * time.Second); paused() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the group was never paused")
		}
	}
	gpuPID := gpu.Proc.Cmd.Process.Pid
	if err := syscall.Kill(gpuPID, syscall.SIGSTOP); err != nil { // started by this test
		t.Fatal(err)
	}
	d.Proc.Interrupt(30 * time.Second)
	ledger, err := os.ReadFile(filepath.Join(dir, "steered.json"))
	if err := syscall.Kill(gpuPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err != nil || !strings.Contains(string(ledger), fmt.Sprintf(`"PID":%d`, hog)) {
		t.Fatalf("the steering ledger after a stop that could not put the group back: %v %s", err, ledger)
	}
	out, err := exec.Command(testutil.Bin(t, "gpuarb"), "thaw", "--all", "--socket", d.Socket, "--pin-path", d.PinPath).CombinedOutput()
	if err != nil {
		t.Fatalf("thaw --all: %v\n%s", err, out)
	}
	if n := paused(); n != 0 {
		t.Errorf("%d channels still paused after thaw --all: %s", n, out)
	}
}

// Issue 56, item 10: a tenant whose thaw ledger entry cannot be written
// (its filesystem full, as a full /run) is not throttled meanwhile — nothing
// may be stopped that the guardian would not know — and is throttled once
// the entry can be written. On 3197c47 it was refused for good.
func TestFullStateDirDelaysGatingOnly(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	d := startDaemonIn(t, gpu, dir, "--gpu-scheduler", "off")
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 4096); ; {
		if _, err := f.Write(chunk); err != nil {
			break // full
		}
	}
	f.Close()
	cg := testutil.NewCgroup(t, "limited")
	if err := d.ApplyPolicy(t.Context(), []byte("tenants:\n  - {name: limited, cgroup: "+cg.Rel+", limit: 0.1}\n")); err != nil {
		t.Fatal(err)
	}
	hog := testutil.Start(t, cg, gpu.Workload(t, "hog", "--duration", "30")).Cmd.Process.Pid
	time.Sleep(2 * time.Second)
	if cgroup.Stopped(hog) {
		t.Fatal("held while its ledger entry could not be written")
	}
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if tn := tenantByName(st, "limited"); tn == nil || tn.GateErrors == 0 {
		t.Errorf("status does not show the failed ledger write: %+v", tn)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !cgroup.Stopped(hog); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("never held once its ledger entry could be written")
		}
	}
}

// Issue 56, item 3: tenants are keyed by what they select, never merged by
// name. Two cgroups no entry names whose last element is the same
// (ollama.service under two slices) are two tenants, and a workload that
// registers itself as "ollama.service" (as a pod's gpuarb.io/name does)
// is a third: limited to 10%, it alone is held there, and the two others
// share the rest. On 3197c47 all three were one tenant named
// "ollama.service", gated by the first cgroup's freezer: a victim held for
// the workload's usage.
func TestTenantsAreNeverMergedByName(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	x := testutil.Sub(t, testutil.NewCgroup(t, "x"), "ollama.service")
	y := testutil.Sub(t, testutil.NewCgroup(t, "y"), "ollama.service")
	z := testutil.NewCgroup(t, "workload")
	att := fmt.Sprintf(`{"name": "ollama.service", "cgroup": %q, "limit": 0.1}`, z.Rel)
	if _, err := d.Attach(t.Context(), "container-z", []byte(att)); err != nil {
		t.Fatal(err)
	}
	cgs := map[string]*testutil.Cgroup{"x": x, "y": y, "z": z}
	for _, cg := range cgs {
		testutil.Start(t, cg, gpu.Workload(t, "hog", "--duration", "20"))
	}
	ws := trueShares(t, gpu, cgs, 4*time.Second, 4)
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, tn := range st.Tenants {
		names[tn.Cgroup] = tn.Name
	}
	logStatus(t, d)
	if names[x.Rel] != x.Rel || names[y.Rel] != y.Rel || names[z.Rel] != "ollama.service" {
		t.Errorf("tenants by cgroup %v: want %s and %s named by their paths, %s named ollama.service", names, x.Rel, y.Rel, z.Rel)
	}
	for name, want := range map[string]float64{"x": 0.45, "y": 0.45, "z": 0.10} {
		got := col(ws, func(w map[string]float64) float64 { return w[name] })
		t.Logf("%s: %s for %.0f%%", name, pcts(got), 100*want)
		if e := math.Abs(median(got) - want); e > 0.03 {
			t.Errorf("%s took %.1f%% of the GPU, want %.0f%% ± 3 pp", name, 100*median(got), 100*want)
		}
	}
}

// Issue 56, item 5: with no admission rules in the policy, a workload's own
// request is bounded by the default: a hook-registered container asking
// for weight 10000 and latency priority with a 1 ms SLO gets weight 1000
// and priority normal, and the policy in force says the default applies.
// On 3197c47 it got what it asked for.
func TestDefaultAdmissionBoundsWorkloads(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	cg := testutil.NewCgroup(t, "asks")
	req := fmt.Sprintf(`{"name": "asks", "cgroup": %q, "weight": 10000, "priority": "latency", "slo": {"p99_sync_ms": 1}}`, cg.Rel)
	res, err := d.Attach(t.Context(), "container-asks", []byte(req))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := d.Policy(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("admission changed %q; policy in force:\n%s", res.Adjusted, pol)
	if !strings.Contains(string(pol), "name: asks") || !strings.Contains(string(pol), "weight: 1000\n") ||
		strings.Contains(string(pol), "priority: latency") || !strings.Contains(string(pol), "# admission: none given, so the default") {
		t.Errorf("want asks admitted at weight 1000 without latency, and the default admission said")
	}
	if len(res.Adjusted) != 2 {
		t.Errorf("the changes said to the workload: %q, want the weight and the priority", res.Adjusted)
	}
}

// Issue 56, item 14: containers that start and stop do not lift the
// gates of the tenants gpuarb found by itself, nor the operator's pause.
// A cgroup no entry names, held by the defaults to 25%, keeps to it while
// a workload attaches and detaches a tenant of another cgroup as fast as
// the API answers, in both actuator modes. After thaw --all a workload's
// attach leaves enforcement paused; the operator's resumes it. On 3197c47
// every attach and detach retired the default tenant (it ran ungated) and
// ended the pause.
func TestChurnKeepsDefaultTenantsGated(t *testing.T) {
	for _, mode := range []struct {
		name string
		args []string
	}{{"launch gate", []string{"--gpu-scheduler", "off"}}, {"steered", nil}} {
		t.Run(mode.name, func(t *testing.T) {
			measureTwice(t, func(t *testing.T, miss missFunc) { churnBeside(t, miss, mode.args) })
		})
	}
}

func churnBeside(t *testing.T, miss missFunc, daemonArgs []string) {
	gpu := testutil.StartFakeGPU(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte("defaults: {weight: 100, limit: 0.25}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemonIn(t, gpu, dir, daemonArgs...)
	found := testutil.NewCgroup(t, "found")
	churn := testutil.NewCgroup(t, "churn")
	testutil.Start(t, found, gpu.Workload(t, "hog", "--duration", "20"))

	stop := make(chan struct{})
	var rounds int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		body := fmt.Sprintf(`{"name": "churn", "cgroup": %q, "weight": 200}`, churn.Rel)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := d.Attach(t.Context(), "container churn", []byte(body)); err != nil {
				t.Error(err)
				return
			}
			if err := d.Detach(t.Context(), "container churn", "churn"); err != nil {
				t.Error(err)
				return
			}
			rounds++
		}
	}()
	ws := trueShares(t, gpu, map[string]*testutil.Cgroup{"found": found}, 3*time.Second, 4)
	close(stop)
	wg.Wait()
	got := col(ws, func(w map[string]float64) float64 { return w["found"] })
	t.Logf("the default tenant held to 25%%: %s while a workload attached and detached %d times (alone unarbitrated: 100%%)", pcts(got), rounds)
	if rounds < 20 {
		t.Errorf("only %d attach-detach rounds in 7 s", rounds)
	}
	if median(got) > 0.27 {
		miss("the default tenant took %.1f%% under churn, limit 25%%", 100*median(got))
	}

	// The operator's pause outlasts workloads' attaches.
	if err := d.ThawAll(t.Context()); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"name": "churn", "cgroup": %q}`, churn.Rel)
	if _, err := d.Attach(t.Context(), "container churn", []byte(body)); err != nil {
		t.Fatal(err)
	}
	if err := d.Detach(t.Context(), "container churn", "churn"); err != nil {
		t.Fatal(err)
	}
	if st, err := d.Status(t.Context()); err != nil || st.Enforcing {
		t.Errorf("a workload's attach and detach after thaw --all resumed enforcement (%v)", err)
	}
	if _, err := d.Attach(t.Context(), "", []byte(body)); err != nil {
		t.Fatal(err)
	}
	if st, err := d.Status(t.Context()); err != nil || !st.Enforcing {
		t.Errorf("the operator's attach after thaw --all left enforcement paused (%v)", err)
	}
}

// Issue 56, item 14: no client holds the daemon's API connections. One
// that idles after a request, and one that sends a request's body a byte
// at a time, are both cut off within the servers' bounds (10 s), and the
// API answers meanwhile. On 3197c47 both were held as long as the client
// wished.
func TestSlowClientsAreCutOff(t *testing.T) {
	d := startDaemon(t, testutil.StartFakeGPU(t))
	dial := func() net.Conn {
		c, err := net.Dial("unix", d.Socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	idle := dial()
	if _, err := io.WriteString(idle, "GET /v1/status HTTP/1.1\r\nHost: gpuarb\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	trickle := dial()
	if _, err := io.WriteString(trickle, "PUT /v1/policy HTTP/1.1\r\nHost: gpuarb\r\nContent-Length: 4096\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	closed := map[string]time.Duration{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // reads its answer, then waits for the server to close
		defer wg.Done()
		_ = idle.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, _ = io.Copy(io.Discard, idle)
		mu.Lock()
		closed["idle"] = time.Since(start)
		mu.Unlock()
	}()
	go func() { // one byte of the body every 200 ms until the server cuts it off
		defer wg.Done()
		for time.Since(start) < 20*time.Second {
			if _, err := trickle.Write([]byte("x")); err != nil {
				break
			}
			_ = trickle.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if _, err := trickle.Read(make([]byte, 512)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
		}
		mu.Lock()
		closed["trickle"] = time.Since(start)
		mu.Unlock()
	}()
	time.Sleep(2 * time.Second)
	if _, err := d.Status(t.Context()); err != nil {
		t.Errorf("status beside the slow clients: %v", err)
	}
	wg.Wait()
	t.Logf("the server cut off the idle client after %v, the trickling one after %v", closed["idle"].Round(time.Millisecond), closed["trickle"].Round(time.Millisecond))
	for who, after := range closed {
		if after > 12*time.Second {
			t.Errorf("the %s client was held %v (bound 10 s)", who, after.Round(time.Millisecond))
		}
	}
}

// The policy file is reloaded when its content changes, without a signal:
// updated as a Kubernetes ConfigMap volume updates it (a new directory of
// files, the ..data link swapped atomically), the new policy is in force
// within 3 s; a bad one is refused there, the last good policy kept and
// the error shown in status.
func TestPolicyFileChangesApplyWithoutASignal(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	dir := t.TempDir()
	vol := filepath.Join(dir, "configmap")
	update := func(version, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(vol, version), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(vol, version, "gpuarb.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(vol, "..data_tmp")
		if err := os.Symlink(version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(vol, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	update("v1", "tenants:\n  - {name: web, cgroup: /gpuarb-test-none/web, weight: 100}\n")
	if err := os.Symlink("..data/gpuarb.yaml", filepath.Join(vol, "gpuarb.yaml")); err != nil {
		t.Fatal(err)
	}
	d := startDaemonIn(t, gpu, dir, "--policy", filepath.Join(vol, "gpuarb.yaml"))
	waitPolicy := func(want string) time.Duration {
		t.Helper()
		began := time.Now()
		for {
			pol, err := d.Policy(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(pol), want) {
				return time.Since(began)
			}
			if time.Since(began) > 3*time.Second {
				t.Fatalf("policy in force 3 s after the file changed:\n%s\nwant %q in it", pol, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitPolicy("weight: 100")
	update("v2", "tenants:\n  - {name: web, cgroup: /gpuarb-test-none/web, weight: 300}\n")
	t.Logf("a ConfigMap update in force after %v", waitPolicy("weight: 300").Round(time.Millisecond))

	update("v3", "tenants:\n  - {name: web, weight: banana}\n")
	for began := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if st.PolicyError != "" {
			break
		}
		if time.Since(began) > 3*time.Second {
			t.Fatal("a bad policy file is not reported in status 3 s after it changed")
		}
	}
	waitPolicy("weight: 300")
}
