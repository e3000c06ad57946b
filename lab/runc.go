package lab

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// Runc runs OCI containers with the host's runc, its state under a
// private --root so the lab never sees or touches other containers.
type Runc struct {
	Root   string // runc --root
	Rootfs string // a busybox rootfs, read-only in the containers
}

// NewRunc checks for runc and busybox and builds, in dir, a rootfs of
// busybox-static and its applets with the directories the GPU mounts need.
func NewRunc(dir string) (*Runc, error) {
	if _, err := exec.LookPath("runc"); err != nil {
		return nil, fmt.Errorf("runc not installed (apt-get install runc): %w", err)
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox not installed (apt-get install busybox-static): %w", err)
	}
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "lib", "lib64", "usr/lib", "gpuarb-bin", "gpu"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return nil, fmt.Errorf("rootfs: %w", err)
		}
	}
	data, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), data, 0o755); err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	for _, applet := range []string{"sh", "sleep", "cat", "echo", "true", "touch"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", applet)); err != nil {
			return nil, fmt.Errorf("rootfs: %w", err)
		}
	}
	return &Runc{Root: filepath.Join(dir, "state"), Rootfs: rootfs}, nil
}

// ContainerSpec is what the lab sets of a container; the rest is runc's
// default spec.
type ContainerSpec struct {
	ID          string
	Args        []string
	Env         []string
	CgroupsPath string
	Annotations map[string]string
	Hooks       *specs.Hooks
	// GPU mounts Bins at /gpuarb-bin and the simulated GPU's socket
	// directory at /gpu, with FAKEGPU_SOCKET set.
	GPU  *FakeGPU
	Bins string
}

// Bundle writes a bundle for cs under dir and returns its directory.
func (r *Runc) Bundle(dir string, cs ContainerSpec) (string, error) {
	bundle := filepath.Join(dir, cs.ID)
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return "", fmt.Errorf("bundle %s: %w", cs.ID, err)
	}
	if out, err := exec.Command("runc", "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		return "", fmt.Errorf("runc spec: %w: %s", err, out)
	}
	path := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("bundle %s: %w", cs.ID, err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", fmt.Errorf("bundle %s: runc's spec: %w", cs.ID, err)
	}
	spec.Root = &specs.Root{Path: r.Rootfs, Readonly: true}
	spec.Process.Terminal = false
	spec.Process.Args = cs.Args
	spec.Process.Env = append([]string{"PATH=/bin"}, cs.Env...)
	spec.Linux.CgroupsPath = cs.CgroupsPath
	spec.Annotations = cs.Annotations
	spec.Hooks = cs.Hooks
	ro := func(src, dst string) specs.Mount {
		return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "ro"}}
	}
	if cs.GPU != nil {
		spec.Mounts = append(spec.Mounts, ro(cs.Bins, "/gpuarb-bin"), ro("/lib", "/lib"), ro("/lib64", "/lib64"), ro("/usr/lib", "/usr/lib"),
			specs.Mount{Destination: "/gpu", Type: "bind", Source: filepath.Dir(cs.GPU.Socket), Options: []string{"rbind", "rw"}})
		spec.Process.Env = append(spec.Process.Env, "FAKEGPU_SOCKET=/gpu/"+filepath.Base(cs.GPU.Socket))
	}
	out, err := json.MarshalIndent(&spec, "", "\t")
	if err != nil {
		return "", fmt.Errorf("bundle %s: %w", cs.ID, err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return "", fmt.Errorf("bundle %s: %w", cs.ID, err)
	}
	return bundle, nil
}

// Run starts `runc run` for the bundle in the foreground: it returns when
// the container exits, after its poststop hooks. Delete removes it.
func (r *Runc) Run(id, bundle string) (*Proc, error) {
	return Start(exec.Command("runc", "--root", r.Root, "run", "--bundle", bundle, id), "")
}

// Delete kills and removes a container; an absent one is fine.
func (r *Runc) Delete(id string) {
	_ = exec.Command("runc", "--root", r.Root, "kill", id, "KILL").Run()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		out, err := exec.Command("runc", "--root", r.Root, "delete", "--force", id).CombinedOutput()
		if err == nil || strings.Contains(string(out), "does not exist") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
