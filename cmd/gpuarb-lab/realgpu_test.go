package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain runs the command itself when GPUARB_LAB_ARGS is set, so tests
// can see its output and exit status.
func TestMain(m *testing.M) {
	if args := os.Getenv("GPUARB_LAB_ARGS"); args != "" {
		os.Args = append([]string{"gpuarb-lab"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Without an NVIDIA GPU the check says so, writes nothing and exits with
// status 2.
func TestRealGPUWithoutGPU(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this host has an NVIDIA GPU")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "report")
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "GPUARB_LAB_ARGS=realgpu --out "+out)
	text, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(text), "no NVIDIA GPU on this host") {
		t.Errorf("gpuarb-lab realgpu without a GPU: %v: %s", err, text)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a report was written without a GPU")
	}
}

// An unknown step in --only is refused before anything runs, naming the
// steps there are.
func TestRealGPUUnknownStep(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "GPUARB_LAB_ARGS=realgpu --only arbitration --only nope --out "+t.TempDir())
	text, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(text), `no step "nope"`) ||
		!strings.Contains(string(text), "arbitration, latency with gpuarb, Xid errors") {
		t.Errorf("gpuarb-lab realgpu --only nope: %v: %s", err, text)
	}
}
