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

// DrainSpool hands over every registration once, reports the file that
// does not parse, and leaves nothing behind; a spool others may write is
// not read at all.
func TestDrainSpoolReadsEachOnceAndRefusesAnOpenSpool(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	for _, owner := range []string{"container x", "container y"} {
		if err := Spool(dir, Spooled{Owner: owner, Tenant: json.RawMessage(`{"name":"n"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	owners, bad := map[string]bool{}, 0
	err := DrainSpool(dir, func(_ string, s Spooled, err error) {
		if err != nil {
			bad++
			return
		}
		owners[s.Owner] = true
	})
	if err != nil || len(owners) != 2 || bad != 1 {
		t.Fatalf("drained %v with %d unreadable, err %v", owners, bad, err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("%d files left in the spool", len(left))
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := DrainSpool(dir, func(string, Spooled, error) { t.Error("read an open spool") }); err == nil {
		t.Error("an open spool: no error")
	}
}
