package lab_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/lab"
)

// What runc leaves in the v1 hierarchies of a hybrid host (a container's
// cgroup and the parents it made) goes with the cgroup's tree.
func TestRemoveTreeTakesV1Mirrors(t *testing.T) {
	testutil.Privileged(t)
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var v1 string
	for _, line := range strings.Split(string(data), "\n") {
		pre, post, _ := strings.Cut(line, " - ")
		if f, g := strings.Fields(pre), strings.Fields(post); len(f) > 4 && len(g) > 0 && g[0] == "cgroup" && f[3] == "/" {
			v1 = f[4]
			break
		}
	}
	if v1 == "" {
		testutil.Missing(t, "a cgroup v1 hierarchy")
	}
	cg, err := lab.NewCgroup(testutil.TestParent, "mirrored")
	if err != nil {
		t.Fatal(err)
	}
	mirror := filepath.Join(v1, cg.Rel, "ctr", "sub")
	if err := os.MkdirAll(mirror, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := lab.RemoveTree(cg.Path); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{cg.Path, filepath.Join(v1, cg.Rel)} {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("%s left behind", dir)
		}
	}
}
