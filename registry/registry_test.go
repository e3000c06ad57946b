package registry

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuarb/gpuarb/policy"
)

// Entries survive a save and a load in attach order; a replaced entry
// keeps its place; only a change leaves something unsaved.
func TestEntriesSurviveALoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "attached.json")
	r, err := Load(path)
	if err != nil || len(r.Entries()) != 0 {
		t.Fatalf("a missing file: %v, %d entries", err, len(r.Entries()))
	}
	if data, err := r.Unsaved(); data != nil || err != nil {
		t.Fatalf("unchanged registry has unsaved data %q (%v)", data, err)
	}
	r.Set(Entry{Tenant: policy.Tenant{Name: "a", Selector: policy.Selector{Cgroup: "/a"}}})
	r.Set(Entry{Tenant: policy.Tenant{Name: "b", Selector: policy.Selector{Cgroup: "/b"}}, Owner: "ctr", Via: ViaNRI})
	r.Set(Entry{Tenant: policy.Tenant{Name: "a", Selector: policy.Selector{Cgroup: "/a2"}}})
	data, err := r.Unsaved()
	if err != nil || data == nil {
		t.Fatalf("changed registry: %q, %v", data, err)
	}
	if again, _ := r.Unsaved(); again != nil {
		t.Error("unsaved twice")
	}
	if err := r.Write(data); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	got := back.Entries()
	if len(got) != 2 || got[0].Name != "a" || got[0].Cgroup != "/a2" || got[1].Owner != "ctr" || got[1].Via != ViaNRI {
		t.Fatalf("loaded %+v", got)
	}
	if !back.Remove("a") || back.Remove("a") {
		t.Error("remove: want true once, then false")
	}
	if _, ok := back.Get("b"); !ok {
		t.Error("b is gone")
	}
}

// A file that does not parse is an error a caller can tell apart.
func TestUnreadableFileIsNamedSo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "attached.json")
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := Load(path)
	if !errors.Is(err, ErrUnreadable) || r == nil || r.Path() != path {
		t.Fatalf("Load: %v, %v", r, err)
	}
}
