package main

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gpuarb/gpuarb/meter"
	"github.com/urfave/cli/v2"
)

func replayMeterCommand() *cli.Command {
	return &cli.Command{
		Name:      "replay-meter",
		Usage:     "replay a meter recording (gpuarb daemon --record-meter, fuzz --record-meter) and print what the meter read every second",
		ArgsUsage: "RECORDING",
		Description: `replay-meter feeds a recording of the meter's inputs to a meter of this
build and prints, every --every of the recording's clock, each tenant's
estimated share of the GPU and each of its processes' launches, estimated GPU
ms a launch, drains (the times its modeled work ran out), the mean of its last
bursts and the turn in progress (what the control step sizes the others'
timeslices by) and how much of the last second it wanted the GPU (the demand
evidence: waits, work queued, stops). A misreading seen once in a live
run replays the same every time, and a change to the meter is tried against it
in seconds. A RECORDING whose name ends in .gz is read through gzip
(recordings shrink about 17-fold). --status
names the tenants from the fuzzer's status log of the same run
(seed-N-status.jsonl); without it they are cgroup IDs. --proofs PID also
prints, as they come, the proofs of that process's work: how long it waited,
what the replay ran and still had queued of the proven work, what the proof
taught and the cost of a launch after it, or why it taught nothing (the
replay had not begun the work, the process was stopped, the work was unseen)
and what the replay dropped. Needs no root.`,
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "every", Value: time.Second, Usage: "print every `INTERVAL` of the recording's clock"},
			&cli.StringFlag{Name: "status", Usage: "name the tenants from the fuzzer's status log `FILE` (seed-N-status.jsonl)"},
			&cli.UintFlag{Name: "proofs", Usage: "also print every proof of process `PID`'s work: what it taught, or why nothing"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("give one recording (gpuarb daemon --record-meter FILE)")
			}
			names := map[uint64]string{}
			if p := c.String("status"); p != "" {
				var err error
				if names, err = tenantNames(p); err != nil {
					return err
				}
			}
			f, err := os.Open(c.Args().First())
			if err != nil {
				return err
			}
			defer f.Close()
			var rec io.Reader = f
			if strings.HasSuffix(f.Name(), ".gz") {
				gz, err := gzip.NewReader(f)
				if err != nil {
					return fmt.Errorf("%s: %w", f.Name(), err)
				}
				rec = gz
			}
			return replayMeter(c.App.Writer, rec, c.Duration("every"), names, uint32(c.Uint("proofs")))
		},
	}
}

// replayMeter plays a recording and prints the meter's figures every
// interval of its clock, and the proofs of process pid where it is not 0.
func replayMeter(w io.Writer, rec io.Reader, every time.Duration, names map[uint64]string, pid uint32) error {
	var start, next uint64
	o := meter.PlayOptions{}
	if pid != 0 {
		o.Proofs = func(p meter.Proof) {
			if p.PID != pid {
				return
			}
			if start == 0 { // times count from the first figures or proof
				start, next = p.At, p.At+uint64(every)
			}
			kind := "proof"
			if p.First {
				kind = "first proof"
			}
			if p.Skipped != "" {
				fmt.Fprintf(w, "%9.4fs pid %d proof of its %s taught nothing (%s): waited %.3f ms, the replay ran %.3f ms of it and dropped the %.3f ms left\n",
					float64(p.At-start)/1e9, p.PID, p.Of, p.Skipped, float64(p.WaitNS)/1e6, p.RanNS/1e6, p.LeftNS/1e6)
				return
			}
			fmt.Fprintf(w, "%9.4fs pid %d %s of its %s: waited %.3f ms, the replay ran %.3f ms of it and had %.3f ms left (its turn part %.2f); taught %+.3f ms, a launch costs %.3f ms\n",
				float64(p.At-start)/1e9, p.PID, kind, p.Of, float64(p.WaitNS)/1e6, p.RanNS/1e6, p.LeftNS/1e6, p.TurnPart, p.LateNS/1e6, p.LaunchNS/1e6)
		}
	}
	o.Settled = func(m *meter.Meter, at uint64) {
		if start == 0 {
			start, next = at, at+uint64(every)
		}
		if at < next {
			return
		}
		next = at + uint64(every)
		_, ctxs := m.Contexts(time.Second)
		shares := map[uint64]float64{}
		per := map[uint64][]string{}
		for _, cs := range ctxs {
			shares[cs.CgroupID] += cs.Share
			launch := 0.0
			if cs.Launches > 0 {
				launch = float64(cs.GPUNS) / float64(cs.Launches) / 1e6
			}
			per[cs.CgroupID] = append(per[cs.CgroupID], fmt.Sprintf("pid %d %d launches %.3f ms each, %d drains (last bursts %.2f ms, turn in progress %.2f ms), wanted the GPU %.1f%% of the second",
				cs.PID, cs.Launches, launch, cs.Drains, float64(cs.RecentBurstNS)/1e6, float64(cs.RunNS)/1e6, 100*float64(cs.WantNS)/float64(time.Second)))
		}
		ids := make([]uint64, 0, len(shares))
		for id := range shares {
			ids = append(ids, id)
		}
		slices.SortFunc(ids, func(a, b uint64) int { return strings.Compare(name(names, a), name(names, b)) })
		fmt.Fprintf(w, "%7.1fs", float64(at-start)/1e9)
		for _, id := range ids {
			fmt.Fprintf(w, " | %s %5.1f%%", name(names, id), 100*shares[id])
		}
		fmt.Fprintln(w)
		for _, id := range ids {
			slices.Sort(per[id])
			fmt.Fprintf(w, "          %s: %s\n", name(names, id), strings.Join(per[id], "; "))
		}
	}
	if _, err := meter.Play(bufio.NewReaderSize(rec, 1<<20), o); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

// name is a tenant's name, or its cgroup ID where none is known.
func name(names map[uint64]string, id uint64) string {
	if n, ok := names[id]; ok {
		return n
	}
	return fmt.Sprintf("cgroup %d", id)
}

// tenantNames reads the tenants' cgroup IDs and names from a fuzzer
// status log.
func tenantNames(path string) (map[uint64]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names := map[uint64]string{}
	dec := json.NewDecoder(f)
	for {
		var row struct {
			Status struct {
				Tenants []struct {
					Name     string `json:"name"`
					CgroupID uint64 `json:"cgroup_id"`
				} `json:"tenants"`
			} `json:"status"`
		}
		if err := dec.Decode(&row); err == io.EOF {
			return names, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, t := range row.Status.Tenants {
			if t.CgroupID != 0 {
				names[t.CgroupID] = t.Name
			}
		}
	}
}
