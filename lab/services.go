package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/e2e/fakegpu"
)

// FakeGPU is a running simulated GPU.
type FakeGPU struct {
	Socket string
	Proc   *Proc
	bins   string
}

// StartFakeGPU runs bins/fakegpud serve with extra args on a socket in dir
// and waits until it accepts connections.
func StartFakeGPU(bins, dir string, args ...string) (*FakeGPU, error) {
	sock := filepath.Join(dir, "fakegpu.sock")
	p, err := Start(exec.Command(filepath.Join(bins, "fakegpud"), append([]string{"serve", "--socket", sock}, args...)...), "")
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return &FakeGPU{Socket: sock, Proc: p, bins: bins}, nil
		}
		if p.Done() || time.Now().After(deadline) {
			p.Stop()
			_, stderr := p.Output()
			return nil, fmt.Errorf("fakegpud did not start: %s", stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Env is the environment for a workload using this simulated GPU.
func (f *FakeGPU) Env() []string {
	return append(os.Environ(), "FAKEGPU_SOCKET="+f.Socket)
}

// Workload returns a gpuwork command against this simulated GPU.
func (f *FakeGPU) Workload(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(f.bins, "gpuwork"), args...)
	cmd.Env = f.Env()
	return cmd
}

// Stats reads the ground truth, resetting it when reset is set.
func (f *FakeGPU) Stats(reset bool) (fakegpu.Stats, error) { return fakegpu.ReadStats(f.Socket, reset) }

// Daemon is a running gpuarb daemon on the simulated GPU.
type Daemon struct {
	*api.Client
	Proc    *Proc
	Socket  string
	PinPath string
}

// StartDaemon starts gpuarb daemon (from gpu's bins) for the simulated
// GPU gpu — its control node as an nvidia one (--device 1:7=nvidia), its
// managed memory node as nvidia-uvm (--device 1:5=nvidia-uvm), its
// socket as the transport of its scheduling controls (--fakegpu-socket) —
// with its socket, policy file and state in dir and its pins in a
// directory of bpffs named after dir, and waits for its API. Its thaw
// guardian runs in its cgroup (--guardian-cgroup= ; extra may name
// another). extra adds flags.
func StartDaemon(gpu *FakeGPU, dir string, extra ...string) (*Daemon, error) {
	return StartDaemonInCgroup(gpu, dir, "", extra...)
}

// StartDaemonInCgroup is StartDaemon with the daemon started in the cgroup
// directory cg ("": the caller's).
func StartDaemonInCgroup(gpu *FakeGPU, dir, cg string, extra ...string) (*Daemon, error) {
	bins := gpu.bins
	sock := filepath.Join(dir, "gpuarb.sock")
	// Named after the whole of dir: unique while dir is (t.TempDir's last
	// element, 001, repeats across tests). bpffs refuses dots in names.
	pins := "/sys/fs/bpf/gpuarb-" + strings.NewReplacer("/", "-", ".", "-").Replace(strings.Trim(dir, "/"))
	args := append([]string{"daemon", "--socket", sock, "--pin-path", pins, "--policy", filepath.Join(dir, "policy.yaml"),
		"--no-host-devices", "--device", "1:7=nvidia", "--device", "1:5=nvidia-uvm", "--fakegpu-socket", gpu.Socket, "--libcuda", filepath.Join(bins, "libcuda.so.1"),
		"--guardian-cgroup=", "--nri-socket="}, extra...)
	p, err := Start(exec.Command(filepath.Join(bins, "gpuarb"), args...), cg)
	if err != nil {
		return nil, err
	}
	c := api.NewClient(sock)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Status(ctx)
		cancel()
		if err == nil {
			return &Daemon{Client: c, Proc: p, Socket: sock, PinPath: pins}, nil
		}
		if p.Done() || time.Now().After(deadline) {
			p.Stop()
			_, stderr := p.Output()
			return nil, fmt.Errorf("daemon did not start: %s", stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop asks the daemon to stop (SIGINT: it thaws everything and removes
// its pins) and ends it if it has not within 10 s.
func (d *Daemon) Stop() { d.Proc.Interrupt(10 * time.Second) }
