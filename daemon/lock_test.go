package daemon

import (
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
