package arbiter

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The arbiter is a pure function of its inputs: it reads no clock and
// touches nothing of the host (those are the daemon's and enforce's), so
// that a decision can be replayed and tested without waiting.
func TestArbiterReadsNoClockAndTouchesNoHost(t *testing.T) {
	forbidden := []string{"time", "os", "os/exec", "syscall", "net", "golang.org/x/sys/unix",
		"github.com/gpuarb/gpuarb/cgroup", "github.com/gpuarb/gpuarb/bpf", "github.com/gpuarb/gpuarb/gpusched", "github.com/gpuarb/gpuarb/enforce"}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, bad := range forbidden {
				if path == bad {
					t.Errorf("%s imports %s", name, path)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source files read")
	}
}
