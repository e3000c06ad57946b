package e2e

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

const mib = 1 << 20

// startAllocator starts gpuwork alloc in cg: count allocations of stepMiB
// MiB through libcuda, held for a minute.
func startAllocator(t *testing.T, gpu *testutil.FakeGPU, cg *testutil.Cgroup, stepMiB, count int, env ...string) *testutil.Allocator {
	t.Helper()
	cmd := gpu.Workload(t, "alloc", "--step-mib", strconv.Itoa(stepMiB), "--count", strconv.Itoa(count), "--duration", "60")
	cmd.Env = append(cmd.Env, env...)
	return testutil.StartAllocator(t, cg, cmd)
}

// Issue 59's first bar, through libcuda's allocations (RM_ALLOC, and
// RM_VID_HEAP_CONTROL with FAKEGPU_ALLOC=vidheap): a tenant attached with
// --memory-limit 1GiB, one of whose processes holds 256 MiB, has its
// other process killed at the allocation that would take it past 1 GiB,
// having held 768 MiB; the first process and an unlimited neighbour
// holding 3 GiB keep running and keep their memory; status shows one OOM
// kill for the tenant and none for the neighbour, and each one's memory
// as the simulated GPU holds it.
func TestGPUMemoryLimitKillsTheAllocationPastIt(t *testing.T) {
	for _, mode := range []string{"rmalloc", "vidheap"} {
		t.Run(mode, func(t *testing.T) {
			gpu := testutil.StartFakeGPU(t)
			d := startDaemon(t, gpu)
			limited, neighbour := testutil.NewCgroup(t, "mem-limited"), testutil.NewCgroup(t, "mem-neighbour")
			out, err := exec.Command(testutil.Bin(t, "gpuarb"), "attach", "--socket", d.Socket, "--cgroup", limited.Rel,
				"--name", "limited", "--memory-limit", "1GiB").CombinedOutput()
			if err != nil {
				t.Fatalf("attach --memory-limit 1GiB: %v\n%s", err, out)
			}
			env := []string{"FAKEGPU_ALLOC=" + mode}
			keeper := startAllocator(t, gpu, limited, 256, 1, env...)
			if !keeper.Until(t, "done") {
				t.Fatal("the tenant's 256 MiB process did not finish allocating")
			}
			grower := startAllocator(t, gpu, limited, 128, 16, env...)
			grower.KilledHolding(t, 768*mib, "the growing process under 1 GiB beside 256 MiB")
			other := startAllocator(t, gpu, neighbour, 1024, 3, env...)
			if !other.Until(t, "done") {
				t.Fatal("the unlimited neighbour did not allocate its 3 GiB")
			}

			want := map[string]uint64{limited.Rel: 256 * mib, neighbour.Rel: 3 << 30}
			truth, err := gpu.Stats(false)
			if err != nil {
				t.Fatal(err)
			}
			held := map[string]uint64{}
			for _, c := range truth.GPUs[0].Contexts {
				if c.Alive {
					held[c.Cgroup] += c.MemBytes
				}
			}
			for cg, b := range want {
				if held[cg] != b {
					t.Errorf("the simulated GPU holds %d MiB for %s, want %d", held[cg]/mib, cg, b/mib)
				}
			}
			var rows map[string]api.Tenant
			deadline := time.Now().Add(5 * time.Second)
			for {
				st, err := d.Client.Status(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				rows = map[string]api.Tenant{}
				for _, r := range st.Tenants {
					rows[r.Cgroup] = r
				}
				l, n := rows[limited.Rel], rows[neighbour.Rel]
				if l.MemBytes == want[limited.Rel] && n.MemBytes == want[neighbour.Rel] && l.OOMKills == 1 || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			l, n := rows[limited.Rel], rows[neighbour.Rel]
			if l.Name != "limited" || l.MemBytes != 256*mib || l.MemoryLimit != 1<<30 || l.OOMKills != 1 {
				t.Errorf("the limited tenant in status: %s, %d MiB, limit %d MiB, %d OOM kills; want limited, 256, 1024, 1",
					l.Name, l.MemBytes/mib, l.MemoryLimit/mib, l.OOMKills)
			}
			if n.MemBytes != 3<<30 || n.MemoryLimit != 0 || n.OOMKills != 0 {
				t.Errorf("the neighbour in status: %d MiB, limit %d, %d OOM kills; want 3072, none, 0", n.MemBytes/mib, n.MemoryLimit, n.OOMKills)
			}
			for _, a := range []*testutil.Allocator{keeper, other} {
				if a.Done() {
					t.Errorf("pid %d, which stayed within its limit or had none, is gone", a.Cmd.Process.Pid)
				}
			}
			_, log := d.Proc.Output()
			if !strings.Contains(log, "process killed at an allocation past it") || !strings.Contains(log, "tenant=limited") ||
				!strings.Contains(log, "bytes=134217728 charged=1073741824 limit=1073741824") {
				t.Errorf("the daemon's log lacks the kill with its tenant, size, charge and limit:\n%s", log)
			}
			top, err := exec.Command(testutil.Bin(t, "gpuarb"), "top", "--once", "--socket", d.Socket).Output()
			if err != nil || !strings.Contains(string(top), "256/1024") {
				t.Errorf("top --once does not show the limited tenant's 256/1024 MiB (%v):\n%s", err, top)
			}
		})
	}
}

// Issue 59's accuracy bar: the device memory gpuarb charges each tenant on
// each GPU is the simulated GPU's own figure less its contexts' baseline
// (the driver's buffers, which no RM memory allocation shows), within 1%,
// under a caching allocator that empties its cache at an OOM, a KV cache
// sized from the GPU's memory, a stream-ordered pool that keeps freed
// blocks until a sync, and a tenant of two processes on two GPUs; pinned
// host memory is reported apart and charged nothing. The driver's own
// figure beside it (GET_PID_INFO, read through a tenant's control file) is
// the simulated GPU's whole, the baseline included. Both in each actuator
// mode: the driver is asked with steering off too.
func TestGPUMemoryChargedAsTheDriverHoldsIt(t *testing.T) {
	for _, mode := range actuatorModes {
		t.Run(mode.name, func(t *testing.T) { memoryChargedAsTheDriverHoldsIt(t, mode.args) })
	}
}

func memoryChargedAsTheDriverHoldsIt(t *testing.T, daemonArgs []string) {
	const ctxMemory = 32 * mib
	gpu := testutil.StartFakeGPU(t, "--gpus", "2", "--memory", strconv.Itoa(4<<30), "--ctx-memory", strconv.Itoa(ctxMemory))
	d := startDaemon(t, gpu, daemonArgs...)
	type run struct {
		cg   *testutil.Cgroup
		args []string
	}
	runs := map[string][]run{}
	for name, args := range map[string][][]string{
		"pool":  {{"--pattern", "pool", "--count", "10"}},
		"multi": {{"--step-mib", "100", "--count", "3"}, {"--step-mib", "3", "--count", "5", "--gpu", "1"}},
		"vllm":  {{"--pattern", "vllm", "--step-mib", "256", "--count", "2", "--gpu", "1"}},
		"torch": {{"--pattern", "torch", "--count", "400"}},
		"host":  {{"--pattern", "host", "--step-mib", "8", "--count", "3"}},
	} {
		cg := testutil.NewCgroup(t, "mem-"+name)
		for _, a := range args {
			runs[name] = append(runs[name], run{cg, a})
		}
	}
	for _, name := range []string{"host", "pool", "multi", "vllm", "torch"} { // torch last: it grows until the GPU is full
		for _, r := range runs[name] {
			cmd := gpu.Workload(t, append([]string{"alloc", "--duration", "60"}, r.args...)...)
			a := testutil.StartAllocator(t, r.cg, cmd)
			if name == "torch" && !a.Until(t, "oom") {
				t.Fatal("the caching allocator never met an OOM: the GPU's refusal is not exercised")
			}
			if !a.Until(t, "done") {
				_, stderr := a.Output()
				t.Fatalf("%s %v did not finish allocating: %s", name, r.args, stderr)
			}
		}
	}
	type key struct {
		cgroup string
		gpu    int
	}
	var got, want, host, driver, device map[key]uint64
	deadline := time.Now().Add(5 * time.Second)
	for {
		truth, err := gpu.Stats(false)
		if err != nil {
			t.Fatal(err)
		}
		want, device = map[key]uint64{}, map[key]uint64{}
		for _, g := range truth.GPUs {
			for _, c := range g.Contexts {
				if c.Alive {
					want[key{c.Cgroup, g.Index}] += c.MemBytes - ctxMemory
					device[key{c.Cgroup, g.Index}] += c.MemBytes
				}
			}
		}
		st, err := d.Client.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got, host, driver = map[key]uint64{}, map[key]uint64{}, map[key]uint64{}
		for _, r := range st.Tenants {
			got[key{r.Cgroup, r.GPU}] = r.MemBytes
			host[key{r.Cgroup, r.GPU}] = r.HostMemBytes
			if r.DriverMemBytes != nil {
				driver[key{r.Cgroup, r.GPU}] = *r.DriverMemBytes
			}
		}
		off := 0
		for k, w := range want {
			if diff := float64(got[k]) - float64(w); diff > 0.01*float64(w) || -diff > 0.01*float64(w) || driver[k] != device[k] {
				off++
			}
		}
		if off == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(want) != 6 {
		t.Errorf("the simulated GPU has contexts of %d tenant-GPU pairs, want 6: %v", len(want), want)
	}
	hostKey := key{runs["host"][0].cg.Rel, 0}
	if h := host[hostKey]; h != 24*mib || len(slices.DeleteFunc(slices.Collect(maps.Values(host)), func(b uint64) bool { return b == 0 })) != 1 {
		t.Errorf("pinned host memory %v, want 24 MiB for %s alone", host, hostKey.cgroup)
	}
	for k, w := range want {
		g := got[k]
		t.Logf("%s GPU %d: gpuarb %.1f MiB, the simulated GPU %.1f MiB less its contexts' baseline; the driver's figure %.1f MiB, the simulated GPU's %.1f MiB",
			k.cgroup, k.gpu, float64(g)/mib, float64(w)/mib, float64(driver[k])/mib, float64(device[k])/mib)
		if diff := float64(g) - float64(w); diff > 0.01*float64(w) || -diff > 0.01*float64(w) {
			t.Errorf("%s GPU %d: gpuarb charges %d B, the simulated GPU holds %d B beyond its contexts' baseline: off by more than 1%%", k.cgroup, k.gpu, g, w)
		}
		if driver[k] != device[k] {
			t.Errorf("%s GPU %d: the driver's figure in status %d B, the simulated GPU holds %d B", k.cgroup, k.gpu, driver[k], device[k])
		}
	}
}

// The defaults' memory_limit holds every cgroup no entry names, each apart,
// from its first allocation: a default tenant's process is killed at the
// allocation past it, status shows the limit and the kill, and another
// cgroup keeps its own limit whole.
func TestDefaultGPUMemoryLimit(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte("defaults: {weight: 100, memory_limit: 512MiB}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemonIn(t, gpu, dir)
	first, second := testutil.NewCgroup(t, "mem-default-1"), testutil.NewCgroup(t, "mem-default-2")
	grower := startAllocator(t, gpu, first, 128, 8)
	if grower.Until(t, "done") || grower.Held != 512*mib {
		t.Fatalf("the default tenant held %d MiB, want killed at the allocation past 512", grower.Held/mib)
	}
	logged := func() (string, bool) {
		_, log := d.Proc.Output()
		return log, strings.Contains(log, "process killed at an allocation past it") && strings.Contains(log, "tenant="+first.Rel)
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if log, ok := logged(); ok {
			break
		} else if time.Now().After(deadline) {
			t.Errorf("the kill is not logged with its default tenant %s:\n%s", first.Rel, log)
			break
		}
	}
	keeper := startAllocator(t, gpu, second, 128, 4)
	if !keeper.Until(t, "done") {
		t.Fatal("another cgroup's 512 MiB was refused: each default tenant has its own limit")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := d.Client.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		rows := map[string]api.Tenant{}
		for _, r := range st.Tenants {
			rows[r.Cgroup] = r
		}
		k := rows[second.Rel]
		if k.MemBytes == 512*mib && k.MemoryLimit == 512*mib && k.OOMKills == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status of %s: %d MiB held, limit %d MiB, %d kills; want 512, 512, 0", second.Rel, k.MemBytes/mib, k.MemoryLimit/mib, k.OOMKills)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A restart loses no GPU memory charge, whether the daemon was stopped
// or killed: a tenant holding 512 MiB of its 1 GiB limit from before the
// restart has its next process killed at the allocation that would pass
// 1 GiB, having held 512 MiB, and so does a cgroup under the defaults'
// 512 MiB limit holding 256 MiB; the processes that held their memory
// across the restart keep running.
func TestGPUMemoryChargesSurviveARestart(t *testing.T) {
	for _, killed := range []bool{false, true} {
		t.Run(map[bool]string{false: "stopped", true: "killed"}[killed], func(t *testing.T) {
			gpu := testutil.StartFakeGPU(t)
			dir := t.TempDir()
			limited, byDefault := testutil.NewCgroup(t, "mem-restart-limited"), testutil.NewCgroup(t, "mem-restart-default")
			pol := "defaults: {weight: 100, memory_limit: 512MiB}\ntenants:\n  - {name: limited, cgroup: " + limited.Rel +
				", memory_limit: 1GiB}\n"
			if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(pol), 0o644); err != nil {
				t.Fatal(err)
			}
			first := startDaemonIn(t, gpu, dir)
			keeper, defaultKeeper := startAllocator(t, gpu, limited, 512, 1), startAllocator(t, gpu, byDefault, 256, 1)
			if !keeper.Until(t, "done") || !defaultKeeper.Until(t, "done") {
				t.Fatal("the processes that hold memory across the restart did not allocate")
			}
			if killed {
				first.Proc.Stop()
			} else {
				first.Proc.Interrupt(10 * time.Second)
			}
			second := startDaemonIn(t, gpu, dir)
			for _, c := range []struct {
				cg       *testutil.Cgroup
				want     uint64
				step, of int
			}{{limited, 512 * mib, 128, 8}, {byDefault, 256 * mib, 128, 4}} {
				grower := startAllocator(t, gpu, c.cg, c.step, c.of)
				grower.KilledHolding(t, c.want, "a growing process of "+c.cg.Rel+" beside what was held since before the restart")
			}
			for _, a := range []*testutil.Allocator{keeper, defaultKeeper} {
				if a.Done() {
					t.Errorf("pid %d, which held its memory across the restart within its limit, is gone", a.Cmd.Process.Pid)
				}
			}
			// The daemon logs a kill as its reader takes the record: soon
			// after the process is gone, not before.
			for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				_, log := second.Proc.Output()
				if strings.Contains(log, "tenant=limited") && strings.Contains(log, "bytes=134217728 charged=1073741824 limit=1073741824") {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("the new daemon's log lacks the kill of the limited tenant's process at 1 GiB charged:\n%s", log)
					break
				}
			}
		})
	}
}
