package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

// TestStatusAndTop runs the daemon and a tenant on the simulated GPU and
// reads them through `gpuarb status --json` and `gpuarb top --once`.
func TestStatusAndTop(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t)
	sock := d.Socket
	cg := testutil.NewCgroup(t, "status")
	testutil.Start(t, cg, gpu.Workload(t, "hog", "--duration", "5"))
	time.Sleep(2500 * time.Millisecond)

	out, err := exec.Command(testutil.Bin(t, "gpuarb"), "status", "--json", "--socket", sock).Output()
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	var st map[string]any
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	var found bool
	for _, x := range st["tenants"].([]any) {
		ten := x.(map[string]any)
		if ten["cgroup"] != cg.Rel {
			continue
		}
		found = true
		for _, k := range []string{"name", "cgroup", "cgroup_id", "gpu", "share", "gpu_ns", "launches_per_s", "mem_bytes", "queue_ns"} {
			if _, ok := ten[k]; !ok {
				t.Errorf("tenant lacks %q: %v", k, ten)
			}
		}
		if ten["share"].(float64) < 0.95 || ten["cgroup_id"].(float64) != float64(cg.ID) || ten["state"] != "running" ||
			ten["launches_per_s"].(float64) < 40 || ten["name"] != cg.Rel {
			t.Errorf("tenant %v", ten)
		}
	}
	if !found {
		t.Fatalf("the workload's cgroup is not a tenant: %s", out)
	}
	gpus := st["gpus"].([]any)
	if len(gpus) != 1 || gpus[0].(map[string]any)["busy_share"].(float64) < 0.95 {
		t.Errorf("gpus %v", gpus)
	}

	top, err := exec.Command(testutil.Bin(t, "gpuarb"), "top", "--once", "--sort", "name", "--socket", sock).Output()
	if err != nil {
		t.Fatalf("top: %v", err)
	}
	for _, want := range []string{"gpuarb top", "GPU 0", "TENANT", cg.Rel, "running"} {
		if !strings.Contains(string(top), want) {
			t.Errorf("top --once lacks %q:\n%s", want, top)
		}
	}
	if err := exec.Command(testutil.Bin(t, "gpuarb"), "top", "--sort", "color", "--socket", sock).Run(); err == nil {
		t.Error("top --sort color accepted")
	}

	// SIGTERM: a clean stop that leaves no pins, socket or lock.
	d.Proc.Cmd.Process.Signal(syscall.SIGTERM)
	if err := d.Proc.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("daemon after SIGTERM: %v\n%s", err, d.Proc.Stderr)
	}
	for _, p := range []string{sock, daemonLedger(sock)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after SIGTERM", p)
		}
	}
	out, err = exec.Command(testutil.Bin(t, "gpuarb"), "status", "--socket", sock).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not running") {
		t.Errorf("status without a daemon: %v %s", err, out)
	}
}

func daemonLedger(sock string) string { return filepath.Join(filepath.Dir(sock), "gated.json") }

func waitAPI(t *testing.T, sock string, d *testutil.Proc) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := api.NewClient(sock).Status(t.Context()); err == nil {
			return
		}
		if d.Done() || time.Now().After(deadline) {
			t.Fatalf("daemon did not start: %s", d.Stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
