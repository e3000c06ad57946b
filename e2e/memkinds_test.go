package e2e

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

// Issue 59's limits as a share of the GPU's memory: a tenant attached with
// --memory-limit 25% on a 4 GiB GPU is held to 1 GiB once the daemon has
// read the GPU's size from the driver. Its process holding 256 MiB keeps
// it; its growing process is killed at the allocation past 1 GiB, having
// held 768 MiB; status shows the share, what it comes to on the GPU and
// one kill, and the kill is logged with the limit in bytes. In each
// actuator mode: the size is read with steering off too.
func TestGPUMemoryLimitAsAShareOfTheGPU(t *testing.T) {
	for _, mode := range actuatorModes {
		t.Run(mode.name, func(t *testing.T) {
			gpu := testutil.StartFakeGPU(t, "--memory", strconv.Itoa(4<<30))
			d := startDaemon(t, gpu, mode.args...)
			limited := testutil.NewCgroup(t, "mem-share")
			out, err := exec.Command(testutil.Bin(t, "gpuarb"), "attach", "--socket", d.Socket, "--cgroup", limited.Rel,
				"--name", "limited", "--memory-limit", "25%").CombinedOutput()
			if err != nil {
				t.Fatalf("attach --memory-limit 25%%: %v\n%s", err, out)
			}
			keeper := startAllocator(t, gpu, limited, 256, 1)
			if !keeper.Until(t, "done") {
				t.Fatal("the tenant's 256 MiB process did not finish allocating")
			}
			// The share holds from the daemon's first read of the GPU's
			// size, in the first window with a tenant's group on it.
			row := func() api.Tenant {
				st, err := d.Client.Status(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range st.Tenants {
					if r.Cgroup == limited.Rel {
						return r
					}
				}
				return api.Tenant{}
			}
			var l api.Tenant
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				if l = row(); l.MemoryLimit != 0 {
					break
				}
			}
			if l.MemoryLimit != 1<<30 || l.MemoryLimitShare != 0.25 {
				t.Fatalf("the limited tenant's limit in status: %d MiB as a share of %g; want 1024 MiB, 0.25", l.MemoryLimit/mib, l.MemoryLimitShare)
			}
			if st, err := d.Client.Status(context.Background()); err != nil || len(st.GPUs) == 0 || st.GPUs[0].MemoryBytes != 4<<30 {
				t.Errorf("status's GPU 0 (%v): want its memory, 4 GiB, in memory_bytes: %+v", err, st.GPUs)
			}
			grower := startAllocator(t, gpu, limited, 128, 16)
			grower.KilledHolding(t, 768*mib, "the growing process under 25% of a 4 GiB GPU beside 256 MiB")
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				if l = row(); l.OOMKills == 1 && l.MemBytes == 256*mib {
					break
				}
			}
			if l.OOMKills != 1 || l.MemBytes != 256*mib || keeper.Done() {
				t.Errorf("after the kill: %d OOM kills, %d MiB held, the keeper gone: %v; want 1, 256, false", l.OOMKills, l.MemBytes/mib, keeper.Done())
			}
			_, log := d.Proc.Output()
			if !strings.Contains(log, "GPU memory size read from the driver") || !strings.Contains(log, "bytes=134217728 charged=1073741824 limit=1073741824") {
				t.Errorf("the daemon's log lacks the GPU's size or the kill with its limit in bytes:\n%s", log)
			}
			top, err := exec.Command(testutil.Bin(t, "gpuarb"), "top", "--once", "--socket", d.Socket).Output()
			if err != nil || !strings.Contains(string(top), "256/1024") {
				t.Errorf("top --once does not show the limited tenant's 256/1024 MiB (%v):\n%s", err, top)
			}
		})
	}
}

// Issue 59's managed memory, reported as its reserved address space: a
// process that maps three 100 MiB managed ranges (cuMemAllocManaged, an
// mmap of the nvidia-uvm node) and unmaps the first holds 200 MiB of it in
// status and metrics, beside no device memory; a GPU memory limit below
// that does not charge it; once the process is gone nothing is reported.
func TestManagedMemoryReportedAsItsAddressSpace(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	metricsAddr := testutil.FreeTCPAddr(t)
	d := startDaemon(t, gpu, "--metrics-addr", metricsAddr)
	cg := testutil.NewCgroup(t, "mem-managed")
	out, err := exec.Command(testutil.Bin(t, "gpuarb"), "attach", "--socket", d.Socket, "--cgroup", cg.Rel,
		"--name", "managed", "--memory-limit", "64MiB").CombinedOutput()
	if err != nil {
		t.Fatalf("attach: %v\n%s", err, out)
	}
	cmd := gpu.Workload(t, "alloc", "--pattern", "managed", "--step-mib", "100", "--count", "3", "--duration", "3")
	a := testutil.StartAllocator(t, cg, cmd)
	if !a.Until(t, "done") || a.Held != 200*mib {
		t.Fatalf("the managed allocator said it held %d MiB, want 200 (it was killed: %v)", a.Held/mib, a.Done())
	}
	row := func() (api.Tenant, bool) {
		st, err := d.Client.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range st.Tenants {
			if r.Cgroup == cg.Rel {
				return r, true
			}
		}
		return api.Tenant{}, false
	}
	var r api.Tenant
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r, _ = row(); r.ManagedBytes == 200*mib {
			break
		}
	}
	if r.ManagedBytes != 200*mib || r.MemBytes != 0 || r.OOMKills != 0 {
		t.Errorf("status: %d MiB managed, %d MiB device, %d OOM kills; want 200, 0, 0", r.ManagedBytes/mib, r.MemBytes/mib, r.OOMKills)
	}
	fams := testutil.ScrapeMetrics(t, "http://"+metricsAddr+"/metrics")
	if v, ok := testutil.MetricValue(fams, "gpuarb_managed_memory_bytes", map[string]string{"tenant": "managed"}); !ok || v != 200*mib {
		t.Errorf("gpuarb_managed_memory_bytes{tenant=managed} = %v (%v), want 200 MiB", v, ok)
	}
	if err := a.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("the managed allocator ended with %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r, found := row(); !found || r.ManagedBytes == 0 {
			return
		}
	}
	r, _ = row()
	t.Errorf("after the process's exit status still reports %d MiB managed", r.ManagedBytes/mib)
}
