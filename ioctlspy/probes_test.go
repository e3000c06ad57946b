package ioctlspy_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/ioctlspy"
)

const helperEnv = "GPUARB_IOCTL_HELPER"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		if err := runHelper(h); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// arena is memory outside the Go heap whose addresses can go into ioctl
// structures.
type arena struct {
	mem []byte
	off int
}

func newArena() *arena {
	mem, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		panic(err)
	}
	return &arena{mem: mem}
}

// put copies b into the arena and returns its address.
func (a *arena) put(b []byte) uint64 {
	a.off = (a.off + 15) &^ 15
	copy(a.mem[a.off:], b)
	addr := uint64(uintptr(unsafe.Pointer(&a.mem[a.off])))
	a.off += len(b)
	return addr
}

func le(vals ...any) []byte {
	var b []byte
	for _, v := range vals {
		switch x := v.(type) {
		case int:
			b = binary.LittleEndian.AppendUint32(b, uint32(x))
		case uint64:
			b = binary.LittleEndian.AppendUint64(b, x)
		}
	}
	return b
}

func ioc(dir, typ, nr, size uint32) uint32 { return dir<<30 | size<<16 | typ<<8 | nr }

func ioctl(fd int, cmd uint32, arg uint64) {
	unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(cmd), uintptr(arg))
}

func openNode(env string) (int, error) {
	return unix.Open(os.Getenv(env), unix.O_RDWR, 0)
}

// runHelper issues GPU ioctls with the real encodings, then exits.
func runHelper(kind string) error {
	a := newArena()
	switch kind {
	case "opens":
		// A flood of opens of a libcuda that is not there.
		for i := 0; i < 5000; i++ {
			if f, err := os.Open("/nonexistent-gpuarb/libcuda.so.1"); err == nil {
				f.Close()
			}
		}
		return nil
	case "nvidia":
		nv, err := openNode("NV_NODE")
		if err != nil {
			return err
		}
		uvm, err := openNode("UVM_NODE")
		if err != nil {
			return err
		}
		other, err := openNode("OTHER_NODE")
		if err != nil {
			return err
		}
		tsgParams := a.put(le(0, 0, 0x5c000005, 1, 0))
		// paramsSize 0, as the real libcuda passes it: the driver sizes
		// the parameters from the class.
		nvos21 := le(0xc1d00001, 0x5c000002, 0x5c000010, 0xA06C, tsgParams, 0, 0)
		ioctl(nv, ioc(3, 'F', 0x2B, 32), a.put(nvos21))
		chParams := a.put(le(0, 0, uint64(0xabc000), 512, 0, 0, 0x5c000005))
		nvos64 := a.put(le(0xc1d00001, 0x5c000010, 0x5c000011, 0xC56F, chParams, uint64(0), 0, 0, 0, 0))
		ioctl(nv, ioc(3, 'F', 211, 16), a.put(le(0x2B, 48, nvos64))) // IOCTL_XFER_CMD -> RM_ALLOC
		token := a.put(le(0x1234))
		ioctl(nv, ioc(3, 'F', 0x2A, 32), a.put(le(0xc1d00001, 0x5c000011, 0xC36F0108, 0, token, 4, 0)))
		ioctl(nv, ioc(3, 'F', 0x4E, 56), a.put(le(0xc1d00001, 0x5c000001, 0x5c000020, 0, uint64(4096), uint64(1<<20), uint64(0), 0, 0, -1, 0)))
		ioctl(nv, ioc(3, 'F', 206, 16), a.put(le(0xc1d00001, 0x5c000001, 9, 0)))
		ioctl(nv, ioc(3, 'F', 0x29, 16), a.put(le(0xc1d00001, 0x5c000010, 0x5c000011, 0)))
		uuid := []byte("GPU-0123456789ab")
		ioctl(uvm, 27, a.put(append(uuid, le(0xc1d00001, 0x5c000011, uint64(0x10000), uint64(4096), 0, 0)...)))
		ioctl(other, ioc(3, 'F', 0x2B, 32), a.put(nvos21)) // not a GPU: no event
	case "nouveau":
		drm, err := openNode("DRM_NODE")
		if err != nil {
			return err
		}
		other, err := openNode("OTHER_NODE")
		if err != nil {
			return err
		}
		ioctl(drm, ioc(3, 'd', 0x42, 88), a.put(append(le(0, 0, 6), make([]byte, 76)...)))
		exec := le(6, 3, 0, 0, uint64(0), uint64(0), uint64(0))
		ioctl(drm, ioc(3, 'd', 0x52, 40), a.put(exec))
		ioctl(drm, ioc(3, 'd', 0x81, 64), a.put(le(6, 1, uint64(0), 0, 2, uint64(0), uint64(0), 0, 0, uint64(0), uint64(0))))
		ioctl(drm, ioc(1, 'd', 0x82, 8), a.put(le(11, 0)))
		ioctl(drm, ioc(3, 'd', 0x51, 40), a.put(le(2, 0, 0, 0, uint64(0), uint64(0), uint64(0))))
		ioctl(drm, ioc(3, 'd', 0xC3, 40), a.put(le(uint64(0), uint64(0), 1, 0, 0, 0, uint64(0))))
		ioctl(drm, ioc(1, 'd', 0x43, 4), a.put(le(6)))
		ioctl(other, ioc(3, 'd', 0x52, 40), a.put(exec)) // not in the table: no event
	case "objects": // OBJECTS RM_ALLOCs of channel groups, each a new handle, claimed made
		nv, err := openNode("NV_NODE")
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(os.Getenv("OBJECTS"))
		params := a.put(le(0, 0, 0x5c000005, 1, 0))
		mark := a.off
		for i := 0; i < n; i++ {
			a.off = mark // one argument rewritten: a new handle each time
			ioctl(nv, ioc(3, 'F', 0x2B, 32), a.put(le(0xc1d00001, 0x5c000002, 0x5d000000+i, 0xA06C, params, 0, 0)))
		}
	case "flood": // RM_ALLOCs at FLOOD_RATE per second for FLOOD_SECONDS
		nv, err := openNode("NV_NODE")
		if err != nil {
			return err
		}
		rate, _ := strconv.Atoi(os.Getenv("FLOOD_RATE"))
		secs, _ := strconv.Atoi(os.Getenv("FLOOD_SECONDS"))
		params := a.put(le(0, 0, 0x5c000005, 1, 0))
		arg := a.put(le(0xc1d00001, 0x5c000002, 0x5c000010, 0xA06C, params, 20, 0))
		start := time.Now()
		for n := 0; n < rate*secs; n++ {
			if due := start.Add(time.Duration(n) * time.Second / time.Duration(rate)); time.Until(due) > time.Millisecond {
				time.Sleep(time.Until(due))
			}
			ioctl(nv, ioc(3, 'F', 0x2B, 32), arg)
		}
	default:
		return fmt.Errorf("unknown helper %q", kind)
	}
	return nil
}

// collector runs a Spy and gathers events by PID.
type collector struct {
	mu     sync.Mutex
	events map[uint32][]ioctlspy.Event
	exited map[uint32]bool
	cancel context.CancelFunc
	done   chan error
}

func startSpy(t *testing.T, devices []bpf.Device, ringSize uint32) (*bpf.Probes, *collector) {
	t.Helper()
	return startSpyWith(t, bpf.Options{Devices: devices, RingSize: ringSize})
}

// startSpyWith loads the probes with opts and collects their events.
func startSpyWith(t *testing.T, opts bpf.Options) (*bpf.Probes, *collector) {
	t.Helper()
	testutil.Privileged(t)
	if _, err := bpf.EnsureFilesystems(); err != nil {
		t.Fatal(err)
	}
	probes, err := bpf.Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	spy, err := ioctlspy.NewSpy(probes)
	if err != nil {
		probes.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{events: map[uint32][]ioctlspy.Event{}, exited: map[uint32]bool{}, cancel: cancel, done: make(chan error, 1)}
	go func() {
		c.done <- spy.Run(ctx, func(ev ioctlspy.Event) {
			c.mu.Lock()
			defer c.mu.Unlock()
			h := ev.Hdr()
			if _, ok := ev.(*ioctlspy.ProcessExit); ok {
				c.exited[h.PID] = true
			}
			c.events[h.PID] = append(c.events[h.PID], ev)
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-c.done; err != nil {
			t.Errorf("spy: %v", err)
		}
		spy.Close()
		probes.Close()
	})
	return probes, c
}

// waitExit returns the events of pid once its exit has been seen.
func (c *collector) waitExit(t *testing.T, pid int) []ioctlspy.Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		done := c.exited[uint32(pid)]
		evs := append([]ioctlspy.Event(nil), c.events[uint32(pid)]...)
		c.mu.Unlock()
		if done {
			return evs
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no exit event for pid %d", pid)
	return nil
}

func mknod(t *testing.T, dir, name string, major, minor uint32) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatal(err)
	}
	return p
}

func runHelperIn(t *testing.T, cg *testutil.Cgroup, kind string, env ...string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, helperEnv+"="+kind)...)
	p := testutil.Start(t, cg, cmd)
	if err := p.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("helper: %v: %s", err, p.Stderr)
	}
	return cmd.Process.Pid
}

func byType[T ioctlspy.Event](evs []ioctlspy.Event) []T {
	var out []T
	for _, e := range evs {
		if x, ok := e.(T); ok {
			out = append(out, x)
		}
	}
	return out
}

// Issue 56, item 8: a process can claim RM objects without end (their
// handles and statuses are read from its memory): the table keeps at most
// 4096 of one process and counts the rest dropped.
func TestFakeObjectsAreBounded(t *testing.T) {
	_, c := startSpy(t, []bpf.Device{{Major: 1, Minor: 7, Kind: bpf.KindNvidiaCtl}}, 0)
	const claimed = 12000
	pid := runHelperIn(t, testutil.NewCgroup(t, "objects"), "objects", "NV_NODE="+mknod(t, t.TempDir(), "nvidiactl", 1, 7),
		fmt.Sprintf("OBJECTS=%d", claimed))
	evs := c.waitExit(t, pid)
	tbl := ioctlspy.NewTable()
	var kept int
	for _, ev := range evs {
		if _, exit := ev.(*ioctlspy.ProcessExit); exit {
			break // the table drops an exited process
		}
		tbl.Apply(ev)
	}
	if p, ok := tbl.Process(uint32(pid)); ok {
		kept = len(p.TSGs)
	}
	dropped, _ := tbl.Dropped()
	t.Logf("%d groups claimed, %d decoded, %d kept, %d dropped", claimed, len(byType[*ioctlspy.TSGAllocated](evs)), kept, dropped)
	if kept > 4096 || kept+int(dropped) != len(byType[*ioctlspy.TSGAllocated](evs)) {
		t.Errorf("%d groups kept, %d dropped of %d decoded: want at most 4096 kept, the rest counted", kept, dropped,
			len(byType[*ioctlspy.TSGAllocated](evs)))
	}
}

func TestNvidiaIoctls(t *testing.T) {
	dir := t.TempDir()
	probes, c := startSpy(t, []bpf.Device{
		{Major: 1, Minor: 7, Kind: bpf.KindNvidiaCtl},
		{Major: 1, Minor: 5, Kind: bpf.KindNvidiaUVM},
	}, 0)
	cg := testutil.NewCgroup(t, "nvidia")
	pid := runHelperIn(t, cg, "nvidia",
		"NV_NODE="+mknod(t, dir, "nvidiactl", 1, 7),
		"UVM_NODE="+mknod(t, dir, "nvidia-uvm", 1, 5),
		"OTHER_NODE="+mknod(t, dir, "other", 1, 8))
	evs := c.waitExit(t, pid)

	for _, e := range evs {
		h := e.Hdr()
		if h.CgroupID != cg.ID {
			t.Errorf("%s: cgroup id %d, want the test cgroup's %d", h.Type, h.CgroupID, cg.ID)
		}
		if _, ok := e.(*ioctlspy.ProcessExit); ok {
			continue
		}
		if h.DurationNS == 0 || h.Comm == "" {
			t.Errorf("%s: duration %d comm %q", h.Type, h.DurationNS, h.Comm)
		}
	}
	tsg := byType[*ioctlspy.TSGAllocated](evs)
	if len(tsg) != 1 || tsg[0].Class != 0xA06C || tsg[0].Client != 0xc1d00001 || tsg[0].Parent != 0x5c000002 ||
		tsg[0].Handle != 0x5c000010 || tsg[0].EngineType != 1 || tsg[0].VASpace != 0x5c000005 || tsg[0].Device != "1:7" || tsg[0].ParamsSize != 0 {
		t.Errorf("TSG allocation: %+v", tsg)
	}
	ch := byType[*ioctlspy.ChannelAllocated](evs)
	if len(ch) != 1 || ch[0].Class != 0xC56F || ch[0].Parent != 0x5c000010 || ch[0].Handle != 0x5c000011 ||
		ch[0].GPFIFOEntries != 512 || ch[0].GPFIFOOffset != 0xabc000 || ch[0].Nr != 0x2B {
		t.Errorf("channel allocation through IOCTL_XFER_CMD: %+v", ch)
	}
	tok := byType[*ioctlspy.WorkSubmitToken](evs)
	if len(tok) != 1 || tok[0].CtrlCmd != 0xC36F0108 || tok[0].Channel != 0x5c000011 || tok[0].Token != 0x1234 {
		t.Errorf("work submit token: %+v", tok)
	}
	mm := byType[*ioctlspy.MemoryMapped](evs)
	if len(mm) != 1 || mm[0].Memory != 0x5c000020 || mm[0].Offset != 4096 || mm[0].Length != 1<<20 {
		t.Errorf("map memory: %+v", mm)
	}
	if ev := byType[*ioctlspy.OSEvent](evs); len(ev) != 1 || ev[0].FD != 9 {
		t.Errorf("os event: %+v", ev)
	}
	if fr := byType[*ioctlspy.ObjectFreed](evs); len(fr) != 1 || fr[0].Handle != 0x5c000011 {
		t.Errorf("free: %+v", fr)
	}
	uvm := byType[*ioctlspy.UVMChannelRegistered](evs)
	if len(uvm) != 1 || uvm[0].Channel != 0x5c000011 || uvm[0].Base != 0x10000 || uvm[0].Length != 4096 || uvm[0].Device != "1:5" {
		t.Errorf("uvm register channel: %+v", uvm)
	}
	if n := len(evs); n != 8 { // 7 GPU ioctls and the exit; the ioctl on 1:8 is not a GPU's
		t.Errorf("%d events, want 8: %v", n, evs)
	}
	stats, err := probes.Cgroups()
	if err != nil {
		t.Fatal(err)
	}
	if st := stats[cg.ID]; st.GpuIoctls != 7 {
		t.Errorf("cgroup counters: %+v, want 7 GPU ioctls", st)
	}
}

func TestNouveauIoctls(t *testing.T) {
	dir := t.TempDir()
	probes, c := startSpy(t, []bpf.Device{{Major: 1, Minor: 9, AnyMinor: false, Kind: bpf.KindDRM}}, 0)
	cg := testutil.NewCgroup(t, "nouveau")
	pid := runHelperIn(t, cg, "nouveau", "DRM_NODE="+mknod(t, dir, "renderD128", 1, 9), "OTHER_NODE="+mknod(t, dir, "other", 1, 7))
	evs := c.waitExit(t, pid)

	ch := byType[*ioctlspy.NouveauChannel](evs)
	if len(ch) != 2 || ch[0].Channel != 6 || ch[0].Freed || ch[1].Channel != 6 || !ch[1].Freed {
		t.Errorf("channels: %+v", ch)
	}
	sub := byType[*ioctlspy.Submission](evs)
	if len(sub) != 2 || sub[0].Name != "NOUVEAU_EXEC" || sub[0].Pushes != 3 || sub[1].Name != "NOUVEAU_GEM_PUSHBUF" || sub[1].Pushes != 2 {
		t.Errorf("submissions: %+v", sub)
	}
	syncs := byType[*ioctlspy.Sync](evs)
	if len(syncs) != 2 || syncs[0].Func != "NOUVEAU_GEM_CPU_PREP" || syncs[0].Handle != 11 || syncs[1].Func != "DRM_SYNCOBJ_WAIT" {
		t.Errorf("waits: %+v", syncs)
	}
	if vb := byType[*ioctlspy.VMBind](evs); len(vb) != 1 || vb[0].Ops != 2 {
		t.Errorf("vm bind: %+v", vb)
	}
	for _, e := range evs {
		if e.Hdr().CgroupID != cg.ID {
			t.Errorf("%s in cgroup %d, want %d", e.Hdr().Type, e.Hdr().CgroupID, cg.ID)
		}
	}
	if len(evs) != 8 { // 7 on the drm node, the exit; the EXEC on 1:7 is not in the table
		t.Errorf("%d events, want 8", len(evs))
	}
	stats, err := probes.Cgroups()
	if err != nil {
		t.Fatal(err)
	}
	if st := stats[cg.ID]; st.GpuIoctls != 7 || st.Submissions != 2 || st.Syncs != 2 {
		t.Errorf("cgroup counters: %+v", st)
	}
}

func buildABITest(t *testing.T, lib string) string {
	t.Helper()
	return buildCTest(t, lib, "abi_test")
}

// buildCTest builds one of the simulated GPU's C tests against lib.
func buildCTest(t *testing.T, lib, name string) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), name)
	src := filepath.Join(testutil.RepoRoot(t), "e2e/fakegpu/abitest", name+".c")
	out, err := exec.Command("cc", "-O2", "-o", exe, src, "-L"+filepath.Dir(lib), "-l:libcuda.so.1",
		"-Wl,-rpath,"+filepath.Dir(lib), "-ldl").CombinedOutput()
	if err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	return exe
}

// TestRuntimeVariantsProbed runs the runtime-shaped ABI test (entry points
// from cuGetProcAddress_v2, per-thread streams, primary contexts, event
// polling) under the probes, attached with uprobe_multi and with a uprobe
// per symbol: every variant it calls is seen, polls read as waits.
func TestRuntimeVariantsProbed(t *testing.T) {
	for _, multi := range []bool{true, false} {
		t.Run(map[bool]string{true: "uprobe_multi", false: "uprobe per symbol"}[multi], func(t *testing.T) {
			gpu := testutil.StartFakeGPU(t)
			lib := testutil.Bin(t, "libcuda.so.1")
			probes, c := startSpyWith(t, bpf.Options{Devices: []bpf.Device{{Major: 1, Minor: 7, Kind: bpf.KindNvidiaCtl}},
				NoUprobeMulti: !multi})
			if multi && !probes.UprobeMulti() {
				testutil.Missing(t, "uprobe_multi links (Linux ≥ 6.6)")
			}
			if _, err := probes.AttachLibcuda(lib); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(buildCTest(t, lib, "runtime_test"))
			cmd.Env = gpu.Env()
			p := testutil.Start(t, nil, cmd)
			if err := p.Wait(t, 60*time.Second); err != nil {
				t.Fatalf("runtime_test: %v\n%s", err, p.Stdout)
			}
			evs := c.waitExit(t, cmd.Process.Pid)
			seen := map[string]int{}
			for _, e := range evs {
				switch e := e.(type) {
				case *ioctlspy.Launch:
					seen[e.Func]++
				case *ioctlspy.GraphLaunch:
					seen[e.Func]++
				case *ioctlspy.EventRecord:
					seen[e.Func]++
				case *ioctlspy.StreamWaitEvent:
					seen[e.Func]++
				case *ioctlspy.StreamCapture:
					seen[e.Func]++
				case *ioctlspy.Sync:
					seen[e.Func]++
					if e.Polled && e.Of == ioctlspy.WaitEvent && e.DurationNS > 3e6 {
						seen["long poll"]++
					}
				case *ioctlspy.WaitBegin:
					seen["begin "+e.Func]++
				case *ioctlspy.ContextCreated:
					seen[e.Func]++
				case *ioctlspy.MemAlloc:
					seen[e.Func]++
				case *ioctlspy.Copy:
					seen[e.Func]++
					if e.Func == "cuMemsetD32Async_ptsz" && e.Bytes != 4096 {
						t.Errorf("memset of 1024 words counted as %d bytes", e.Bytes)
					}
				}
			}
			for _, want := range []string{"cuLaunchKernel_ptsz", "cuLaunchKernelEx_ptsz", "cuGraphLaunch_ptsz",
				"cuEventRecord_ptsz", "cuEventRecordWithFlags_ptsz", "cuStreamWaitEvent_ptsz", "cuStreamSynchronize_ptsz",
				"begin cuStreamSynchronize_ptsz", "cuCtxSynchronize_v2", "cuEventSynchronize", "cuEventQuery",
				"begin cuEventQuery", "cuStreamQuery_ptsz", "long poll", "cuCtxCreate_v3", "cuCtxCreate_v4",
				"cuDevicePrimaryCtxRetain", "cuMemAlloc_v2", "cuMemAllocAsync_ptsz", "cuMemcpyAsync_ptsz",
				"cuMemsetD32Async_ptsz", "cuMemsetD32_v2_ptds", "cuMemcpyPeerAsync_ptsz", "cuStreamBeginCapture_v2_ptsz",
				"cuStreamBeginCaptureToGraph_ptsz", "cuStreamEndCapture_ptsz"} {
				if seen[want] == 0 {
					t.Errorf("%s not seen (seen: %v)", want, seen)
				}
			}
			// A polling loop of thousands of queries is one wait: a begin and
			// an end, not a record per query.
			if seen["begin cuEventQuery"] > 10 {
				t.Errorf("%d poll begins for a handful of waits", seen["begin cuEventQuery"])
			}
		})
	}
}

func TestLibcudaUprobes(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	lib := testutil.Bin(t, "libcuda.so.1")
	probes, c := startSpy(t, []bpf.Device{{Major: 1, Minor: 7, Kind: bpf.KindNvidiaCtl}}, 0)
	if attached, err := probes.AttachLibcuda(lib); err != nil || !attached {
		t.Fatalf("attach %s: %v %v", lib, attached, err)
	}
	if attached, err := probes.AttachLibcuda(lib); err != nil || attached {
		t.Fatalf("second attach of the same inode: attached=%v err=%v", attached, err)
	}
	exe := buildABITest(t, lib)
	cg := testutil.NewCgroup(t, "cuda")
	cmd := exec.Command(exe)
	cmd.Env = gpu.Env()
	p := testutil.Start(t, cg, cmd)
	if err := p.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("abi_test: %v\n%s", err, p.Stdout)
	}
	evs := c.waitExit(t, cmd.Process.Pid)
	for _, e := range evs {
		if e.Hdr().CgroupID != cg.ID {
			t.Fatalf("%s in cgroup %d, want %d", e.Hdr().Type, e.Hdr().CgroupID, cg.ID)
		}
	}

	launches := byType[*ioctlspy.Launch](evs)
	var plain, ex, graphCaptured int
	for _, l := range launches {
		switch {
		case l.Func == "cuLaunchKernel" && l.Grid == [3]uint32{10, 1, 1} && l.Block == [3]uint32{128, 1, 1} && l.Stream == 0:
			plain++
		case l.Func == "cuLaunchKernelEx" && l.Grid == [3]uint32{5, 2, 1} && l.Block == [3]uint32{64, 1, 1} && l.Stream != 0:
			ex++
		case l.Grid == [3]uint32{100, 1, 1} && l.Block == [3]uint32{32, 1, 1} && l.Stream != 0:
			graphCaptured++
		}
	}
	// Captured: four into a new graph (two of them on a stream the capture
	// forked to), two in a capture left unjoined, then two twice into an
	// existing one.
	if plain != 1 || ex != 1 || graphCaptured != 10 {
		t.Errorf("launches: plain %d ex %d captured %d of %d: %+v", plain, ex, graphCaptured, len(launches), launches)
	}
	if g := byType[*ioctlspy.GraphLaunch](evs); len(g) < 1 || g[0].Exec == 0 || g[0].Stream == 0 {
		t.Errorf("graph launches: %+v", g)
	}
	copies := byType[*ioctlspy.Copy](evs)
	want := map[string]uint64{"cuMemcpyHtoD_v2": 4096, "cuMemcpyDtoH_v2": 4096, "cuMemcpyHtoDAsync_v2": 4096,
		"cuMemcpyDtoHAsync_v2": 4096, "cuMemsetD8_v2": 1 << 20, "cuMemsetD8Async": 4096}
	for _, cp := range copies {
		if b, ok := want[cp.Func]; ok && cp.Bytes == b && cp.Async == strings.Contains(cp.Func, "Async") {
			delete(want, cp.Func)
		}
	}
	if len(want) != 0 {
		t.Errorf("copies not seen: %v (got %+v)", want, copies)
	}
	allocs := byType[*ioctlspy.MemAlloc](evs)
	frees := byType[*ioctlspy.MemFree](evs)
	var alloc1M, alloc4K uint64
	for _, a := range allocs {
		if a.Ret == 0 && a.Bytes == 1<<20 {
			alloc1M = a.DPtr
		}
		if a.Ret == 0 && a.Bytes == 4096 {
			alloc4K = a.DPtr
		}
	}
	if alloc1M == 0 || alloc4K == 0 {
		t.Errorf("allocations: %+v", allocs)
	}
	if len(frees) < 1 || frees[0].DPtr != alloc4K || frees[0].Bytes != 4096 {
		t.Errorf("free of the 4 KiB allocation with its size: %+v", frees)
	}
	var longSync bool
	recorded := map[uint64]uint64{} // event -> stream
	for _, r := range byType[*ioctlspy.EventRecord](evs) {
		recorded[r.Event] = r.Stream
	}
	for _, s := range byType[*ioctlspy.Sync](evs) {
		if s.Func == "cuEventSynchronize" && s.Ret == 0 && s.DurationNS > 5e6 {
			longSync = true
			// It slept on the simulated GPU's futex until the kernel was
			// done: woken in its last part, before it returned.
			if s.Woken < s.Start+s.DurationNS/2 || s.Woken > s.End {
				t.Errorf("the 10 ms wait's wake-up at %d, want in the second half of [%d, %d]", s.Woken, s.Start, s.End)
			}
			if st, ok := recorded[s.Handle]; !ok || st == 0 {
				t.Errorf("event 0x%x synchronized without its cuEventRecord on a stream: %v", s.Handle, recorded)
			}
		}
	}
	if !longSync {
		t.Errorf("no cuEventSynchronize waiting out the 10 ms kernel: %+v", byType[*ioctlspy.Sync](evs))
	}
	created := byType[*ioctlspy.ContextCreated](evs)
	destroyed := byType[*ioctlspy.ContextDestroyed](evs)
	if len(created) < 2 || created[0].Ctx == 0 || len(destroyed) < 2 {
		t.Errorf("contexts: created %+v destroyed %+v", created, destroyed)
	}
	// The simulator's setup traffic is the real nvidia encoding.
	tsgs := byType[*ioctlspy.TSGAllocated](evs)
	chans := byType[*ioctlspy.ChannelAllocated](evs)
	toks := byType[*ioctlspy.WorkSubmitToken](evs)
	if len(tsgs) != 2 || len(chans) < 4 || len(toks) != len(chans) {
		t.Errorf("nvidia setup traffic: %d TSGs, %d channels, %d tokens", len(tsgs), len(chans), len(toks))
	}
	for _, ch := range chans {
		if ch.Class != 0xC86F || ch.GPFIFOEntries != 1024 || ch.Nr != 0x2B {
			t.Errorf("channel %+v", ch)
		}
	}
	stats, err := probes.Cgroups()
	if err != nil {
		t.Fatal(err)
	}
	// Counters count calls at entry, failed ones too, as the events do.
	st := stats[cg.ID]
	if st.Launches != uint64(len(launches)+len(byType[*ioctlspy.GraphLaunch](evs))) || st.BytesAlloc != 1<<20+4096 ||
		st.BytesFreed != 4096 || st.Copies != uint64(len(copies)) || st.Syncs == 0 || st.SyncWaitNs < 5e6 {
		t.Errorf("cgroup counters %+v", st)
	}
}

// TestNouveauMode checks libcuda's nouveau mode: each submission is also a
// DRM_NOUVEAU_EXEC ioctl on the drm-typed node, each wait a GEM_CPU_PREP.
func TestNouveauMode(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	probes, c := startSpy(t, []bpf.Device{{Major: 1, Minor: 3, Kind: bpf.KindDRM}}, 0)
	if _, err := probes.AttachLibcuda(testutil.Bin(t, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	cg := testutil.NewCgroup(t, "nouveau-mode")
	cmd := gpu.Workload(t, "infer", "--rate", "200", "--duration", "0.5")
	cmd.Env = append(cmd.Env, "FAKEGPU_MODE=nouveau")
	p := testutil.Start(t, cg, cmd)
	if err := p.Wait(t, 20*time.Second); err != nil {
		t.Fatalf("infer: %v: %s", err, p.Stderr)
	}
	evs := c.waitExit(t, cmd.Process.Pid)
	launches := byType[*ioctlspy.Launch](evs)
	var execs, preps int
	for _, s := range byType[*ioctlspy.Submission](evs) {
		if s.Name == "NOUVEAU_EXEC" && s.Pushes == 1 && s.Device == "1:3" {
			execs++
		}
	}
	for _, s := range byType[*ioctlspy.Sync](evs) {
		if s.Func == "NOUVEAU_GEM_CPU_PREP" {
			preps++
		}
	}
	if len(launches) < 300 || execs != len(launches) {
		t.Errorf("%d launches, %d NOUVEAU_EXEC ioctls: want one per launch", len(launches), execs)
	}
	if preps < 90 {
		t.Errorf("%d GEM_CPU_PREP waits for ~100 requests", preps)
	}
	// The workload exits without cuCtxDestroy, as programs often do: no CHANNEL_FREE.
	if ch := byType[*ioctlspy.NouveauChannel](evs); len(ch) != 1 || ch[0].Freed {
		t.Errorf("channel alloc: %+v", ch)
	}
	if n := len(byType[*ioctlspy.TSGAllocated](evs)); n != 0 {
		t.Errorf("%d nvidia TSG allocations in nouveau mode", n)
	}
	stats, err := probes.Cgroups()
	if err != nil {
		t.Fatal(err)
	}
	// Launches count twice as submissions: the doorbell (uprobe) and the EXEC ioctl.
	if st := stats[cg.ID]; st.Submissions != uint64(len(launches)+execs) {
		t.Errorf("submissions %d, want %d", st.Submissions, len(launches)+execs)
	}
}

// A container's own libcuda (another inode at another path) is found by
// what the process maps at its first GPU ioctl, before its first launch:
// its launches are seen.
func TestLibcudaCopyFoundAtTheFirstGPUIoctl(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	_, c := startSpy(t, []bpf.Device{{Major: 1, Minor: 7, Kind: bpf.KindNvidiaCtl}}, 0)
	copyDir := filepath.Join(t.TempDir(), "container", "usr", "lib")
	if err := os.MkdirAll(copyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(testutil.Bin(t, "libcuda.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(copyDir, "libcuda.so.1")
	if err := os.WriteFile(copyPath, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cg := testutil.NewCgroup(t, "container")
	cmd := gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "1.5")
	cmd.Env = append(cmd.Env, "GPUWORK_LIBCUDA="+copyPath)
	p := testutil.Start(t, cg, cmd)
	if err := p.Wait(t, 20*time.Second); err != nil {
		t.Fatalf("hog: %v: %s", err, p.Stderr)
	}
	evs := c.waitExit(t, cmd.Process.Pid)
	// The scan starts at the first ioctl, the launches after the process's
	// GPU setup: the attach races the first ones.
	if n := len(byType[*ioctlspy.Launch](evs)); n < 100 {
		t.Errorf("%d launches seen through the copy, want ≥ 100 of ~700", n)
	}
}

// Issue 56, item 1: no probe reports opens, so a flood of opens of files
// named libcuda (missing ones here) reaches neither the ring buffer nor
// the daemon, which never opens a path a tenant names.
func TestOpensOfLibcudaNamesReachNothing(t *testing.T) {
	_, c := startSpy(t, nil, 0)
	flood := runHelperIn(t, testutil.NewCgroup(t, "flood"), "opens")
	time.Sleep(100 * time.Millisecond) // a poll and more
	c.mu.Lock()
	n := len(c.events[uint32(flood)])
	c.mu.Unlock()
	if n != 0 {
		t.Errorf("5000 opens of files named libcuda: %d records, want none", n)
	}
}
