package bpf

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/internal/testutil"
)

func TestParseDevice(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Device
		wantErr string
	}{
		{"1:7=nvidia", Device{Major: 1, Minor: 7, Kind: KindNvidiaCtl}, ""},
		{"195:0=nvidia-gpu", Device{Major: 195, Minor: 0, Kind: KindNvidiaGPU}, ""},
		{"226:*=drm", Device{Major: 226, AnyMinor: true, Kind: KindDRM}, ""},
		{"511:3=nvidia-uvm", Device{Major: 511, Minor: 3, Kind: KindNvidiaUVM}, ""},
		{"1:7", Device{}, "want MAJ:MIN=KIND"},
		{"17=drm", Device{}, "want MAJ:MIN=KIND"},
		{"x:1=drm", Device{}, "major"},
		{"5000:1=drm", Device{}, "major"},
		{"1:-1=drm", Device{}, "minor"},
		{"1:2=amd", Device{}, "unknown device kind"},
	} {
		got, err := ParseDevice(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.in, got, err, tc.want)
		}
		if back, err := ParseDevice(got.String()); err != nil || back != got {
			t.Errorf("%q does not round-trip: %q", tc.in, got.String())
		}
	}
}

func FuzzParseDevice(f *testing.F) {
	for _, s := range []string{"1:7=nvidia", "226:*=drm", "::=", "1:2=nvidia-uvm"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDevice(s)
		if err != nil {
			return
		}
		if back, err := ParseDevice(d.String()); err != nil || back != d {
			t.Errorf("%q parsed to %+v, which does not round-trip", s, d)
		}
	})
}

func TestParseProcDevices(t *testing.T) {
	in := `Character devices:
  1 mem
  4 tty
195 nvidia-frontend
226 drm
508 nvidia-uvm
509 nvidia-caps

Block devices:
195 notchar
`
	got, err := parseProcDevices(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{
		{Major: 195, Minor: 255, Kind: KindNvidiaCtl},
		{Major: 195, AnyMinor: true, Kind: KindNvidiaGPU},
		{Major: 226, AnyMinor: true, Kind: KindDRM},
		{Major: 508, AnyMinor: true, Kind: KindNvidiaUVM},
	}
	if len(got) != len(want) {
		t.Fatalf("%+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestParseLdconfig(t *testing.T) {
	out := []byte(`3 libs found in cache
	libcudart.so.12 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudart.so.12
	libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
	libcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so
`)
	got := parseLdconfig(out, IsLibcudaName)
	if len(got) != 2 || got[0] != "/usr/lib/x86_64-linux-gnu/libcuda.so.1" {
		t.Errorf("%q", got)
	}
}

// pinPathForTest makes a pin path of the test's own under bpffs (mounting
// it on a fresh host) and removes it at the test's end.
func pinPathForTest(t *testing.T) string {
	t.Helper()
	testutil.Privileged(t)
	if _, err := EnsureFilesystems(); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(BPFFSPath, "gpuarb-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func loadForTest(t *testing.T, opts Options) *Probes {
	t.Helper()
	testutil.Privileged(t)
	if _, err := EnsureFilesystems(); err != nil {
		t.Fatal(err)
	}
	p, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// gpuIoctls issues n ioctls on a private node of the given device number.
func gpuIoctls(t *testing.T, major, minor uint32, n int) {
	t.Helper()
	node := filepath.Join(t.TempDir(), "gpu")
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(node, unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for i := 0; i < n; i++ {
		_, _ = unix.IoctlGetInt(fd, uint(3<<30|8<<16|'d'<<8|0x82)) // GEM_CPU_PREP-shaped
	}
}

func TestBpftoolPrintsFieldNames(t *testing.T) {
	bpftool := testutil.Require(t, "bpftool", "apt-get install bpftool")
	dir := pinPathForTest(t)
	p := loadForTest(t, Options{PinPath: dir, Devices: []Device{{Major: 1, Minor: 11, Kind: KindDRM}}})
	gpuIoctls(t, 1, 11, 3)
	g, err := p.NewLaunchGate()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.SetMembers([]uint64{1 << 62}, nil); err != nil { // no cgroup has this id
		t.Fatal(err)
	}

	for _, tc := range []struct {
		mapName string
		fields  []string
	}{
		{"gpuarb_devices", []string{`"major"`, `"minor"`, `"kind"`}},
		{"gpuarb_cgroups", []string{`"gpu_ioctls"`, `"syncs"`, `"sync_wait_ns"`, `"bytes_alloc"`}},
		{"gpuarb_gates", []string{`"admitted"`, `"holds"`}},
		{"gpuarb_gate_keys", []string{`"id"`, `"kind"`}},
		{"gpuarb_mem_usage", []string{`"charged"`, `"kills"`, `"gen"`}},
	} {
		out, err := exec.Command(bpftool, "map", "dump", "pinned", filepath.Join(dir, tc.mapName)).CombinedOutput()
		if err != nil {
			t.Fatalf("bpftool map dump %s: %v\n%s", tc.mapName, err, out)
		}
		for _, f := range tc.fields {
			if !strings.Contains(string(out), f) {
				t.Errorf("bpftool dump of %s lacks field %s:\n%s", tc.mapName, f, out)
			}
		}
	}
	out, err := exec.Command(bpftool, "-j", "map", "dump", "pinned", filepath.Join(dir, "gpuarb_cgroups")).Output()
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Formatted struct {
			Value struct {
				GPUIoctls uint64 `json:"gpu_ioctls"`
				Syncs     uint64 `json:"syncs"`
			} `json:"value"`
		} `json:"formatted"`
	}
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("bpftool -j: %v\n%s", err, out)
	}
	var found bool
	for _, r := range rows {
		if r.Formatted.Value.GPUIoctls == 3 && r.Formatted.Value.Syncs == 3 {
			found = true
		}
	}
	if !found {
		t.Errorf("no cgroup with 3 GPU ioctls and 3 syncs in %s", out)
	}

	// Close leaves the pins for bpftool and a restarted daemon; Unpin removes them.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, m := range PinnedMaps() {
		if _, err := os.Stat(filepath.Join(dir, m)); err != nil {
			t.Errorf("pin %s gone after Close: %v", m, err)
		}
	}
	if err := p.Unpin(false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin dir still there after Unpin: %v", err)
	}
}

func TestLostEventsAreCounted(t *testing.T) {
	const issued = 500
	p := loadForTest(t, Options{RingSize: 4096, Devices: []Device{{Major: 1, Minor: 11, Kind: KindDRM}}})
	gpuIoctls(t, 1, 11, issued) // nobody reads meanwhile: the 4 KiB ring overflows

	rd, err := ringbuf.NewReader(p.EventsMap())
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	rd.SetDeadline(time.Now().Add(200 * time.Millisecond))
	// Count this test's ioctls only: exits of other processes share the ring.
	delivered := 0
	for {
		rec, err := rd.Read()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			t.Fatal(err)
		}
		var r IoctlRecord
		b, typ, major, minor := rec.RawSample, unsafe.Offsetof(r.H.Type), unsafe.Offsetof(r.DevMajor), unsafe.Offsetof(r.DevMinor)
		if len(b) >= int(unsafe.Sizeof(r)) && binary.LittleEndian.Uint32(b[typ:]) == RecordIoctl &&
			binary.LittleEndian.Uint32(b[major:]) == 1 && binary.LittleEndian.Uint32(b[minor:]) == 11 {
			delivered++
		}
	}
	lost, err := p.Lost()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d delivered, %d lost of %d", delivered, lost, issued)
	// Lost events may include other processes' exits: at least ours are lost.
	if delivered == 0 || lost == 0 || delivered+int(lost) < issued || delivered+int(lost) > issued+5 {
		t.Errorf("delivered %d + lost %d, issued %d", delivered, lost, issued)
	}
}

func TestUnknownLibcudaIsRefused(t *testing.T) {
	p := loadForTest(t, Options{})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.AttachLibcuda(self); !errors.Is(err, ErrNotLibcuda) {
		t.Errorf("attaching to a binary without cuLaunchKernel: %v, want ErrNotLibcuda", err)
	}
	if _, err := p.AttachLibcuda("/nonexistent/libcuda.so.1"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if n := len(p.Libcudas()); n != 0 {
		t.Errorf("%d libcudas attached", n)
	}
}

// TestEveryMeteredEntryPointIsProbed reads the simulated GPU's libcuda: every
// cu* function it exports must be one gpuarb knows, every one of a metered
// class must be probed, and every probed entry point must be one it exports
// (so the probes are exercised against it).
func TestEveryMeteredEntryPointIsProbed(t *testing.T) {
	exports, err := LibcudaExports(testutil.Bin(t, "libcuda.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, x := range exports {
		exported[x.Symbol] = true
		switch {
		case x.Class == "":
			t.Errorf("libcuda exports %s, which gpuarb does not know: classify it in bpf.EntryPoints", x.Symbol)
		case x.Metered && !x.Probed:
			t.Errorf("%s (%s) is metered but not probed", x.Symbol, x.Class)
		}
	}
	probed := 0
	for _, e := range EntryPoints {
		if e.Func == 0 {
			continue
		}
		probed++
		if !exported[e.Symbol] {
			t.Errorf("probed entry point %s is not exported by the simulated libcuda", e.Symbol)
		}
		if !e.Class.Metered() {
			t.Errorf("%s is probed but its class %s is not metered", e.Symbol, e.Class)
		}
	}
	if probed != int(gpuarbCudaFuncCU_FUNC_MAX)-1 {
		t.Errorf("%d entry points probed, enum cuda_func numbers %d", probed, int(gpuarbCudaFuncCU_FUNC_MAX)-1)
	}
}

// With gpuarb_held full the gate stops nobody it could not record (nothing
// would ever continue it): the launches run, counted as unrecorded.
func TestLaunchGateNeverStopsUnrecorded(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	p := loadForTest(t, Options{})
	leased(t, p)
	g, cg := gatedCgroup(t, p, "unrecorded", 2)
	filler := gpuarbHeldProc{Gate: g.Slot() + 1}
	for i := uint32(0); i < p.objs.GpuarbHeld.MaxEntries(); i++ {
		if err := p.objs.GpuarbHeld.Put(uint32(1<<30)+i, &filler); err != nil {
			t.Fatalf("fill gpuarb_held at %d: %v", i, err)
		}
	}
	w := testutil.Start(t, cg, gpu.Workload(t, "hog", "--kernel-ms", "1", "--depth", "2", "--duration", "0.3"))
	if err := w.Wait(t, 15*time.Second); err != nil {
		t.Fatalf("the workload did not finish with the held table full: %v", err)
	}
	n, err := g.Unrecorded()
	if err != nil || n == 0 {
		t.Errorf("unrecorded launches %d (%v), want > 0", n, err)
	}
	if all, err := p.UnrecordedLaunches(); err != nil || all != n {
		t.Errorf("unrecorded launches over every gate %d (%v), want %d", all, err, n)
	}
	if held, err := g.Held(); err != nil || len(held) != 0 {
		t.Errorf("held %v (%v), want none", held, err)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, mode); err != nil {
		t.Fatal(err)
	}
}

// A followed process's double fork (a subshell that starts a process in
// the background and exits, leaving it to init) does not take the
// grandchild out of the tree: the fork probe follows it for the same
// root, though /proc shows it below the root no more, and it leaves at
// its exit.
func TestFollowedTreeKeepsDoubleForks(t *testing.T) {
	p := loadForTest(t, Options{})
	pidFile := filepath.Join(t.TempDir(), "grandchild")
	root := testutil.Start(t, nil, exec.Command("sh", "-c",
		`sleep 0.3; (sh -c 'echo $$ > `+pidFile+`; exec sleep 30' &); exec sleep 30`))
	rootPID := root.Cmd.Process.Pid
	if err := p.Follow(rootPID, []int{rootPID}); err != nil {
		t.Fatal(err)
	}
	grandchild := testutil.ReadPIDFile(t, pidFile, 5*time.Second)
	exited := false
	t.Cleanup(func() {
		if !exited { // by pid, while it is still ours: it was not seen to exit
			_ = unix.Kill(grandchild, syscall.SIGKILL)
		}
	})
	if ppid := parentOf(t, grandchild); ppid == rootPID {
		t.Fatalf("the grandchild's parent is the root: no double fork")
	}
	trees, err := p.Trees()
	if err != nil {
		t.Fatal(err)
	}
	followed := trees[rootPID]
	slices.Sort(followed)
	if !slices.Contains(followed, rootPID) || !slices.Contains(followed, grandchild) || len(followed) != 2 {
		t.Errorf("followed for %d: %v, want the root and the reparented grandchild %d (the exited subshell gone)", rootPID, followed, grandchild)
	}
	if err := unix.Kill(grandchild, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if trees, _ = p.Trees(); !slices.Contains(trees[rootPID], grandchild) {
			exited = true
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %d still followed after its exit: %v", grandchild, trees[rootPID])
		}
	}
	if err := p.Unfollow(rootPID); err != nil {
		t.Fatal(err)
	}
	if trees, err = p.Trees(); err != nil || len(trees[rootPID]) != 0 {
		t.Errorf("followed after Unfollow: %v (%v)", trees[rootPID], err)
	}
	if n, err := p.UnfollowedForks(); err != nil || n != 0 {
		t.Errorf("unfollowed forks %d (%v), want 0", n, err)
	}
}

// parentOf reads a process's parent pid from /proc.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// The slot tables are sized as the sizes Go reads from the object's enum:
// the gate tables by GATE_SLOTS, the memory limits by MEM_SLOTS.
func TestSlotTablesMatchTheObject(t *testing.T) {
	spec, err := loadGpuarb()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"gpuarb_gates": GateSlots, "gpuarb_gate_allow": GateSlots,
		"gpuarb_mem_limit": MemorySlots, "gpuarb_mem_usage": MemorySlots} {
		if n := spec.Maps[name].MaxEntries; int(n) != want {
			t.Errorf("%s holds %d slots, want %d", name, n, want)
		}
	}
}

// Issue 56, item 13: a thread killed inside a probed call never reaches
// its return probe and leaves its in-flight entry behind. With the table
// full of such entries (8192 of them) a process's syncs are still
// metered: the table evicts the oldest instead of refusing new calls,
// which stopped syncs, contexts and allocations being metered host-wide.
func TestLeftInFlightCallsDoNotStopMetering(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	p := loadForTest(t, Options{})
	if _, err := p.AttachLibcuda(testutil.Bin(t, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	for i := uint32(0); i < p.objs.GpuarbPendCu.MaxEntries(); i++ {
		k := gpuarbCudaKey{PidTgid: uint64(1<<22+i) << 32, Func: uint32(gpuarbCudaFuncCU_STREAM_SYNC)}
		if err := p.objs.GpuarbPendCu.Put(k, gpuarbCudaStash{Ts: 1}); err != nil {
			t.Fatalf("fill the in-flight calls at %d: %v", i, err)
		}
	}
	cg := testutil.NewCgroup(t, "syncs")
	w := testutil.Start(t, cg, gpu.Workload(t, "loop", "--kernels-ms", "0.2", "--sync-every", "1", "--duration", "0.3"))
	if err := w.Wait(t, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	stats, err := p.Cgroups()
	if err != nil {
		t.Fatal(err)
	}
	if n := stats[cg.ID].Syncs; n < 100 {
		t.Errorf("%d syncs metered with the in-flight table full of abandoned calls, want ≥ 100 of ~1000", n)
	}
}
