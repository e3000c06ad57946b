package ioctlspy_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/ioctlspy"
)

// benchDevice is the device number the ioctl benchmarks use: /dev/kmsg's,
// on which nothing else issues ioctls.
const benchMajor, benchMinor = 1, 11

// rmAlloc prepares an nvidia RM_ALLOC of a TSG (NVOS21 + params) in memory
// outside the Go heap.
func rmAlloc() (cmd uint32, arg uint64) {
	a := newArena()
	params := a.put(le(0, 0, 0x5c000005, 1, 0))
	return ioc(3, 'F', 0x2B, 32), a.put(le(0xc1d00001, 0x5c000002, 0x5c000010, 0xA06C, params, 20, 0))
}

// vidmemAlloc prepares an nvidia RM_ALLOC of 2 MiB of device memory (NVOS64
// of NV01_MEMORY_LOCAL_USER, its 128-byte params with the size at 64) in
// memory outside the Go heap.
func vidmemAlloc() (cmd uint32, arg uint64) {
	a := newArena()
	params := make([]byte, 128)
	copy(params[64:], le(uint64(2<<20)))
	p := a.put(params)
	return ioc(3, 'F', 0x2B, 48), a.put(le(0xc1d00001, 0x5c000002, 0x5c000030, 0x40, p, uint64(0), 0, 0, 0, 0))
}

// loadDraining loads the probes with devices and a Spy that decodes and
// drops every event, as the daemon's reader does.
func loadDraining(b *testing.B, devices []bpf.Device) *ioctlspy.Spy {
	b.Helper()
	testutil.Privileged(b)
	if _, err := bpf.EnsureFilesystems(); err != nil {
		b.Fatal(err)
	}
	probes, err := bpf.Load(bpf.Options{Devices: devices})
	if err != nil {
		b.Fatal(err)
	}
	spy, err := ioctlspy.NewSpy(probes)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		spy.Run(ctx, func(ioctlspy.Event) {})
		close(done)
	}()
	b.Cleanup(func() {
		cancel()
		<-done
		spy.Close()
		probes.Close()
	})
	return spy
}

// BenchmarkIoctl measures one ioctl carrying an RM_ALLOC of a channel
// group: with no probes (baseline), with probes loaded on a device not in
// the table (non-GPU: the cost every ioctl on the host pays) and on a
// device in the table (GPU: decoded, sent to the ring buffer, read and
// decoded in Go). The memory cases carry an RM_ALLOC of device memory:
// without probes, with them (its size read at entry and exit, its GPU
// looked up), and with the process under a GPU memory limit (charged).
func BenchmarkIoctl(b *testing.B) {
	gpu := []bpf.Device{{Major: benchMajor, Minor: benchMinor, Kind: bpf.KindNvidiaCtl}}
	for _, tc := range []struct {
		name    string
		probes  bool
		devices []bpf.Device
		memory  bool
		limited bool
	}{
		{"baseline", false, nil, false, false},
		{"non-gpu", true, []bpf.Device{{Major: 1, Minor: 7, Kind: bpf.KindNvidiaCtl}}, false, false},
		{"gpu", true, gpu, false, false},
		{"memory-baseline", false, nil, true, false},
		{"memory", true, gpu, true, false},
		{"memory-limited", true, gpu, true, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			testutil.Privileged(b)
			if tc.probes {
				spy := loadDraining(b, tc.devices)
				if tc.limited {
					l, err := spy.Probes().NewMemoryLimit()
					if err != nil {
						b.Fatal(err)
					}
					defer l.Close()
					if err := l.SetMembers(nil, []int{os.Getpid()}); err != nil {
						b.Fatal(err)
					}
					if err := l.SetLimit(1<<62, 0); err != nil {
						b.Fatal(err)
					}
				}
			}
			node := filepath.Join(b.TempDir(), "dev")
			if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(benchMajor, benchMinor))); err != nil {
				b.Fatal(err)
			}
			fd, err := unix.Open(node, unix.O_RDWR, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer unix.Close(fd)
			cmd, arg := rmAlloc()
			if tc.memory {
				cmd, arg = vidmemAlloc()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(cmd), uintptr(arg))
			}
		})
	}
}

// BenchmarkMmap measures an mmap of one page and its munmap: with no
// probes (baseline), with probes loaded (anon: what every mapping on the
// host pays), from a process that has a managed range (anon-of-managed:
// its munmaps are recorded) and of a nvidia-uvm node (managed: both
// recorded). The uvm node is the zero device's number, as the simulator's.
func BenchmarkMmap(b *testing.B) {
	uvm := []bpf.Device{{Major: 1, Minor: 5, Kind: bpf.KindNvidiaUVM}}
	for _, tc := range []struct {
		name            string
		probes, managed bool
		ofNode          bool
	}{
		{"baseline", false, false, false},
		{"anon", true, false, false},
		{"anon-of-managed", true, true, false},
		{"managed", true, true, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			testutil.Privileged(b)
			if tc.probes {
				loadDraining(b, uvm)
			}
			node := filepath.Join(b.TempDir(), "uvm")
			if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 5))); err != nil {
				b.Fatal(err)
			}
			fd, err := unix.Open(node, unix.O_RDWR, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer unix.Close(fd)
			if tc.managed { // the process has a managed range from now on
				if _, err := unix.Mmap(fd, 0, 1<<20, unix.PROT_READ, unix.MAP_SHARED); err != nil {
					b.Fatal(err)
				}
			}
			mapFD, flags := -1, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS
			if tc.ofNode {
				mapFD, flags = fd, unix.MAP_SHARED
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				addr, _, errno := unix.Syscall6(unix.SYS_MMAP, 0, 4096, unix.PROT_READ, uintptr(flags), uintptr(mapFD), 0)
				if errno != 0 {
					b.Fatal(errno)
				}
				unix.Syscall(unix.SYS_MUNMAP, addr, 4096, 0)
			}
		})
	}
}

// BenchmarkUprobeHit measures a call of cuLaunchKernel in the simulator's
// libcuda with and without the uprobe (a C loop; ns per call reported).
func BenchmarkUprobeHit(b *testing.B) {
	testutil.Privileged(b)
	lib := testutil.Bin(b, "libcuda.so.1")
	exe := filepath.Join(b.TempDir(), "uprobe_bench")
	if out, err := exec.Command("cc", "-O2", "-o", exe, "testdata/uprobe_bench.c", "-L"+filepath.Dir(lib),
		"-l:libcuda.so.1", "-Wl,-rpath,"+filepath.Dir(lib)).CombinedOutput(); err != nil {
		b.Fatalf("%v\n%s", err, out)
	}
	run := func(b *testing.B) {
		var total float64
		for i := 0; i < b.N; i++ {
			out, err := exec.Command(exe, "20000").Output()
			if err != nil {
				b.Fatal(err)
			}
			ns, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
			if err != nil {
				b.Fatal(err)
			}
			total += ns
		}
		b.ReportMetric(total/float64(b.N), "ns/call")
	}
	b.Run("baseline", run)
	b.Run("probed", func(b *testing.B) {
		if _, err := loadDraining(b, nil).Probes().AttachLibcuda(lib); err != nil {
			b.Fatal(err)
		}
		run(b)
	})
}

// BenchmarkReaderCPU runs a helper process issuing GPU ioctls at 100k/s and
// reports the CPU the reading and decoding process spends, in % of a core.
func BenchmarkReaderCPU(b *testing.B) {
	const rate, seconds = 100000, 2
	spy := loadDraining(b, []bpf.Device{{Major: benchMajor, Minor: benchMinor, Kind: bpf.KindNvidiaCtl}})
	node := filepath.Join(b.TempDir(), "dev")
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(benchMajor, benchMinor))); err != nil {
		b.Fatal(err)
	}
	var cpu, events float64
	for i := 0; i < b.N; i++ {
		before, _ := spy.Counts()
		var r0, r1 syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
		start := time.Now()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=flood", "NV_NODE="+node,
			"FLOOD_RATE="+strconv.Itoa(rate), "FLOOD_SECONDS="+strconv.Itoa(seconds))
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("flood: %v %s", err, out)
		}
		time.Sleep(50 * time.Millisecond) // let the reader drain
		syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
		wall := time.Since(start).Seconds()
		after, _ := spy.Counts()
		used := time.Duration(r1.Utime.Nano() + r1.Stime.Nano() - r0.Utime.Nano() - r0.Stime.Nano())
		cpu += 100 * used.Seconds() / wall
		events += float64(after-before) / wall
	}
	b.ReportMetric(cpu/float64(b.N), "%cpu")
	b.ReportMetric(events/float64(b.N), "events/s")
}
