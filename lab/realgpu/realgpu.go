// Package realgpu is the real-GPU check of docs/driver.md §4: on a host
// with an NVIDIA GPU, CUDA and PyTorch it records whether a root daemon
// may steer a CUDA process's channel groups (ownership and permission),
// what each scheduling control does to saturating CUDA processes, which
// libcuda entry points the probes see under PyTorch eager and graph
// replay, gpuarb's shares against NVML's, and the probes' cost per
// launch. Each step records its numbers or why it failed; a failed step
// does not stop the others.
package realgpu

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

//go:embed py/*.py
var scripts embed.FS

// ErrNoGPU is returned by Detect on a host without an NVIDIA GPU.
var ErrNoGPU = errors.New("no NVIDIA GPU on this host")

// Limit is the longest the whole check may run.
const Limit = 10 * time.Minute

// Host is what Detect found.
type Host struct {
	Kernel string   `json:"kernel"`
	Driver string   `json:"driver"`
	GPUs   []string `json:"gpus"`
	Torch  string   `json:"torch"`
	Python string   `json:"python"`
}

// Options configure a check.
type Options struct {
	// Bin is the directory with the gpuarb binary (the meter step runs
	// its daemon).
	Bin string
	// Python runs the CUDA workloads (PyTorch must import in it).
	Python string
	// Work is a scratch directory for the scripts and the daemon.
	Work string
	// Keep, when set, is where the check leaves what its report does not
	// hold: the meter's recording of the latency-with-gpuarb step's run
	// without holds (heldRecording), for gpuarb-lab replay-meter.
	Keep string
	// Only names the steps to run (nil: all). A step that needs an
	// earlier one's burners or daemon fails without it.
	Only []string
	// Logf reports progress; nil is silent.
	Logf func(format string, args ...any)
}

func (o Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// Step is one part of the check.
type Step struct {
	Name    string         `json:"name"`
	OK      bool           `json:"ok"`
	Summary string         `json:"summary"`
	Error   string         `json:"error,omitempty"`
	Values  map[string]any `json:"values,omitempty"`
	Seconds float64        `json:"seconds"`
}

// Report is the whole check.
type Report struct {
	Started time.Time `json:"started"`
	Host    Host      `json:"host"`
	Steps   []Step    `json:"steps"`
}

// Detect tells whether this host can run the check: the nvidia control
// node (char 195:255), the driver's version, and PyTorch with CUDA in
// python. Without the node it returns ErrNoGPU.
func Detect(ctx context.Context, python string) (Host, error) {
	var st unix.Stat_t
	if err := unix.Stat("/dev/nvidiactl", &st); err != nil {
		return Host{}, fmt.Errorf("%w: /dev/nvidiactl: %w", ErrNoGPU, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 195 {
		return Host{}, fmt.Errorf("%w: /dev/nvidiactl is not the nvidia driver's node (195:255)", ErrNoGPU)
	}
	var h Host
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		h.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/driver/nvidia/version"); err == nil {
		h.Driver = strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
	}
	if out, err := exec.CommandContext(ctx, "nvidia-smi", "-L").Output(); err == nil {
		h.GPUs = strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	h.Python = python
	out, err := exec.CommandContext(ctx, python, "-c",
		"import torch; assert torch.cuda.is_available(), 'CUDA not available to PyTorch'; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))").CombinedOutput()
	if err != nil {
		return h, fmt.Errorf("PyTorch with CUDA in %s: %w: %s", python, err, lastLine(string(out)))
	}
	h.Torch = strings.TrimSpace(string(out))
	return h, nil
}

// StepNames are the check's steps, in the order they run.
func StepNames() []string {
	var names []string
	for _, st := range (&check{}).steps() {
		names = append(names, st.name)
	}
	return names
}

// stepDef is one step of the check and what ends after it (burners,
// probes, a daemon the steps after it must not find running).
type stepDef struct {
	name  string
	run   func(context.Context, *Step) error
	after func()
}

func (c *check) steps() []stepDef {
	return []stepDef{
		{"cost without gpuarb", c.costWithout, nil},
		{"ownership and permission", c.ownership, nil},
		{"driver memory figure", c.driverMemory, nil},
		{"timeslices", c.timeslices, nil},
		{"context-switch cost", c.switchCost, nil},
		{"pause and resume", c.pauseResume, nil},
		{"hold cost", c.holdCost, nil},
		{"latency", c.latency, nil},
		{"preempt", c.preempt, c.stopBurners},
		{"slice shares", c.sliceShares, nil},
		{"probes under PyTorch", c.census, c.closeProbes},
		{"meter against NVML", c.meter, nil},
		{"cost with gpuarb", c.costWith, c.stopDaemon},
		{"arbitration", c.arbitration, nil},
		{"latency with gpuarb", c.latencyWithGpuarb, nil},
		{"Xid errors", c.xids, nil},
	}
}

// Run runs every step (those of Options.Only) within Limit and returns the
// report; an error is returned only when the check could not start at all.
func Run(ctx context.Context, host Host, o Options) (*Report, error) {
	ctx, cancel := context.WithTimeout(ctx, Limit)
	defer cancel()
	if err := writeScripts(o.Work); err != nil {
		return nil, err
	}
	r := &Report{Started: time.Now().UTC(), Host: host}
	c := &check{o: o, report: r}
	defer c.cleanups()
	for _, st := range c.steps() {
		c.step(ctx, st.name, st.run)
		if st.after != nil {
			st.after()
		}
	}
	return r, nil
}

func writeScripts(dir string) error {
	entries, err := scripts.ReadDir("py")
	if err != nil {
		return err
	}
	for _, e := range entries {
		b, err := scripts.ReadFile("py/" + e.Name())
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", e.Name(), err)
		}
	}
	return nil
}

// step runs fn as the named step, recording its result and time.
func (c *check) step(ctx context.Context, name string, fn func(context.Context, *Step) error) {
	if c.o.Only != nil && !slices.Contains(c.o.Only, name) {
		return
	}
	s := Step{Name: name, Values: map[string]any{}}
	c.o.logf("realgpu: %s ...", name)
	start := time.Now()
	err := ctx.Err()
	if err == nil {
		err = fn(ctx, &s)
	}
	s.Seconds = time.Since(start).Seconds()
	if err != nil {
		s.Error = err.Error()
	} else {
		s.OK = true
	}
	c.o.logf("realgpu: %s: %s%s", name, s.Summary, map[bool]string{true: "", false: " (failed: " + s.Error + ")"}[s.OK])
	c.report.Steps = append(c.report.Steps, s)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// lastLines are the last n lines of s.
func lastLines(s string, n int) []string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[max(0, len(lines)-n):]
}
