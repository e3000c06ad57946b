package bpf

import (
	"strings"
	"testing"
)

// The roles the decoders read are the ones the symbols name: a sync or
// query of a stream or an event, an asynchronous copy, a capture's start,
// a free.
func TestEntryPointRolesMatchTheirSymbols(t *testing.T) {
	for _, e := range EntryPoints {
		want := OnContext
		switch {
		case strings.HasPrefix(e.Symbol, "cuStream"):
			want = OnStream
		case strings.HasPrefix(e.Symbol, "cuEvent"):
			want = OnEvent
		}
		if e.Class != ClassSync && e.Class != ClassQuery {
			want = OnContext
		}
		if e.On != want {
			t.Errorf("%s waits on %d, want %d", e.Symbol, e.On, want)
		}
		if got := e.Class == ClassCopy && strings.Contains(e.Symbol, "Async"); e.Async != got {
			t.Errorf("%s: Async %v", e.Symbol, e.Async)
		}
		if got := e.Class == ClassCapture && strings.Contains(e.Symbol, "BeginCapture"); e.Begins != got {
			t.Errorf("%s: Begins %v", e.Symbol, e.Begins)
		}
		if got := e.Class == ClassMemory && strings.Contains(e.Symbol, "Free"); e.Frees != got {
			t.Errorf("%s: Frees %v", e.Symbol, e.Frees)
		}
	}
}
