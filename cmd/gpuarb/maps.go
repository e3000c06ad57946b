package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/urfave/cli/v2"

	"github.com/gpuarb/gpuarb/bpf"
)

func mapsCommand() *cli.Command {
	return &cli.Command{
		Name:  "maps",
		Usage: "list gpuarb's pinned BPF maps and the bpftool commands to read them",
		Description: `The daemon pins its maps under the pin path (default /sys/fs/bpf/gpuarb).
Their keys and values carry BTF, so bpftool prints field names:

  bpftool map dump pinned /sys/fs/bpf/gpuarb/gpuarb_cgroups`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "pin-path", Value: bpf.DefaultPinPath, Usage: "where the maps are pinned"},
		},
		Action: func(c *cli.Context) error {
			dir := c.String("pin-path")
			w := c.App.Writer
			fmt.Fprintf(w, "%-16s %-14s %8s %8s  %s\n", "MAP", "TYPE", "ENTRIES", "MAX", "READ WITH")
			found := 0
			for _, name := range bpf.PinnedMaps() {
				path := filepath.Join(dir, name)
				m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
				if errors.Is(err, os.ErrNotExist) {
					fmt.Fprintf(w, "%-16s %-14s %8s %8s  (not pinned)\n", name, "-", "-", "-")
					continue
				}
				if err != nil {
					return fmt.Errorf("open pinned map %s: %w", path, err)
				}
				found++
				entries := "-"
				if m.Type() != ebpf.RingBuf {
					entries = fmt.Sprint(countEntries(m))
				}
				fmt.Fprintf(w, "%-16s %-14s %8s %8d  bpftool map dump pinned %s\n", name, m.Type(), entries, m.MaxEntries(), path)
				m.Close()
			}
			if found == 0 {
				fmt.Fprintf(w, "\nnothing is pinned under %s: is the daemon running?\n", dir)
			}
			return nil
		},
	}
}

func countEntries(m *ebpf.Map) int {
	n := 0
	key := make([]byte, m.KeySize())
	val := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&key, &val) {
		n++
	}
	return n
}
