package lab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ProgramRuns are the kernel's run statistics summed over BPF programs.
type ProgramRuns struct {
	Count uint64        // runs
	Time  time.Duration // time spent in the programs themselves, not in the trap that ran them
}

// EnableBPFStats turns on the kernel's per-program run statistics
// (kernel.bpf_stats_enabled) until the returned closer is closed.
func EnableBPFStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable BPF run statistics: %w", err)
	}
	return c, nil
}

// BPFProgramRuns sums the run statistics of the loaded BPF programs whose
// kernel name (at most 15 characters) starts with prefix.
func BPFProgramRuns(prefix string) (ProgramRuns, error) {
	var sum ProgramRuns
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return sum, nil
		}
		if err != nil {
			return sum, fmt.Errorf("list BPF programs: %w", err)
		}
		id = next
		prog, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded since it was listed
		}
		info, err := prog.Info()
		if err != nil || !strings.HasPrefix(info.Name, prefix) {
			prog.Close()
			continue
		}
		st, err := prog.Stats()
		prog.Close()
		if err != nil {
			return sum, fmt.Errorf("BPF program %s: %w", info.Name, err)
		}
		sum.Count += st.RunCount
		sum.Time += st.Runtime
	}
}
