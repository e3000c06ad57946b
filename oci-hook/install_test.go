package ocihook

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
)

func TestSpecHooksRoundTrip(t *testing.T) {
	h := HookCommand{Binary: "/usr/local/bin/gpuarb", Socket: "/run/x.sock", FailClosed: true}
	orig := `{"ociVersion":"1.2.0","process":{"args":["sh"]},"x-unknown":{"kept":true},
		"hooks":{"poststop":[{"path":"/bin/other","args":["other"]}]}}`
	out, err := h.AddToSpec([]byte(orig))
	if err != nil {
		t.Fatal(err)
	}
	// Twice is the same as once.
	if out2, err := h.AddToSpec(out); err != nil || string(out2) != string(out) {
		t.Fatalf("not idempotent: %v\n%s\n%s", err, out, out2)
	}
	var spec struct {
		specs.Spec
		Unknown map[string]bool `json:"x-unknown"`
	}
	if err := json.Unmarshal(out, &spec); err != nil {
		t.Fatal(err)
	}
	if !spec.Unknown["kept"] || spec.Process.Args[0] != "sh" {
		t.Errorf("other fields lost: %s", out)
	}
	hooks := spec.Hooks
	if len(hooks.Prestart) != 1 || len(hooks.Poststop) != 2 || hooks.Poststop[0].Path != "/bin/other" {
		t.Fatalf("hooks: %+v", hooks)
	}
	want := []string{"gpuarb", "oci-hook", "--socket", "/run/x.sock", "--fail-closed", "prestart"}
	if hooks.Prestart[0].Path != h.Binary || !slices.Equal(hooks.Prestart[0].Args, want) || *hooks.Prestart[0].Timeout != hookTimeout {
		t.Errorf("prestart hook %+v", hooks.Prestart[0])
	}
	back, err := RemoveFromSpec(out)
	if err != nil {
		t.Fatal(err)
	}
	var after struct {
		specs.Spec
		Unknown map[string]bool `json:"x-unknown"`
	}
	if err := json.Unmarshal(back, &after); err != nil {
		t.Fatal(err)
	}
	if len(after.Hooks.Prestart) != 0 || len(after.Hooks.Poststop) != 1 || !after.Unknown["kept"] {
		t.Errorf("after removal: %s", back)
	}
	if _, err := h.AddToSpec([]byte(`{"hooks":{}}`)); err == nil || !strings.Contains(err.Error(), "ociVersion") {
		t.Errorf("a non-spec document: %v", err)
	}
}

func TestHooksDInstall(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hooks.d")
	h := HookCommand{Binary: "/usr/bin/gpuarb"}
	files, err := h.InstallHooksD(dir, true)
	if err != nil || len(files) != 2 {
		t.Fatal(files, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "gpuarb-register.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Version string     `json:"version"`
		Hook    specs.Hook `json:"hook"`
		When    struct {
			Always      bool              `json:"always"`
			Annotations map[string]string `json:"annotations"`
		} `json:"when"`
		Stages []string `json:"stages"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Version != "1.0.0" || doc.Hook.Path != "/usr/bin/gpuarb" || !slices.Equal(doc.Stages, []string{"prestart"}) ||
		doc.When.Always || doc.When.Annotations[`^gpuarb\.io/`] != ".*" || doc.Hook.Args[len(doc.Hook.Args)-1] != "prestart" {
		t.Errorf("register hook: %s", b)
	}
	removed, err := UninstallHooksD(dir)
	if err != nil || len(removed) != 2 {
		t.Errorf("uninstall: %v %v", removed, err)
	}
	if removed, err := UninstallHooksD(dir); err != nil || len(removed) != 0 {
		t.Errorf("second uninstall: %v %v", removed, err)
	}
}
