package testutil

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpuarb/gpuarb/lab"
)

// FakeGPU is a simulated GPU a test started; it is stopped at cleanup.
type FakeGPU struct{ *lab.FakeGPU }

// StartFakeGPU runs bin/fakegpud serve with extra args on a private socket
// and waits until it accepts connections.
func StartFakeGPU(t testing.TB, args ...string) *FakeGPU {
	t.Helper()
	Privileged(t)
	f, err := lab.StartFakeGPU(filepath.Dir(Bin(t, "fakegpud")), t.TempDir(), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Proc.Stop)
	return &FakeGPU{f}
}

// Workload returns a gpuwork command against this simulated GPU.
func (f *FakeGPU) Workload(t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	Bin(t, "gpuwork") // built
	return f.FakeGPU.Workload(args...)
}
