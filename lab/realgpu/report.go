package realgpu

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Failed counts the steps that failed.
func (r *Report) Failed() int {
	n := 0
	for _, s := range r.Steps {
		if !s.OK {
			n++
		}
	}
	return n
}

// Write puts report.json and report.md into dir, creating it.
func (r *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report.json: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(r.Markdown()), 0o644)
}

// Markdown is the report for people: the host, one line per step, then
// each step's numbers.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# gpuarb real-GPU check, %s\n\n", r.Started.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Written by `gpuarb-lab realgpu` (docs/driver.md §4). Host: kernel %s; %s; %s; PyTorch %s.\n\n",
		r.Host.Kernel, r.Host.Driver, strings.Join(r.Host.GPUs, ", "), r.Host.Torch)
	fmt.Fprintf(&b, "| step | result | what it measured |\n|---|---|---|\n")
	for _, s := range r.Steps {
		res := "ok"
		if !s.OK {
			res = "**failed**: " + s.Error
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", s.Name, cell(res), cell(s.Summary))
	}
	for _, s := range r.Steps {
		v, err := json.MarshalIndent(s.Values, "", "  ")
		if err != nil {
			v = []byte(err.Error())
		}
		fmt.Fprintf(&b, "\n## %s (%.1f s)\n\n```json\n%s\n```\n", s.Name, s.Seconds, v)
	}
	return b.String()
}

func cell(s string) string {
	return strings.NewReplacer("|", "\\|", "\n", " ").Replace(s)
}
