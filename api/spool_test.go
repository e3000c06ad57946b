package api

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A registration is spooled once per owner, replaced by the owner's next,
// removed by Unspool; a spool that is a link, or a registration over the
// bound, is refused.
func TestSpoolKeepsOneRegistrationPerOwner(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "spool")
	for _, body := range []string{`{"name":"a"}`, `{"name":"b"}`} {
		if err := Spool(dir, Spooled{Owner: "container x", Tenant: json.RawMessage(body)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := Spool(dir, Spooled{Owner: "container y", Tenant: json.RawMessage(`{"name":"y"}`)}); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 2 {
		t.Fatalf("spool holds %v, want one file per owner", files)
	}
	data, err := os.ReadFile(spoolFile(dir, "container x"))
	if err != nil || !strings.Contains(string(data), `"b"`) {
		t.Errorf("owner x's registration: %s %v, want the later one", data, err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("spool mode %v %v, want 0700", st.Mode(), err)
	}
	if err := Unspool(dir, "container x"); err != nil {
		t.Fatal(err)
	}
	if err := Unspool(dir, "container x"); err != nil {
		t.Errorf("unspooling what is not spooled: %v", err)
	}
	if _, err := os.Stat(spoolFile(dir, "container x")); !os.IsNotExist(err) {
		t.Errorf("unspooled registration still there: %v", err)
	}

	big := Spooled{Owner: "container z", Tenant: json.RawMessage(`"` + strings.Repeat("x", MaxSpooled) + `"`)}
	if err := Spool(dir, big); err == nil {
		t.Error("a registration over MaxSpooled was spooled")
	}
	link := filepath.Join(t.TempDir(), "spool")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	if err := Spool(link, Spooled{Owner: "container x", Tenant: json.RawMessage(`{}`)}); err == nil {
		t.Error("spooled through a symbolic link")
	}
}
