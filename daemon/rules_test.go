package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuarb/gpuarb/internal/lockcheck"
)

// TestNoIOUnderTheDaemonsLock holds the daemon's rule that its lock (mu)
// guards memory only: a status request, a policy reload or the control
// step must never wait on a system call, a BPF map, a cgroup file or the
// driver while another holds it.
func TestNoIOUnderTheDaemonsLock(t *testing.T) {
	findings, err := lockcheck.Check("..", lockcheck.Lock{Package: "github.com/gpuarb/gpuarb/daemon", Type: "Daemon", Field: "mu"}, "./...")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range findings {
		t.Errorf("I/O under the daemon's lock: %s", f)
	}
}

// The daemon composes the packages that sense, decide and act; what grows
// belongs in them. Its code stays within 2500 lines, no file over 500.
func TestDaemonStaysAComposer(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		n := bytes.Count(data, []byte("\n"))
		total += n
		if n > 500 {
			t.Errorf("%s has %d lines, over 500", name, n)
		}
	}
	if total == 0 || total > 2500 {
		t.Errorf("daemon/ has %d lines of code, want 1 to 2500", total)
	}
}
