package testutil

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Allocator is a process that allocates GPU memory and says so: a line
// "held BYTES" after each allocation and "done" after the last (gpuwork
// alloc, testdata/rawalloc.c). Its stdin stays open until cleanup.
type Allocator struct {
	*Proc
	In io.WriteCloser
	// Held is what the last "held" line read said.
	Held  uint64
	lines chan string
}

// StartAllocator starts cmd in cg as Start does, reading its lines.
func StartAllocator(t testing.TB, cg *Cgroup, cmd *exec.Cmd) *Allocator {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	// A pipe of its own, not cmd.StdoutPipe: Start reaps the process as it
	// exits, and Wait closes a StdoutPipe then, losing the lines a killed
	// process wrote last. This one is read to its end, then closed.
	out, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	a := &Allocator{In: in, lines: make(chan string, 64)}
	a.Proc = Start(t, cg, cmd)
	w.Close()
	go func() {
		defer out.Close()
		s := bufio.NewScanner(out)
		for s.Scan() {
			a.lines <- s.Text()
		}
		close(a.lines)
	}()
	t.Cleanup(func() { in.Close() })
	return a
}

// Until reads its lines until want (true) or until its output ends
// (false: it exited); it fails the test after 20 s without either.
func (a *Allocator) Until(t testing.TB, want string) bool {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-a.lines:
			if !ok {
				return false
			}
			if n, found := strings.CutPrefix(l, "held "); found {
				a.Held, _ = strconv.ParseUint(n, 10, 64)
			}
			if l == want {
				return true
			}
		case <-timeout:
			t.Fatalf("allocator: no %q in 20 s (held %d bytes)", want, a.Held)
		}
	}
}

// KilledHolding fails t unless the allocator, which is to be killed at an
// allocation past a limit, gets no further than it was allowed ("done"
// never said), ends by SIGKILL within 10 s and had said it held want
// bytes; what names it in the messages.
func (a *Allocator) KilledHolding(t testing.TB, want uint64, what string) {
	t.Helper()
	if a.Until(t, "done") {
		t.Fatalf("%s allocated all it asked for past its limit", what)
	}
	var ee *exec.ExitError
	if err := a.Wait(t, 10*time.Second); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("%s ended with %v, want SIGKILL", what, err)
	}
	if a.Held != want {
		t.Errorf("%s held %d MiB when killed, want %d", what, a.Held>>20, want>>20)
	}
}
