package ocihook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/gpuarb/gpuarb/internal/atomicfile"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// HookCommand is how a runtime calls the hook.
type HookCommand struct {
	// Binary is the absolute path of the gpuarb binary.
	Binary string
	// Socket is the daemon's socket ("" for the default).
	Socket string
	// FailClosed and DefaultOnBadPolicy are passed on as flags.
	FailClosed, DefaultOnBadPolicy bool
}

// RegisterStage is the stage registration runs at in generated configs:
// prestart, which every runtime calls (createRuntime is newer and not
// known to older CRI-O and podman releases).
const RegisterStage = Prestart

// hookTimeout is the runtime's own limit on the hook, in seconds; the
// hook itself returns within 1 s.
const hookTimeout = 5

// Hook returns the OCI hook entry for stage.
func (h HookCommand) Hook(stage Stage) specs.Hook {
	args := []string{"gpuarb", "oci-hook"}
	if h.Socket != "" {
		args = append(args, "--socket", h.Socket)
	}
	if h.FailClosed {
		args = append(args, "--fail-closed")
	}
	if h.DefaultOnBadPolicy {
		args = append(args, "--default-on-bad-policy")
	}
	t := hookTimeout
	return specs.Hook{Path: h.Binary, Args: append(args, string(stage)), Timeout: &t}
}

// hooksDFile is the hooks.d (version 1.0.0) format that CRI-O and podman
// read from /etc/containers/oci/hooks.d.
type hooksDFile struct {
	Version string     `json:"version"`
	Hook    specs.Hook `json:"hook"`
	When    hooksDWhen `json:"when"`
	Stages  []string   `json:"stages"`
}

type hooksDWhen struct {
	Always      bool              `json:"always,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// hooksDNames are the files gpuarb writes in a hooks.d directory.
var hooksDNames = map[Stage]string{RegisterStage: "gpuarb-register.json", Poststop: "gpuarb-unregister.json"}

// HooksD returns the hooks.d documents by file name. With annotatedOnly
// the runtime calls the hook only for containers with a gpuarb.io/*
// annotation; otherwise for every container (each becomes a tenant named
// by its id).
func (h HookCommand) HooksD(annotatedOnly bool) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, stage := range []Stage{RegisterStage, Poststop} {
		f := hooksDFile{Version: "1.0.0", Hook: h.Hook(stage), Stages: []string{string(stage)}}
		if annotatedOnly {
			f.When.Annotations = map[string]string{`^gpuarb\.io/`: ".*"}
		} else {
			f.When.Always = true
		}
		b, err := json.MarshalIndent(f, "", "  ")
		if err != nil {
			return nil, err
		}
		out[hooksDNames[stage]] = append(b, '\n')
	}
	return out, nil
}

// InstallHooksD writes the hooks.d files into dir.
func (h HookCommand) InstallHooksD(dir string, annotatedOnly bool) ([]string, error) {
	docs, err := h.HooksD(annotatedOnly)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("hooks dir: %w", err)
	}
	var written []string
	for name, b := range docs {
		p := filepath.Join(dir, name)
		if err := writeFileAtomic(p, b); err != nil {
			return written, err
		}
		written = append(written, p)
	}
	slices.Sort(written)
	return written, nil
}

// UninstallHooksD removes the files InstallHooksD writes; absent ones are
// not an error.
func UninstallHooksD(dir string) ([]string, error) {
	var removed []string
	var errs []error
	for _, name := range hooksDNames {
		p := filepath.Join(dir, name)
		switch err := os.Remove(p); {
		case err == nil:
			removed = append(removed, p)
		case !errors.Is(err, os.ErrNotExist):
			errs = append(errs, err)
		}
	}
	slices.Sort(removed)
	return removed, errors.Join(errs...)
}

// AddToSpec adds the register and unregister hooks to an OCI runtime spec
// (a bundle's config.json or containerd's base runtime spec), replacing
// earlier gpuarb entries, and keeps every other field as it was.
func (h HookCommand) AddToSpec(doc []byte) ([]byte, error) {
	return editSpecHooks(doc, func(hooks *specs.Hooks) {
		removeOurs(hooks)
		hooks.Prestart = append(hooks.Prestart, h.Hook(RegisterStage))
		hooks.Poststop = append(hooks.Poststop, h.Hook(Poststop))
	})
}

// AddToBaseSpec is AddToSpec for containerd's base runtime spec, which
// also drops process.rlimits: containerd applies a base spec's rlimits to
// every pod of its runtime handler (the `ctr oci spec` default holds
// RLIMIT_NOFILE 1024), where pods without one keep containerd's own. It
// returns the rlimits it dropped, as the spec wrote them ("" for none).
func (h HookCommand) AddToBaseSpec(doc []byte) (out []byte, dropped string, err error) {
	out, err = h.AddToSpec(doc)
	if err != nil {
		return nil, "", err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, "", fmt.Errorf("runtime spec: %w", err)
	}
	var process map[string]json.RawMessage
	if p, ok := raw["process"]; ok {
		if err := json.Unmarshal(p, &process); err != nil {
			return nil, "", fmt.Errorf("runtime spec: process: %w", err)
		}
	}
	rl, ok := process["rlimits"]
	if !ok {
		return out, "", nil
	}
	delete(process, "rlimits")
	if raw["process"], err = json.Marshal(process); err != nil {
		return nil, "", err
	}
	if out, err = json.MarshalIndent(raw, "", "\t"); err != nil {
		return nil, "", err
	}
	var compact bytes.Buffer
	if json.Compact(&compact, rl) == nil {
		dropped = compact.String()
	}
	return append(out, '\n'), dropped, nil
}

// RemoveFromSpec removes gpuarb's hooks from an OCI runtime spec.
func RemoveFromSpec(doc []byte) ([]byte, error) {
	return editSpecHooks(doc, removeOurs)
}

// editSpecHooks rewrites only the "hooks" member of a spec document, so
// fields this version of runtime-spec does not know survive.
func editSpecHooks(doc []byte, edit func(*specs.Hooks)) ([]byte, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(doc, &raw); err != nil {
		return nil, fmt.Errorf("runtime spec: %w", err)
	}
	if _, ok := raw["ociVersion"]; !ok {
		return nil, errors.New("runtime spec: no ociVersion: not an OCI runtime spec")
	}
	var hooks specs.Hooks
	if h, ok := raw["hooks"]; ok {
		if err := json.Unmarshal(h, &hooks); err != nil {
			return nil, fmt.Errorf("runtime spec: hooks: %w", err)
		}
	}
	edit(&hooks)
	b, err := json.Marshal(hooks)
	if err != nil {
		return nil, err
	}
	if string(b) == "{}" {
		delete(raw, "hooks")
	} else {
		raw["hooks"] = b
	}
	out, err := json.MarshalIndent(raw, "", "\t")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

func removeOurs(h *specs.Hooks) {
	ours := func(x specs.Hook) bool { return len(x.Args) >= 2 && x.Args[0] == "gpuarb" && x.Args[1] == "oci-hook" }
	h.Prestart = slices.DeleteFunc(h.Prestart, ours)
	h.CreateRuntime = slices.DeleteFunc(h.CreateRuntime, ours)
	h.Poststart = slices.DeleteFunc(h.Poststart, ours)
	h.Poststop = slices.DeleteFunc(h.Poststop, ours)
}

// EditSpecFile applies AddToSpec, AddToBaseSpec or RemoveFromSpec to a
// file in place.
func EditSpecFile(path string, edit func([]byte) ([]byte, error)) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := edit(doc)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return writeFileAtomic(path, out)
}

func writeFileAtomic(path string, b []byte) error {
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	return atomicfile.Write(path, b, mode)
}
