package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpuarb/gpuarb/lab"
)

// Runc runs OCI containers with the host's runc, its state under a
// private --root so tests never see or touch other containers.
type Runc struct{ *lab.Runc }

// NewRunc checks for runc and busybox (skipping, or failing under
// CI=true, without them) and builds a busybox rootfs.
func NewRunc(t testing.TB) *Runc {
	t.Helper()
	Privileged(t)
	Require(t, "runc", "apt-get install runc")
	Require(t, "busybox", "apt-get install busybox-static")
	r, err := lab.NewRunc(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &Runc{r}
}

// Require returns the path of an executable the test needs; without it
// the test skips, or fails under CI=true. hint says how to install it.
func Require(t testing.TB, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, name+" ("+hint+")")
	}
	return p
}

// Missing says that what a test needs (a tool, a kernel feature) is
// absent: it skips the test, or fails it with CI=true, where every test
// must run.
func Missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is required (CI=true)", what)
	}
	t.Skipf("%s: not on this host", what)
}

// Bundle writes a bundle for spec and returns its directory; a spec with
// a GPU mounts the built binaries unless it names others (Bins).
func (r *Runc) Bundle(t testing.TB, spec lab.ContainerSpec) string {
	t.Helper()
	if spec.GPU != nil && spec.Bins == "" {
		spec.Bins = filepath.Dir(Bin(t, "gpuwork"))
	}
	bundle, err := r.Runc.Bundle(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return bundle
}

// Run starts `runc run` for the bundle in the foreground (it returns when
// the container exits, after its poststop hooks); the container is killed
// and deleted at cleanup.
func (r *Runc) Run(t testing.TB, id, bundle string) *Proc {
	t.Helper()
	p, err := r.Runc.Run(id, bundle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		r.Delete(id)
	})
	return &Proc{p}
}
