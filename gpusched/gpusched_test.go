package gpusched

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/e2e/fakegpu"
	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/ioctlspy"
	"github.com/gpuarb/gpuarb/nvrm"
)

// groupOf names process pid's channel group on the simulated GPU from its
// ground truth and the control file the process holds open.
func groupOf(t *testing.T, gpu *testutil.FakeGPU, pid int) Group {
	t.Helper()
	st, err := fakegpu.ReadStats(gpu.Socket, false)
	if err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(filepath.Dir(gpu.Socket), fakegpu.NvidiaCtlNode)
	fd := int32(-1)
	entries, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, e := range entries {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); err == nil && target == node {
			fmt.Sscan(e.Name(), &fd)
		}
	}
	var file unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), &file); err != nil {
		t.Fatal(err)
	}
	for _, c := range st.GPUs[0].Contexts {
		if c.PID == pid && c.Alive && fd >= 0 {
			return Group{PID: uint32(pid), FD: fd, File: ioctlspy.FileID{Dev: file.Dev, Ino: file.Ino}, Client: c.Client, TSG: c.TSG,
				Subdevice: c.Subdevice, Channels: c.Channels, Engine: 1}
		}
	}
	t.Fatalf("no channel group of pid %d (control fd %d) in %+v", pid, fd, st.GPUs[0].Contexts)
	return Group{}
}

// busyOver resets the ground truth, waits d and returns each pid's busy
// share of the window.
func busyOver(t *testing.T, gpu *testutil.FakeGPU, d time.Duration, pids ...int) []float64 {
	t.Helper()
	if _, err := fakegpu.ReadStats(gpu.Socket, true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(d)
	st, err := fakegpu.ReadStats(gpu.Socket, false)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(pids))
	for i, pid := range pids {
		for _, c := range st.GPUs[0].Contexts {
			if c.PID == pid {
				out[i] += float64(c.BusyNS) / float64(st.ElapsedNS)
			}
		}
	}
	return out
}

func twoHogs(t *testing.T, gpu *testutil.FakeGPU, args ...string) (a, b int) {
	t.Helper()
	hog := append([]string{"hog", "--kernel-ms", "5", "--duration", "20"}, args...)
	a = testutil.Start(t, nil, gpu.Workload(t, hog...)).Cmd.Process.Pid
	b = testutil.Start(t, nil, gpu.Workload(t, hog...)).Cmd.Process.Pid
	time.Sleep(300 * time.Millisecond)
	return a, b
}

func TestAvailable(t *testing.T) {
	testutil.Privileged(t)
	if err := Available(); err != nil {
		t.Fatalf("root on a Linux 6 host without Yama 3: %v", err)
	}
}

// Timeslices are the hardware's proportional share: 16:1 slices give the
// first hog 16/17 of the GPU once the runlist restarts (third parties
// measured 14:1 on an A100).
func TestTimeslicesSteerShares(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	pa, pb := twoHogs(t, gpu)
	a, b := New(gpu.Socket), groupOf(t, gpu, pb)
	defer a.Close()
	ga := groupOf(t, gpu, pa)
	// A group whose channels are not allocated yet (the probes saw its
	// TSG first) cannot take a timeslice: Apply says so, and the other
	// change still takes effect.
	bare := b
	bare.Channels = nil
	if failed, err := a.Apply([]Change{{Group: bare, Timeslice: 500 * time.Microsecond}, {Group: ga, Timeslice: 1024 * time.Microsecond}}); err == nil || failed[0] == nil || failed[1] != nil {
		t.Errorf("a group without channels: failed %v, %v; want it failed, the other done, and an error", failed, err)
	}
	for _, tc := range []struct {
		sa, sb time.Duration
		want   float64
	}{
		{8000 * time.Microsecond, 500 * time.Microsecond, 16.0 / 17},
		{1024 * time.Microsecond, 3072 * time.Microsecond, 0.25},
	} {
		if _, err := a.Apply([]Change{{Group: ga, Timeslice: tc.sa}, {Group: b, Timeslice: tc.sb}}); err != nil {
			t.Fatal(err)
		}
		if got, err := a.Timeslice(ga); err != nil || got != tc.sa {
			t.Errorf("GET_TIMESLICE %v %v, want %v", got, err, tc.sa)
		}
		s := busyOver(t, gpu, 1500*time.Millisecond, pa, pb)
		share := s[0] / (s[0] + s[1])
		t.Logf("timeslices %v / %v: first hog %.3f of the GPU", tc.sa, tc.sb, share)
		if math.Abs(share-tc.want) > 0.02 {
			t.Errorf("timeslices %v / %v: first hog's share %.3f, want %.3f ± 0.02", tc.sa, tc.sb, share, tc.want)
		}
	}
}

// A GPU's slices follow its switch cost: on the nvidia driver (256 µs, the
// real-GPU check's H200) the floor is 1024 µs and the base 2048 µs, or the
// probed group's own where it is longer.
func TestNvidiaSlices(t *testing.T) {
	read := func(d time.Duration, err error) func(uint32, []byte) error {
		return func(cmd uint32, p []byte) error {
			if cmd != nvrm.CtrlTSGGetTimeslice || len(p) != 8 {
				t.Fatalf("control 0x%x with %d bytes, want GET_TIMESLICE", cmd, len(p))
			}
			binary.LittleEndian.PutUint64(p, uint64(d/time.Microsecond))
			return err
		}
	}
	for _, tc := range []struct {
		read time.Duration
		want Slices
	}{
		{2048 * time.Microsecond, Slices{Base: 2048 * time.Microsecond, Min: 1024 * time.Microsecond}},
		{8 * time.Millisecond, Slices{Base: 8 * time.Millisecond, Min: 1024 * time.Microsecond}},
		{1024 * time.Microsecond, Slices{Base: 2048 * time.Microsecond, Min: 1024 * time.Microsecond}},
	} {
		if got, err := (nvidia{}).slices(read(tc.read, nil)); err != nil || got != tc.want {
			t.Errorf("group at %v: %+v %v, want %+v", tc.read, got, err, tc.want)
		}
	}
	if _, err := (nvidia{}).slices(read(0, errors.New("refused"))); err == nil {
		t.Error("a timeslice that cannot be read: no error")
	}
}

// The simulated GPU tells its costs, and its slices follow them: the
// defaults (20 µs switches, 1024 µs slices) keep the 100 µs floor; run with
// the H200's figures it gets the H200's bounds.
func TestSimulatedGPUSlices(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want Slices
	}{
		{nil, Slices{Base: 1024 * time.Microsecond, Min: 100 * time.Microsecond}},
		{[]string{"--ctxsw", "256us", "--timeslice", "2048us"}, Slices{Base: 2048 * time.Microsecond, Min: 1024 * time.Microsecond}},
	} {
		gpu := testutil.StartFakeGPU(t, tc.args...)
		pa, _ := twoHogs(t, gpu)
		a := New(gpu.Socket)
		got, err := a.Slices(groupOf(t, gpu, pa))
		a.Close()
		if err != nil || got != tc.want {
			t.Errorf("fakegpud %v: slices %+v %v, want %+v", tc.args, got, err, tc.want)
		}
	}
}

// The driver's figure of each process's video memory, read through any
// one process's group: what its contexts hold, their baseline included;
// the duplicate of the process read through is not kept.
func TestVideoMemoryAsTheDriverCountsIt(t *testing.T) {
	testutil.Privileged(t)
	const baseline = 32 << 20
	gpu := testutil.StartFakeGPU(t, "--ctx-memory", fmt.Sprint(baseline))
	alloc := testutil.Start(t, nil, gpu.Workload(t, "alloc", "--pattern", "steps", "--count", "4", "--step-mib", "64", "--duration", "20"))
	hog := testutil.Start(t, nil, gpu.Workload(t, "hog", "--kernel-ms", "5", "--duration", "20"))
	pa, pb := alloc.Cmd.Process.Pid, hog.Cmd.Process.Pid
	time.Sleep(300 * time.Millisecond)
	g := groupOf(t, gpu, pb)
	a := New(gpu.Socket)
	defer a.Close()
	want := map[uint32]uint64{uint32(pa): 4<<26 + baseline, uint32(pb): baseline, 999999: 0}
	var got map[uint32]uint64
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got, err = a.VideoMemory(g, []uint32{uint32(pa), uint32(pb), 999999}); err == nil && fmt.Sprint(got) == fmt.Sprint(want) {
			if len(a.procs) != 0 {
				t.Errorf("duplicates kept after a read of a process not steered: %v", a.procs)
			}
			return
		}
	}
	t.Fatalf("video memory %v (%v), want %v", got, err, want)
}

// The GPU's memory is read through another process's subdevice, as the
// driver reports it to allocators, and no duplicate is kept.
func TestMemorySizeAsTheDriverReportsIt(t *testing.T) {
	testutil.Privileged(t)
	gpu := testutil.StartFakeGPU(t, "--memory", fmt.Sprint(24<<30))
	hog := testutil.Start(t, nil, gpu.Workload(t, "hog", "--kernel-ms", "5", "--duration", "20"))
	time.Sleep(300 * time.Millisecond) // its context made
	g := groupOf(t, gpu, hog.Cmd.Process.Pid)
	a := New(gpu.Socket)
	defer a.Close()
	size, err := a.MemorySize(g)
	if err != nil || size != 24<<30 {
		t.Fatalf("GPU memory %d (%v), want 24 GiB", size, err)
	}
	if len(a.procs) != 0 {
		t.Errorf("duplicates kept after a read through a process not steered: %v", a.procs)
	}
	if _, err := a.MemorySize(Group{PID: g.PID, TSG: g.TSG}); err == nil {
		t.Error("read through a group with no subdevice")
	}
}

// A pause takes a group off the GPU with its queued work kept: the other
// takes its time at once, and at the resume the paused one carries on.
func TestPauseStopsQueuedWork(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	pa, pb := twoHogs(t, gpu, "--depth", "64", "--interval", "0.2")
	a := New(gpu.Socket)
	defer a.Close()
	ga := groupOf(t, gpu, pa)
	pause, resume := true, false
	if _, err := a.Apply([]Change{{Group: ga, Pause: &pause}}); err != nil {
		t.Fatal(err)
	}
	s := busyOver(t, gpu, 500*time.Millisecond, pa, pb)
	t.Logf("paused: %.3f / %.3f", s[0], s[1])
	if s[0] > 0.002 || s[1] < 0.97 {
		t.Errorf("paused hog %.3f of the GPU, the other %.3f: want 0 and all of it", s[0], s[1])
	}
	st, _ := fakegpu.ReadStats(gpu.Socket, false)
	for _, c := range st.GPUs[0].Contexts {
		if c.PID == pa && c.Disabled != len(c.Channels) {
			t.Errorf("paused context: %d of %d channels disabled", c.Disabled, len(c.Channels))
		}
	}
	if _, err := a.Apply([]Change{{Group: ga, Pause: &resume}}); err != nil {
		t.Fatal(err)
	}
	s = busyOver(t, gpu, time.Second, pa, pb)
	t.Logf("resumed: %.3f / %.3f", s[0], s[1])
	if math.Abs(s[0]-0.5) > 0.03 {
		t.Errorf("resumed hog %.3f of the GPU, want 0.5", s[0])
	}
}

// Only the file the client is bound to carries controls: a fresh open of
// the same node is refused, as the driver refuses it (0x23).
func TestOwnership(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	pa, _ := twoHogs(t, gpu)
	a := New(gpu.Socket)
	defer a.Close()
	g := groupOf(t, gpu, pa)
	if err := a.Probe(g); err != nil {
		t.Fatalf("GET_INFO through the process's own file: %v", err)
	}
	o, err := a.CheckOwnership(g)
	if err != nil {
		t.Fatal(err)
	}
	if o.ViaDuplicate != nvrm.StatusOK || o.ViaFresh != nvrm.StatusInvalidClient || o.Driver == "nvidia" ||
		filepath.Base(o.Node) != fakegpu.NvidiaCtlNode {
		t.Errorf("ownership %+v: want GET_INFO 0 through the duplicate, 0x23 through a fresh open of %s", o, fakegpu.NvidiaCtlNode)
	}
	var se *StatusError
	bad := g
	bad.TSG++
	if err := a.Probe(bad); !errors.As(err, &se) || se.Status != nvrm.StatusInvalidObject {
		t.Errorf("GET_INFO on a handle that is no group: %v", err)
	}
	start := time.Now()
	if err := a.Preempt(g); err != nil || time.Since(start) < 250*time.Microsecond {
		t.Errorf("PREEMPT: %v after %v (costs about 0.3 ms)", err, time.Since(start))
	}
	a.Sweep()
	if len(a.procs) != 1 {
		t.Errorf("%d processes held after a sweep of live ones", len(a.procs))
	}
}

// The nvidia transport's RM controls, issued through a process's control
// file duplicated with pidfd_getfd, are what the probes decode: the right
// command, handles and parameters.
func TestNvidiaEncodingDecoded(t *testing.T) {
	testutil.Privileged(t)
	if _, err := bpf.EnsureFilesystems(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	node := filepath.Join(dir, "nvidiactl")
	if err := unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	probes, err := bpf.Load(bpf.Options{Devices: []bpf.Device{{Major: 1, Minor: 7, Kind: bpf.KindNvidiaCtl}}})
	if err != nil {
		t.Fatal(err)
	}
	defer probes.Close()
	spy, err := ioctlspy.NewSpy(probes)
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close()
	events := make(chan ioctlspy.Event, 1024)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go spy.Run(ctx, func(ev ioctlspy.Event) {
		if ev.Hdr().PID != uint32(os.Getpid()) {
			events <- ev
		}
	})
	// A process holding the node open, as a CUDA process holds
	// /dev/nvidiactl; a helper in the daemon's role takes its descriptor
	// with pidfd_getfd and sends the controls through it (the probes leave
	// out the process that reads them).
	f, err := os.OpenFile(node, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	holder := exec.Command("sleep", "30")
	holder.ExtraFiles = []*os.File{f}
	p := testutil.Start(t, nil, holder)
	f.Close()
	var st unix.Stat_t
	if err := unix.Stat(node, &st); err != nil {
		t.Fatal(err)
	}
	a := New("")
	defer a.Close()
	g := Group{PID: uint32(p.Cmd.Process.Pid), FD: 3, File: ioctlspy.FileID{Dev: st.Dev, Ino: st.Ino}, Client: 0xc1e00042,
		TSG: 0x5c000010, Subdevice: 0x5c000003, Channels: []uint32{0x5c000011, 0x5c000012}}
	a.mu.Lock()
	_, err = a.file(g)
	a.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), "no simulated GPU was given") {
		t.Fatalf("a node of the mem driver with no simulated GPU given: %v", err)
	}
	helper := exec.Command(os.Args[0], "-test.run", "^$")
	helper.Env = append(os.Environ(), fmt.Sprintf("GPUSCHED_HELPER=%d", p.Cmd.Process.Pid))
	if out, err := helper.CombinedOutput(); err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	want := []struct {
		object, cmd uint32
		size        int
	}{
		{g.TSG, nvrm.CtrlTSGSetTimeslice, 8},
		{g.Channels[0], nvrm.CtrlRestartRunlist, 2},
		{g.Subdevice, nvrm.CtrlFIFODisableChannels, 536},
	}
	deadline := time.After(3 * time.Second)
	for i := 0; i < len(want); {
		var ev *ioctlspy.RMControl
		select {
		case e := <-events:
			switch x := e.(type) {
			case *ioctlspy.RMControl:
				ev = x
			case *ioctlspy.TSGControl:
				ev = &x.RMControl
				if x.Name != "SET_TIMESLICE" || x.TimesliceUS != 8000 {
					t.Errorf("decoded %+v", x)
				}
			}
		case <-deadline:
			t.Fatalf("control 0x%x not seen by the probes", want[i].cmd)
		}
		if ev == nil {
			continue
		}
		c := want[i]
		if ev.CtrlCmd != c.cmd || ev.Client != g.Client || ev.Object != c.object || ev.ParamsSize != uint32(c.size) ||
			ev.Nr != nvrm.EscRMControl || ev.Cmd != uint32(rmControlIoctl) || ev.Ret != -int64(unix.ENOTTY) {
			t.Errorf("control 0x%x decoded as %+v", c.cmd, ev)
		}
		i++
	}
	// FIFO_DISABLE_CHANNELS' list is where the driver reads it.
	p536 := must(disableParams(true, false, g.Client, g.Channels))
	le := binary.LittleEndian
	if p536[0] != 1 || le.Uint32(p536[4:]) != 2 || le.Uint32(p536[24:]) != g.Client || le.Uint32(p536[280:]) != g.Channels[0] ||
		le.Uint32(p536[284:]) != g.Channels[1] || len(p536) != 536 {
		t.Errorf("FIFO_DISABLE_CHANNELS params % x", p536[:32])
	}
	if p536[8] != 0 {
		t.Errorf("an evicting disable sets bOnlyDisableScheduling: % x", p536[:16])
	}
	if lazy := must(disableParams(true, true, g.Client, g.Channels)); lazy[0] != 1 || lazy[8] != 1 {
		t.Errorf("a disable that keeps the group running: % x", lazy[:16])
	}
	if on := must(disableParams(false, false, g.Client, g.Channels)); on[0] != 0 || on[8] != 0 {
		t.Errorf("an enable: % x", on[:16])
	}
}

// TestMain runs, with GPUSCHED_HELPER=PID, the daemon's side of
// TestNvidiaEncodingDecoded: pidfd_getfd of PID's descriptor 3, and three
// RM controls through it with the nvidia transport.
func TestMain(m *testing.M) {
	if v := os.Getenv("GPUSCHED_HELPER"); v != "" {
		os.Exit(nvidiaHelper(v))
	}
	os.Exit(m.Run())
}

func nvidiaHelper(pidText string) int {
	var pid int
	fmt.Sscan(pidText, &pid)
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		fmt.Println("pidfd_open:", err)
		return 1
	}
	fd, err := unix.PidfdGetfd(pidfd, 3, 0)
	if err != nil {
		fmt.Println("pidfd_getfd:", err)
		return 1
	}
	dup := os.NewFile(uintptr(fd), "dup")
	client, channels := uint32(0xc1e00042), []uint32{0x5c000011, 0x5c000012}
	for _, c := range []struct {
		object, cmd uint32
		params      []byte
	}{
		{0x5c000010, nvrm.CtrlTSGSetTimeslice, timesliceParams(8 * time.Millisecond)},
		{channels[0], nvrm.CtrlRestartRunlist, restartParams()},
		{0x5c000003, nvrm.CtrlFIFODisableChannels, must(disableParams(true, false, client, channels))},
	} {
		if _, err := (nvidia{}).control(dup, client, c.object, c.cmd, c.params); !errors.Is(err, unix.ENOTTY) {
			fmt.Printf("control 0x%x: %v, want ENOTTY from the mem driver's node\n", c.cmd, err)
			return 1
		}
	}
	return 0
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
