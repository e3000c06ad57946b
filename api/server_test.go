package api

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// PeerCred reads the connecting process's uid from a real Unix socket, and
// RootOnly lets root through and refuses anyone else or no credentials.
func TestRootOnlyTrustsTheSocketsPeer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := net.Dial("unix", path)
		if err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := PeerCred(context.Background(), c)
	cred, _ := ctx.Value(credKey{}).(*unix.Ucred)
	if cred == nil || int(cred.Uid) != os.Getuid() || int(cred.Pid) != os.Getpid() {
		t.Fatalf("peer credentials %+v, want uid %d pid %d", cred, os.Getuid(), os.Getpid())
	}
	ok := RootOnly(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	for _, tc := range []struct {
		what string
		ctx  context.Context
		want int
	}{
		{"root", context.WithValue(context.Background(), credKey{}, &unix.Ucred{Uid: 0}), http.StatusNoContent},
		{"a user", context.WithValue(context.Background(), credKey{}, &unix.Ucred{Uid: 1000}), http.StatusForbidden},
		{"no credentials", context.Background(), http.StatusForbidden},
	} {
		rec := httptest.NewRecorder()
		ok(rec, httptest.NewRequest("POST", "/x", nil).WithContext(tc.ctx))
		if rec.Code != tc.want {
			t.Errorf("%s: %d, want %d", tc.what, rec.Code, tc.want)
		}
	}
}
