package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/bpf"
	"github.com/gpuarb/gpuarb/internal/testutil"
)

func TestTenantName(t *testing.T) {
	id := "4f3c2b1a0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a"
	for in, want := range map[string]string{
		"/docker/" + id:                         "4f3c2b1a0d9e",
		"/system.slice/docker-" + id + ".scope": "4f3c2b1a0d9e",
		"/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + id + ".scope": "4f3c2b1a0d9e",
		"/machine.slice/libpod-" + id + ".scope":                              "4f3c2b1a0d9e",
		"/kubepods/besteffort/pod1/" + id:                                     "4f3c2b1a0d9e",
		"/user.slice/user-1000.slice/session-2.scope":                         "session-2.scope",
		"/gpuarb-test/a": "/gpuarb-test/a",
		"/":              "/",
		"":               "?",
	} {
		if got := TenantName(in); got != want {
			t.Errorf("TenantName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLifecycle(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	pins := filepath.Join(bpf.BPFFSPath, "gpuarb-test-"+filepath.Base(dir))
	cfg := Config{
		Socket: filepath.Join(dir, "gpuarb.sock"), PinPath: pins,
		Devices: []bpf.Device{{Major: 1, Minor: 7, Kind: bpf.KindNvidiaCtl}},
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "test",
	}
	d, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(cfg); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second daemon: %v, want ErrAlreadyRunning", err)
	}
	for _, m := range bpf.PinnedMaps() {
		if _, err := os.Stat(filepath.Join(pins, m)); err != nil {
			t.Errorf("map %s not pinned: %v", m, err)
		}
	}
	if fi, err := os.Stat(cfg.Socket); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket: %v %v, want mode 0660", fi, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	st, err := api.NewClient(cfg.Socket).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != "test" || st.Tenants == nil || st.Probes.PinPath != pins || len(st.Probes.Devices) != 1 || st.WindowNS != uint64(time.Second) {
		t.Errorf("status %+v", st)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("daemon did not stop")
	}
	for _, p := range []string{pins, cfg.Socket, filepath.Join(dir, "gpuarb.lock")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", p, err)
		}
	}
	if _, err := api.NewClient(cfg.Socket).Status(context.Background()); !errors.Is(err, api.ErrNoDaemon) {
		t.Errorf("status after stop: %v, want ErrNoDaemon", err)
	}
	// The lock is free again: a new daemon starts.
	d2, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d2.Stop(); err != nil {
		t.Fatal(err)
	}
}
