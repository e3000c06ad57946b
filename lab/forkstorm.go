package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ForkStorm is a running fork storm (bins/forkstorm, built from
// lab/forkstorm): a tenant that forks processes that exit at once, as fast
// as the host lets it. It forks nothing until Go, so that the caller can
// attach it first.
type ForkStorm struct {
	Proc  *Proc
	start io.WriteCloser
}

// StartForkStorm starts a storm of rounds rounds of forks forks each in the
// cgroup directory cg ("": the caller's).
func StartForkStorm(bins, cg string, forks, rounds int) (*ForkStorm, error) {
	cmd := exec.Command(filepath.Join(bins, "forkstorm"), strconv.Itoa(forks), strconv.Itoa(rounds))
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("fork storm: %w", err)
	}
	p, err := Start(cmd, cg)
	if err != nil {
		in.Close()
		return nil, err
	}
	return &ForkStorm{Proc: p, start: in}, nil
}

// PID is the storm's root process.
func (s *ForkStorm) PID() int { return s.Proc.Cmd.Process.Pid }

// Go starts the forks.
func (s *ForkStorm) Go() error {
	_, err := io.WriteString(s.start, "go\n")
	return errors.Join(err, s.start.Close())
}

// Rounds waits up to timeout for the storm to end and returns how long
// each of its rounds took (by the storm's own clock, from its first fork
// to its last child reaped).
func (s *ForkStorm) Rounds(timeout time.Duration) ([]time.Duration, error) {
	if err := s.Proc.Wait(timeout); err != nil {
		s.Proc.Stop()
		_, stderr := s.Proc.Output()
		return nil, fmt.Errorf("fork storm: %w: %s", err, strings.TrimSpace(stderr))
	}
	stdout, _ := s.Proc.Output()
	var out []time.Duration
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		secs, ok := strings.CutPrefix(sc.Text(), "round ")
		f, err := strconv.ParseFloat(secs, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("fork storm: unexpected output %q", sc.Text())
		}
		out = append(out, time.Duration(f*float64(time.Second)))
	}
	return out, nil
}

// ForkStormSize is how many forks take about per on this host, measured
// by a storm of calibrationForks in the cgroup directory cg, at least
// minForks: hosts differ by 5× in what a fork costs, and a storm of fixed
// size would measure the host rather than whoever follows its forks.
func ForkStormSize(bins, cg string, per time.Duration) (int, error) {
	const calibrationForks, minForks = 1000, 1000
	s, err := StartForkStorm(bins, cg, calibrationForks, 1)
	if err != nil {
		return 0, err
	}
	if err := s.Go(); err != nil {
		s.Proc.Stop()
		return 0, fmt.Errorf("fork storm: %w", err)
	}
	rounds, err := s.Rounds(time.Minute) // a hang guard: 1000 forks take ~2 s on the slowest host seen
	if err != nil {
		return 0, err
	}
	if len(rounds) != 1 || rounds[0] <= 0 {
		return 0, fmt.Errorf("fork storm: %d rounds reported, want 1", len(rounds))
	}
	return max(minForks, int(float64(calibrationForks)*float64(per)/float64(rounds[0]))), nil
}

// StormRun is what one fork storm of RunForkStorm measured.
type StormRun struct {
	Took time.Duration // its rounds together, by the storm's own clock
	// CPU is the watched process's CPU time over the storm, in cores (0
	// when none was watched).
	CPU float64
}

// RunForkStorm runs a storm of rounds rounds of forks forks in the cgroup
// directory cg and waits for it; attach, when set, is called with the
// storm's pid before it forks, and every, when set, every 250 ms while it
// runs. watch, when not 0, is a process whose CPU over the storm is
// measured (the daemon). Its deadline guards against a hang only: ten
// times what the storm would take at a fork a millisecond, and at least
// two minutes.
func RunForkStorm(bins, cg string, forks, rounds, watch int, attach func(pid int) error, every func()) (StormRun, error) {
	s, err := StartForkStorm(bins, cg, forks, rounds)
	if err != nil {
		return StormRun{}, err
	}
	defer s.Proc.Stop()
	if attach != nil {
		if err := attach(s.PID()); err != nil {
			return StormRun{}, err
		}
	}
	cpu := func() (time.Duration, error) {
		if watch == 0 {
			return 0, nil
		}
		return CPUTime(watch)
	}
	cpu0, err := cpu()
	if err != nil {
		return StormRun{}, err
	}
	start := time.Now()
	if err := s.Go(); err != nil {
		return StormRun{}, fmt.Errorf("fork storm: %w", err)
	}
	for every != nil && !s.Proc.Done() {
		time.Sleep(250 * time.Millisecond)
		every()
	}
	took, err := s.Rounds(max(2*time.Minute, 10*time.Duration(forks*rounds)*time.Millisecond))
	if err != nil {
		return StormRun{}, err
	}
	cpu1, err := cpu()
	if err != nil {
		return StormRun{}, err
	}
	if len(took) != rounds {
		return StormRun{}, fmt.Errorf("fork storm: %d rounds reported, want %d", len(took), rounds)
	}
	run := StormRun{CPU: float64(cpu1-cpu0) / float64(time.Since(start))}
	for _, r := range took {
		run.Took += r
	}
	return run, nil
}
