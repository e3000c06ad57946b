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
