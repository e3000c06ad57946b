// Package locked is lockcheck's test case: each line marked "// I/O" is a
// call under Server.mu that reaches I/O, and no other line is one.
package locked

import (
	"os"
	"sync"
	"time"
)

// Server guards n with mu.
type Server struct {
	mu sync.Mutex
	n  int
}

// Direct reads a file under the lock.
func (s *Server) Direct() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = os.ReadFile("/proc/self/stat") // I/O
}

// Indirect reaches I/O through its own method.
func (s *Server) Indirect() {
	s.mu.Lock()
	s.stat() // I/O
	s.mu.Unlock()
}

func (s *Server) stat() { _, _ = os.Stat("/") }

// After does its I/O once the lock is released.
func (s *Server) After() {
	s.mu.Lock()
	s.n++
	s.mu.Unlock()
	s.stat()
}

// Later builds the I/O under the lock and leaves it to its caller.
func (s *Server) Later() func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	return func() { s.stat() }
}

// EarlyUnlock does its I/O on a branch that released the lock.
func (s *Server) EarlyUnlock(b bool) {
	s.mu.Lock()
	if b {
		s.mu.Unlock()
		s.stat()
		return
	}
	if s.n > 0 {
		s.stat() // I/O
	}
	s.mu.Unlock()
}

func (s *Server) update(next func()) {
	s.mu.Lock()
	next()
	s.mu.Unlock()
}

// Passed hands update a function that does I/O.
func (s *Server) Passed() {
	s.update(func() {
		s.stat() // I/O
	})
	s.update(s.bump)
}

func (s *Server) bump() { s.n++ }

// Sleeps waits under the lock.
func (s *Server) Sleeps() {
	s.mu.Lock()
	time.Sleep(time.Millisecond) // I/O
	s.mu.Unlock()
}

// Beside does its I/O in a goroutine of its own.
func (s *Server) Beside() {
	s.mu.Lock()
	go func() { s.stat() }()
	s.mu.Unlock()
}

// Other locks another mutex, which the check does not watch.
func Other() {
	var mu sync.Mutex
	mu.Lock()
	_, _ = os.Stat("/")
	mu.Unlock()
}
