package lockcheck

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// The check finds exactly the calls marked "// I/O" in its test package:
// direct, through the package's own functions, passed as a function
// parameter, on a branch, and a sleep; none after an Unlock, in a
// returned closure, in a goroutine or under another mutex.
func TestFindsTheIOUnderTheLock(t *testing.T) {
	const file = "testdata/locked/locked.go"
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var want []int
	for i, line := range strings.Split(string(src), "\n") {
		if strings.HasSuffix(line, "// I/O") {
			want = append(want, i+1)
		}
	}
	findings, err := Check(".", Lock{Package: "github.com/gpuarb/gpuarb/internal/lockcheck/testdata/locked", Type: "Server", Field: "mu"}, "./testdata/locked")
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, f := range findings {
		got = append(got, f.Pos.Line)
		t.Log(f)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("findings on lines %v, want %v", got, want)
	}
}

// A package that does not load is an error, not a clean result.
func TestRefusesWhatDoesNotLoad(t *testing.T) {
	if _, err := Check(".", Lock{Package: "example.com/none", Type: "T", Field: "mu"}, "./testdata/none"); err == nil {
		t.Error("no error for a missing package")
	}
}
