package testutil

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// FakeGPU is a fakegpud a test started on its own socket.
type FakeGPU struct {
	Socket string
	Proc   *Proc
}

// StartFakeGPU runs bin/fakegpud serve with extra args on a private socket
// and waits until it accepts connections.
func StartFakeGPU(t testing.TB, args ...string) *FakeGPU {
	t.Helper()
	Privileged(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "fakegpu.sock")
	cmd := exec.Command(Bin(t, "fakegpud"), append([]string{"serve", "--socket", sock}, args...)...)
	p := Start(t, nil, cmd)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if p.Done() || time.Now().After(deadline) {
			t.Fatalf("fakegpud did not start: %s", p.Stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &FakeGPU{Socket: sock, Proc: p}
}

// Env is the environment for a workload using this fakegpud.
func (f *FakeGPU) Env() []string {
	return append(os.Environ(), "FAKEGPU_SOCKET="+f.Socket)
}

// Workload returns a gpuwork command against this fakegpud.
func (f *FakeGPU) Workload(t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(Bin(t, "gpuwork"), args...)
	cmd.Env = f.Env()
	return cmd
}
