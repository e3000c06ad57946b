package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/gpuarb/gpuarb/cgroup"
)

// Feature is one capability of the host, probed for real where possible.
type Feature struct {
	Name     string `json:"name"`
	OK       bool   `json:"ok"`
	Detail   string `json:"detail"`
	Required bool   `json:"required"`
}

// ProbeFeatures checks what gpuarb's probes need and may use. Tracefs must
// be mounted for the tracepoint checks to mean anything.
func ProbeFeatures() []Feature {
	var out []Feature
	add := func(name string, required bool, err error, okDetail string) {
		f := Feature{Name: name, Required: required, OK: err == nil, Detail: okDetail}
		if err != nil {
			f.Detail = err.Error()
		}
		out = append(out, f)
	}

	_, err := os.Stat("/sys/kernel/btf/vmlinux")
	add("btf", true, err, "/sys/kernel/btf/vmlinux (CO-RE)")
	add("ringbuf", true, features.HaveMapType(ebpf.RingBuf), "BPF_MAP_TYPE_RINGBUF")
	add("tracepoints", true, tracepointExists("syscalls", "sys_enter_ioctl"), "syscalls:sys_enter_ioctl/sys_exit_ioctl")
	add("uprobes", false, probeUprobe(), "uprobe and uretprobe on libcuda")
	add("kprobes", false, probeKprobe(), "kprobe attach")
	add("fentry", false, probeFentry(), "fentry program load")
	add("drm_sched tracepoints", false, firstTracepoint("gpu_scheduler",
		"drm_sched_job_run", "drm_run_job"), "gpu_scheduler job run/done")
	add("dma_fence tracepoints", false, tracepointExists("dma_fence", "dma_fence_signaled"), "dma_fence:dma_fence_signaled")
	add("bpf_send_signal", false, features.HaveProgramHelper(ebpf.TracePoint, asm.FnSendSignal),
		"from a tracepoint: the GPU memory OOM killer and the launch gate (else memory limits only count, and tenants are paced by freezing)")
	add("dmem gpu memory", false, driverMemoryLimits(),
		"the driver's own per-cgroup GPU memory limits (dmem, NVIDIA R615+) are available; gpuarb does not hand its limits to them yet")
	return out
}

// driverMemoryLimits reports whether the cgroup v2 hierarchy has the dmem
// controller with a GPU's memory region: where a driver enforces
// per-cgroup GPU memory limits itself (NVIDIA R615+ registers
// nvidia/<pci>/vidmem).
func driverMemoryLimits() error {
	root, err := cgroup.UnifiedMount()
	if err != nil {
		return fmt.Errorf("no cgroup v2 hierarchy: %w", err)
	}
	ctrl, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup v2 at %s: %w", root, err)
	}
	if !strings.Contains(" "+strings.TrimSpace(string(ctrl))+" ", " dmem ") {
		return errors.New("no dmem cgroup controller (Linux 6.14+, CONFIG_CGROUP_DMEM): GPU memory limits are held by gpuarb's OOM killer alone")
	}
	capacity, err := os.ReadFile(filepath.Join(root, "dmem.capacity"))
	if err != nil || !strings.Contains(string(capacity), "vidmem") {
		return errors.New("the dmem controller has no GPU memory region: the GPU driver does not limit memory per cgroup")
	}
	return nil
}

func tracepointExists(group, name string) error {
	p := filepath.Join(TracefsPath, "events", group, name)
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("tracepoint %s:%s absent: %w", group, name, err)
	}
	return nil
}

func firstTracepoint(group string, names ...string) error {
	var errs []error
	for _, n := range names {
		err := tracepointExists(group, n)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func trivialProgram(typ ebpf.ProgramType, attach ebpf.AttachType, attachTo string) (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:       typ,
		AttachType: attach,
		AttachTo:   attachTo,
		License:    "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		},
	})
}

// probeUprobe attaches a uprobe to getpid in the C library the linker
// cache names: every glibc host has it, stripped or not.
func probeUprobe() error {
	prog, err := trivialProgram(ebpf.Kprobe, ebpf.AttachNone, "")
	if err != nil {
		return loadRefused("load kprobe-type program", err)
	}
	defer prog.Close()
	libc, err := linkerCachePath("libc.so.6")
	if err != nil {
		return err
	}
	ex, err := link.OpenExecutable(libc)
	if err != nil {
		return err
	}
	l, err := ex.Uprobe("getpid", prog, nil)
	if err != nil {
		return fmt.Errorf("attach uprobe: %w", err)
	}
	return l.Close()
}

func probeKprobe() error {
	prog, err := trivialProgram(ebpf.Kprobe, ebpf.AttachNone, "")
	if err != nil {
		return loadRefused("load kprobe-type program", err)
	}
	defer prog.Close()
	l, err := link.Kprobe("do_sys_openat2", prog, nil)
	if err != nil {
		return fmt.Errorf("attach kprobe: %w", err)
	}
	return l.Close()
}

func probeFentry() error {
	prog, err := trivialProgram(ebpf.Tracing, ebpf.AttachTraceFEntry, "do_sys_openat2")
	if err != nil {
		return loadRefused("load fentry program", err)
	}
	return prog.Close()
}

// loadRefused words a failed probe load for an operator: as root, EPERM
// means the kernel does not allow that program type here (cilium/ebpf's
// hint about RLIMIT_MEMLOCK does not apply on the kernels gpuarb supports
// with BTF, which account BPF memory to the cgroup, and gpuarb's own
// programs load under the same limit).
func loadRefused(what string, err error) error {
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("%s: refused by this kernel (EPERM)", what)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Lockdown returns the kernel lockdown mode ("none", "integrity",
// "confidentiality"), or a note when securityfs does not tell.
func Lockdown() string {
	data, err := os.ReadFile("/sys/kernel/security/lockdown")
	if err != nil {
		return "unknown (securityfs not mounted at /sys/kernel/security)"
	}
	for _, f := range strings.Fields(string(data)) {
		if strings.HasPrefix(f, "[") {
			return strings.Trim(f, "[]")
		}
	}
	return ""
}
