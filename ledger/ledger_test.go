package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

type rec struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

var (
	bare    = Format[rec]{Key: func(r rec) string { return r.Name }}
	wrapped = Format[rec]{Field: "records", Key: func(r rec) string { return r.Name }}
)

// A set's records are on disk once Add returns, in either file shape, and
// a reopened ledger holds what the last write left; a record already
// there is not added twice.
func TestRecordsSurviveAReopen(t *testing.T) {
	for _, f := range []Format[rec]{bare, wrapped} {
		path := filepath.Join(t.TempDir(), "l.json")
		s, err := Open(path, f)
		if err != nil || len(s.Records()) != 0 {
			t.Fatalf("field %q: open a missing file: %v", f.Field, err)
		}
		if err := s.Add(rec{"b", 2}, rec{"a", 1}, rec{"a", 9}); err != nil {
			t.Fatal(err)
		}
		if err := s.Remove(rec{"b", 0}); err != nil {
			t.Fatal(err)
		}
		if err := s.Add(rec{"c", 3}); err != nil {
			t.Fatal(err)
		}
		again, err := Open(path, f)
		if err != nil {
			t.Fatal(err)
		}
		got := again.Records()
		if len(got) != 2 || got[0] != (rec{"a", 1}) || got[1] != (rec{"c", 3}) {
			t.Errorf("field %q: reopened %+v, want a:1 and c:3", f.Field, got)
		}
	}
}

// A file that does not parse is set aside and the ledger starts empty
// with an error saying so; an empty file is no records.
func TestUnreadableFileIsSetAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "l.json")
	if err := os.WriteFile(path, []byte("{broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, wrapped)
	if !errors.Is(err, ErrUnreadable) || s == nil || len(s.Records()) != 0 {
		t.Fatalf("open a broken file: %v", err)
	}
	if _, err := os.Stat(path + ".bad"); err != nil {
		t.Errorf("not set aside: %v", err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if list, err := wrapped.Read(path); err != nil || len(list) != 0 {
		t.Errorf("an empty file: %v, %v", list, err)
	}
}

// A write that fails records nothing: Add leaves the set as it was, and
// Write of no records removes the file.
func TestFailedWriteRecordsNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "l.json")
	s, err := Open(path, bare)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(path, "inside"), 0o700); err != nil { // the file cannot be replaced
		t.Fatal(err)
	}
	if err := s.Add(rec{"a", 1}); err == nil || len(s.Records()) != 0 {
		t.Errorf("add with its file blocked: %v, records %v", err, s.Records())
	}
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	if err := bare.Write(path, []rec{{"a", 1}}); err != nil {
		t.Fatal(err)
	}
	if err := bare.Write(path, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("no records left the file: %v", err)
	}
}
