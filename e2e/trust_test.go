package e2e

import (
	"encoding/binary"
	"fmt"
	"io"
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
