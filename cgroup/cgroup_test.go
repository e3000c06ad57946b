package cgroup_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

func TestResolverAndProcessPath(t *testing.T) {
	cg := testutil.NewCgroup(t, "resolve")
	root, err := cgroup.UnifiedMount()
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Join(root, cg.Rel) != cg.Path {
		t.Fatalf("mount %s + %s != %s", root, cg.Rel, cg.Path)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(cg.Path, &st); err != nil || st.Ino != cg.ID {
		t.Fatalf("id %d, inode %d (%v)", cg.ID, st.Ino, err)
	}
	r := cgroup.NewResolver(root)
	if got := r.Path(cg.ID); got != cg.Rel {
		t.Errorf("Path(%d) = %q, want %q", cg.ID, got, cg.Rel)
	}
	if got := r.Path(1); got != "/" {
		t.Errorf("root cgroup resolves to %q", got)
	}
	// A cgroup created after the first scan is found on the next miss.
	child := filepath.Join(cg.Path, "child")
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(child)
	id, err := cgroup.ID(child)
	if err != nil {
		t.Fatal(err)
	}
	deadline := 50
	for r.Path(id) == "" && deadline > 0 {
		deadline--
		exec.Command("sleep", "0.01").Run()
	}
	if got := r.Path(id); got != cg.Rel+"/child" {
		t.Errorf("new cgroup resolves to %q", got)
	}

	cmd := exec.Command("sleep", "5")
	p := testutil.Start(t, cg, cmd)
	got, err := cgroup.ProcessPath(cmd.Process.Pid)
	if err != nil || got != cg.Rel {
		t.Errorf("ProcessPath = %q, %v; want %q", got, err, cg.Rel)
	}
	p.Cmd.Process.Kill()
	if _, err := cgroup.ProcessPath(1 << 30); err == nil {
		t.Error("ProcessPath of a missing pid succeeded")
	}
}

func TestDetectMode(t *testing.T) {
	testutil.Privileged(t)
	m := cgroup.DetectMode()
	switch m.Name {
	case "unified", "hybrid":
		if m.UnifiedMount == "" || !m.Freeze {
			t.Errorf("%+v", m)
		}
	case "legacy":
		if m.UnifiedMount != "" {
			t.Errorf("%+v", m)
		}
	default:
		t.Errorf("mode %q", m.Name)
	}
}

// RunningPIDs lists this process and its parent, and nothing that is no
// pid.
func TestRunningPIDsListsThisProcess(t *testing.T) {
	pids := cgroup.RunningPIDs()
	if !slices.Contains(pids, uint32(os.Getpid())) || !slices.Contains(pids, uint32(os.Getppid())) || slices.Contains(pids, 0) {
		t.Errorf("%d pids, this process or its parent missing, or pid 0 listed", len(pids))
	}
}
