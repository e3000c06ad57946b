package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/metrics"
)

func (d *Daemon) listen() error {
	_ = os.Remove(d.cfg.Socket) // the lock is ours: a socket left here is stale
	ln, err := net.Listen("unix", d.cfg.Socket)
	if err != nil {
		return fmt.Errorf("listen %s: %w", d.cfg.Socket, err)
	}
	if err := os.Chmod(d.cfg.Socket, 0o660); err != nil {
		ln.Close()
		return fmt.Errorf("chmod %s: %w", d.cfg.Socket, err)
	}
	d.listener = ln
	mux := http.NewServeMux()
	d.routes(mux)
	d.server = boundedServer(mux)
	d.server.ConnContext = api.PeerCred
	return nil
}

// boundedServer serves h with every phase of a connection bounded: a
// client that sends slowly, reads slowly or idles is cut off, so no one
// who can reach the API or the metrics port holds the daemon's
// connections, goroutines and descriptors. The bounds are far above what
// a request takes (a status of 1000 tenants: milliseconds) and what a
// client waits between its requests (gpuarb top: 1 s; a scrape
// reconnects if its interval is longer).
func boundedServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       10 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
}

// listenMetrics opens the Prometheus endpoint when one is configured.
func (d *Daemon) listenMetrics() error {
	if d.cfg.MetricsAddr == "" {
		return nil
	}
	addr, err := metrics.ListenAddr(d.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("metrics address %q: %w", d.cfg.MetricsAddr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen %s: %w", addr, err)
	}
	d.metricsListener = ln
	d.metricsServer = boundedServer(metrics.Handler(d.Status))
	d.log.Info("serving metrics", "url", "http://"+ln.Addr().String()+metrics.Path)
	return nil
}

// shutdownGrace is how long the API and metrics servers' requests in
// flight get to finish when the daemon stops.
const shutdownGrace = 2 * time.Second

// shutdown stops an HTTP server: requests in flight get shutdownGrace to
// finish, then every connection is closed. net/http counts a connection
// that has sent no request yet as busy for 5 s, so a client that dialled
// one more connection than it used (16 attaches at once did) would
// otherwise fail the daemon's stop.
func (d *Daemon) shutdown(name string, s *http.Server) error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	err := s.Shutdown(ctx)
	if err == nil {
		return nil
	}
	d.log.Warn("stop: connections still open after the grace period, closed", "server", name, "err", err)
	if err := s.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("stop the %s server: %w", name, err)
	}
	return nil
}
