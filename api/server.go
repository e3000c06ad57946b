package api

import (
	"context"
	"net"
	"net/http"

	"golang.org/x/sys/unix"
)

type credKey struct{}

// PeerCred stores the connecting process's credentials (SO_PEERCRED) in
// the request context: an http.Server's ConnContext on the API's Unix
// socket, for RootOnly.
func PeerCred(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *unix.Ucred
	_ = raw.Control(func(fd uintptr) {
		cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cred == nil {
		return ctx
	}
	return context.WithValue(ctx, credKey{}, cred)
}

// RootOnly refuses requests from processes not running as root (as
// PeerCred found them; none found: refused).
func RootOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		cred, _ := r.Context().Value(credKey{}).(*unix.Ucred)
		if cred == nil || cred.Uid != 0 {
			http.Error(w, "changes require root", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}
