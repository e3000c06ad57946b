package testutil

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// Runc runs OCI containers with the host's runc, its state under a
// private --root so tests never see or touch other containers.
type Runc struct {
	Root   string // runc --root
	Rootfs string // a busybox rootfs, read-only in the containers
}

// NewRunc checks for runc and busybox and builds a rootfs: busybox-static
// and its applets, the directories the bind mounts need.
func NewRunc(t testing.TB) *Runc {
	t.Helper()
	Privileged(t)
	if _, err := exec.LookPath("runc"); err != nil {
		missing(t, "runc (apt-get install runc)")
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		missing(t, "busybox (apt-get install busybox-static)")
	}
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "lib", "lib64", "usr/lib", "gpuarb-bin", "gpu"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "sleep", "cat", "echo", "true", "touch"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	return &Runc{Root: filepath.Join(dir, "state"), Rootfs: rootfs}
}

// Require returns the path of an executable the test needs; without it
// the test skips, or fails under CI=true. hint says how to install it.
func Require(t testing.TB, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		missing(t, name+" ("+hint+")")
	}
	return p
}

// missing skips without root-only CI, fails with it: a tool the tests need
// is absent.
func missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is required (CI=true)", what)
	}
	t.Skipf("%s not installed", what)
}

// ContainerSpec is what a test sets of a container; the rest is runc's
// default spec.
type ContainerSpec struct {
	ID          string
	Args        []string
	Env         []string
	CgroupsPath string
	Annotations map[string]string
	Hooks       *specs.Hooks
	// GPU mounts the test binaries at /gpuarb-bin and the fakegpud socket
	// directory at /gpu, with FAKEGPU_SOCKET set.
	GPU *FakeGPU
	// Bins is the directory mounted at /gpuarb-bin (default: bin/).
	Bins string
}

// Bundle writes a bundle for spec and returns its directory.
func (r *Runc) Bundle(t testing.TB, cs ContainerSpec) string {
	t.Helper()
	bundle := filepath.Join(t.TempDir(), cs.ID)
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("runc", "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v %s", err, out)
	}
	path := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
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
		bins := cs.Bins
		if bins == "" {
			bins = filepath.Dir(Bin(t, "gpuwork"))
		}
		spec.Mounts = append(spec.Mounts, ro(bins, "/gpuarb-bin"), ro("/lib", "/lib"), ro("/lib64", "/lib64"), ro("/usr/lib", "/usr/lib"),
			specs.Mount{Destination: "/gpu", Type: "bind", Source: filepath.Dir(cs.GPU.Socket), Options: []string{"rbind", "rw"}})
		spec.Process.Env = append(spec.Process.Env, "FAKEGPU_SOCKET=/gpu/"+filepath.Base(cs.GPU.Socket))
	}
	out, err := json.MarshalIndent(&spec, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return bundle
}

// Run starts `runc run` for the bundle in the foreground (it returns when
// the container exits, after its poststop hooks); the container is killed
// and deleted at cleanup.
func (r *Runc) Run(t testing.TB, id, bundle string) *Proc {
	t.Helper()
	p := Start(t, nil, exec.Command("runc", "--root", r.Root, "run", "--bundle", bundle, id))
	t.Cleanup(func() { r.Delete(id) })
	return p
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

// State returns the container's runc state (status, pid).
func (r *Runc) State(id string) (specs.State, error) {
	var st specs.State
	out, err := exec.Command("runc", "--root", r.Root, "state", id).Output()
	if err != nil {
		return st, fmt.Errorf("runc state %s: %w", id, err)
	}
	err = json.Unmarshal(out, &st)
	return st, err
}
