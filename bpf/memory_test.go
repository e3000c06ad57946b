package bpf

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/internal/testutil"
)

const mib = 1 << 20

// startRawAllocator starts testdata/rawalloc.c in cg: count allocations of
// step bytes through mode (rmalloc, xfer or vidheap) on node, no libcuda.
func startRawAllocator(t *testing.T, exe, node string, cg *testutil.Cgroup, mode string, step uint64, count int) *testutil.Allocator {
	t.Helper()
	return testutil.StartAllocator(t, cg, exec.Command(exe, node, mode, strconv.FormatUint(step, 10), strconv.Itoa(count)))
}

// A limited tenant's process is killed at the allocation that would take
// the tenant past its limit, whether it allocates by RM_ALLOC, by
// RM_ALLOC in IOCTL_XFER_CMD or by RM_VID_HEAP_CONTROL, with no libcuda;
// the tenant's other process and an unlimited neighbour keep their
// memory; an exit, a free and the free of the device the memory was
// allocated under uncharge.
func TestMemoryLimitKillsAtTheAllocationPastIt(t *testing.T) {
	// The simulated GPU's control node: a character device of the mem
	// driver, on which every ioctl fails with ENOTTY.
	p := loadForTest(t, Options{Devices: []Device{{Major: 1, Minor: 7, Kind: KindNvidiaCtl}}})
	node := filepath.Join(t.TempDir(), "nvidiactl")
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	exe := testutil.BuildC(t, "rawalloc")
	for _, mode := range []string{"rmalloc", "xfer", "vidheap"} {
		t.Run(mode, func(t *testing.T) {
			limited, neighbour := testutil.NewCgroup(t, "mem-limited"), testutil.NewCgroup(t, "mem-neighbour")
			l, err := p.NewMemoryLimit()
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := l.SetMembers([]uint64{limited.ID}, nil); err != nil {
				t.Fatal(err)
			}
			if err := l.SetLimit(1<<30, 0); err != nil {
				t.Fatal(err)
			}
			keeper := startRawAllocator(t, exe, node, limited, mode, 256*mib, 1)
			if !keeper.Until(t, "done") {
				t.Fatal("the tenant's 256 MiB process did not finish allocating")
			}
			grower := startRawAllocator(t, exe, node, limited, mode, 128*mib, 16)
			grower.KilledHolding(t, 768*mib, "the growing process under 1 GiB beside 256 MiB")
			other := startRawAllocator(t, exe, node, neighbour, mode, 1<<30, 3)
			if !other.Until(t, "done") {
				t.Fatal("the unlimited neighbour did not allocate its 3 GiB")
			}
			u, err := l.Usage()
			if err != nil {
				t.Fatal(err)
			}
			if u.Kills[0] != 1 || len(u.Kills) != 1 || u.Charged[0] != 256*mib || len(u.Charged) != 1 {
				t.Errorf("usage %+v: want 1 kill and the keeper's 256 MiB on GPU 0 (the killed process uncharged at exit)", u)
			}
			free := "free\n"
			if mode == "xfer" {
				free = "freedev\n" // the device's free frees its memory
			}
			if _, err := io.WriteString(keeper.In, free); err != nil {
				t.Fatal(err)
			}
			if !keeper.Until(t, "freed") {
				t.Fatal("the keeper did not free")
			}
			if u, err := l.Usage(); err != nil || len(u.Charged) != 0 {
				t.Errorf("usage after the keeper's %q: %+v (%v), want nothing charged", strings.TrimSpace(free), u, err)
			}
			// Allocated again under its device, and freed: a free after the
			// device's is not uncharged twice.
			again := startRawAllocator(t, exe, node, limited, mode, 512*mib, 1)
			if !again.Until(t, "done") {
				t.Fatal("512 MiB within the limit, after the frees, was refused")
			}
			if u, err := l.Usage(); err != nil || u.Charged[0] != 512*mib {
				t.Errorf("usage with 512 MiB allocated: %+v (%v)", u, err)
			}
			if err := keeper.Cmd.Process.Signal(syscall.Signal(0)); err != nil {
				t.Errorf("the keeper is gone: %v", err)
			}
		})
	}
}

// A limit given as a share of the GPU's memory holds against the size the
// daemon set for that GPU: nothing before it is set, the share of it after;
// where a limit has a share and an amount, the lower holds; the default
// limit takes a share as well.
func TestMemoryLimitAsAShareOfTheGPU(t *testing.T) {
	p := loadForTest(t, Options{Devices: []Device{{Major: 1, Minor: 7, Kind: KindNvidiaCtl}}})
	t.Cleanup(func() { p.SetGPUMemorySize(0, 0) })
	node := filepath.Join(t.TempDir(), "nvidiactl")
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	exe := testutil.BuildC(t, "rawalloc")
	cg := testutil.NewCgroup(t, "mem-share")
	l, err := p.NewMemoryLimit()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := errors.Join(l.SetMembers([]uint64{cg.ID}, nil), l.SetLimit(0, 0.25)); err != nil {
		t.Fatal(err)
	}
	early := startRawAllocator(t, exe, node, cg, "rmalloc", 512*mib, 3)
	if !early.Until(t, "done") {
		t.Fatal("1.5 GiB under a 25% share was refused before the GPU's size was set")
	}
	if _, err := io.WriteString(early.In, "free\n"); err != nil || !early.Until(t, "freed") {
		t.Fatalf("the early process did not free: %v", err)
	}
	// grow allocates 128 MiB at a time towards 4 GiB.
	grow := func(cg *testutil.Cgroup) *testutil.Allocator {
		return startRawAllocator(t, exe, node, cg, "rmalloc", 128*mib, 32)
	}
	if err := p.SetGPUMemorySize(0, 4<<30); err != nil {
		t.Fatal(err)
	}
	grow(cg).KilledHolding(t, 1<<30, "a process under 25% of a 4 GiB GPU")
	if err := l.SetLimit(768*mib, 0.25); err != nil {
		t.Fatal(err)
	}
	grow(cg).KilledHolding(t, 768*mib, "a process under 25% up to 768 MiB")
	if err := l.SetLimit(3<<30, 0.5); err != nil {
		t.Fatal(err)
	}
	grow(cg).KilledHolding(t, 2<<30, "a process under 50% (2 GiB) up to 3 GiB")
	if u, err := l.Usage(); err != nil || u.Kills[0] != 3 || len(u.Charged) != 0 {
		t.Errorf("usage %+v (%v): want 3 kills and nothing charged", u, err)
	}
	other := testutil.NewCgroup(t, "mem-share-default")
	if err := p.SetDefaultMemoryLimit(0, 0.125); err != nil {
		t.Fatal(err)
	}
	defer p.SetDefaultMemoryLimit(0, 0)
	grow(other).KilledHolding(t, 512*mib, "a process under a default of 12.5% of a 4 GiB GPU")
	if err := l.SetLimit(0, 1.5); err == nil {
		t.Error("a share of 150% was set")
	}
}

// The default limit holds every process no slot holds, by its own cgroup:
// two processes of one cgroup share it, another cgroup has its own, and a
// cgroup that a slot holds is held by the slot's limit alone.
func TestDefaultMemoryLimitHoldsEachCgroup(t *testing.T) {
	p := loadForTest(t, Options{Devices: []Device{{Major: 1, Minor: 7, Kind: KindNvidiaCtl}}})
	node := filepath.Join(t.TempDir(), "nvidiactl")
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	exe := testutil.BuildC(t, "rawalloc")
	a, b, slotted := testutil.NewCgroup(t, "mem-default-a"), testutil.NewCgroup(t, "mem-default-b"), testutil.NewCgroup(t, "mem-slotted")
	if err := p.SetDefaultMemoryLimit(1<<30, 0); err != nil {
		t.Fatal(err)
	}
	defer p.SetDefaultMemoryLimit(0, 0)
	l, err := p.NewMemoryLimit()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.SetMembers([]uint64{slotted.ID}, nil); err != nil {
		t.Fatal(err)
	}
	if err := l.SetLimit(4<<30, 0); err != nil {
		t.Fatal(err)
	}
	first := startRawAllocator(t, exe, node, a, "rmalloc", 512*mib, 1)
	if !first.Until(t, "done") {
		t.Fatal("512 MiB under a 1 GiB default limit was refused")
	}
	second := startRawAllocator(t, exe, node, a, "rmalloc", 256*mib, 4)
	if second.Until(t, "done") || second.Held != 512*mib {
		t.Errorf("a second process of the cgroup held %d MiB, want killed at 512 (the cgroup's 1 GiB less the first's 512)", second.Held/mib)
	}
	other := startRawAllocator(t, exe, node, b, "rmalloc", 256*mib, 4)
	big := startRawAllocator(t, exe, node, slotted, "rmalloc", 1<<30, 3)
	if !other.Until(t, "done") || !big.Until(t, "done") {
		t.Fatalf("another cgroup's 1 GiB (held %d MiB) or the slotted cgroup's 3 GiB under its 4 GiB (held %d MiB) was refused",
			other.Held/mib, big.Held/mib)
	}
	usage, err := p.DefaultMemoryUsage()
	if err != nil {
		t.Fatal(err)
	}
	if ua, ub := usage[a.ID], usage[b.ID]; ua.Charged[0] != 512*mib || ua.Kills[0] != 1 || ub.Charged[0] != 1<<30 || ub.Kills[0] != 0 {
		t.Errorf("default charges: %s %+v, %s %+v; want 512 MiB and a kill, 1 GiB and none", a.Rel, ua, b.Rel, ub)
	}
	if _, ok := usage[slotted.ID]; ok {
		t.Errorf("the slotted cgroup was charged under the default limit too: %+v", usage[slotted.ID])
	}
	if err := p.ForgetMemoryCgroups(func(id uint64) bool { return id == b.ID }); err != nil {
		t.Fatal(err)
	}
	if usage, err := p.DefaultMemoryUsage(); err != nil || len(usage) != 1 {
		t.Errorf("after forgetting %s: %v (%v), want %s's alone", b.Rel, usage, err, a.Rel)
	}
}

// A limit and its charges outlive the probes in the pins: a new load holds
// the slot over with its members and limit, a tenant with its members
// adopts it with what its running processes hold (freeing memory charged
// before the load uncharges it), what a process that exited between the
// loads held is uncharged, and the limit still kills at the allocation
// past it.
func TestMemoryChargesCarryAcrossALoad(t *testing.T) {
	dir := pinPathForTest(t)
	opts := Options{PinPath: dir, Devices: []Device{{Major: 1, Minor: 7, Kind: KindNvidiaCtl}}}
	node := filepath.Join(t.TempDir(), "nvidiactl")
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	exe := testutil.BuildC(t, "rawalloc")
	limited, other := testutil.NewCgroup(t, "mem-carried"), testutil.NewCgroup(t, "mem-other")

	first, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	l, err := first.NewMemoryLimit()
	if err != nil {
		first.Close()
		t.Fatal(err)
	}
	if err := errors.Join(l.SetMembers([]uint64{limited.ID}, nil), l.SetLimit(1<<30, 0)); err != nil {
		first.Close()
		t.Fatal(err)
	}
	keeper := startRawAllocator(t, exe, node, limited, "rmalloc", 256*mib, 1)
	leaver := startRawAllocator(t, exe, node, limited, "rmalloc", 256*mib, 1)
	if !keeper.Until(t, "done") || !leaver.Until(t, "done") {
		first.Close()
		t.Fatal("the tenant's processes did not allocate")
	}
	if !first.HoldsMemory() {
		t.Error("HoldsMemory is false with 512 MiB charged")
	}
	slot := l.Slot()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	// No probes: the leaver's exit is not seen.
	leaver.In.Close()
	if err := leaver.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("the leaver: %v", err)
	}
	// A charge with no process's entry behind it (an older gpuarb's, whose
	// process tables were not pinned) is not carried.
	usage, err := ebpf.LoadPinnedMap(filepath.Join(dir, memUsageMap), nil)
	if err != nil {
		t.Fatal(err)
	}
	var u gpuarbMemUsage
	err = usage.Lookup(slot, &u)
	u.Charged[3] = 1 << 30
	if err := errors.Join(err, usage.Put(slot, u), usage.Close()); err != nil {
		t.Fatal(err)
	}

	second := loadForTest(t, opts)
	if got := second.AdoptMemoryLimit([]uint64{other.ID}, nil); got != nil {
		t.Errorf("a tenant of other members adopted slot %d", got.Slot())
	}
	adopted := second.AdoptMemoryLimit([]uint64{limited.ID}, nil)
	if adopted == nil || adopted.Slot() != slot {
		t.Fatalf("adopted %v, want the slot %d held over", adopted, slot)
	}
	if u, err := adopted.Usage(); err != nil || u.Charged[0] != 256*mib || len(u.Charged) != 1 {
		t.Errorf("usage after the load %+v (%v): want the keeper's 256 MiB on GPU 0 (the leaver's uncharged at the load, GPU 3's without a process)", u, err)
	}
	if fresh, err := second.NewMemoryLimit(); err != nil || fresh.Slot() == slot {
		t.Errorf("a new limit took slot %v (%v) while it was adopted", fresh, err)
	} else {
		fresh.Close()
	}
	grower := startRawAllocator(t, exe, node, limited, "rmalloc", 128*mib, 16)
	grower.KilledHolding(t, 768*mib, "the growing process under the carried 1 GiB limit beside the keeper's 256 MiB")
	if _, err := io.WriteString(keeper.In, "free\n"); err != nil {
		t.Fatal(err)
	}
	if !keeper.Until(t, "freed") {
		t.Fatal("the keeper did not free")
	}
	if u, err := adopted.Usage(); err != nil || len(u.Charged) != 0 || u.Kills[0] != 1 {
		t.Errorf("usage after the keeper freed what it allocated before the load: %+v (%v), want nothing charged, one kill", u, err)
	}
	if err := errors.Join(second.ReleaseHeldOverMemoryLimits(), adopted.Close()); err != nil {
		t.Error(err)
	}
}

// A new load releases what it does not adopt: the held-over slot's
// members go, its limit is lifted, and the slot is free again.
func TestHeldOverMemoryLimitReleased(t *testing.T) {
	dir := pinPathForTest(t)
	cg := testutil.NewCgroup(t, "mem-released")
	first, err := Load(Options{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	l, err := first.NewMemoryLimit()
	if err == nil {
		err = errors.Join(l.SetMembers([]uint64{cg.ID}, []int{os.Getpid()}), l.SetLimit(1<<30, 0))
	}
	if err := errors.Join(err, first.Close()); err != nil {
		t.Fatal(err)
	}
	second := loadForTest(t, Options{PinPath: dir})
	var members uint32
	if err := second.objs.MemMembers.Get(&members); err != nil || members != 2 {
		t.Errorf("mem_members %d (%v) after the load, want the 2 held over", members, err)
	}
	if err := second.ReleaseHeldOverMemoryLimits(); err != nil {
		t.Fatal(err)
	}
	if err := second.objs.MemMembers.Get(&members); err != nil || members != 0 {
		t.Errorf("mem_members %d (%v) after the release, want 0", members, err)
	}
	var limit uint64
	if err := second.objs.GpuarbMemLimit.Lookup(l.Slot(), &limit); err != nil || limit != 0 {
		t.Errorf("slot %d's limit %d (%v) after the release, want none", l.Slot(), limit, err)
	}
	if got := second.AdoptMemoryLimit([]uint64{cg.ID}, nil); got != nil {
		t.Errorf("slot %d adopted after the release", got.Slot())
	}
}
