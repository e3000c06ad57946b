// Package api is the daemon's local API: the JSON documents it serves on its
// Unix socket and a client for the CLI and the hooks.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// DefaultSocket is where the daemon serves its API.
const DefaultSocket = "/run/gpuarb/gpuarb.sock"

// StatusPath is the endpoint of the status document.
const StatusPath = "/v1/status"

// Tenant is one tenant on one GPU as `gpuarb status --json` prints it.
type Tenant struct {
	Name         string  `json:"name"`
	Cgroup       string  `json:"cgroup"`
	CgroupID     uint64  `json:"cgroup_id"`
	GPU          int     `json:"gpu"`
	Share        float64 `json:"share"` // fraction of the GPU's time in the last window, 0..1
	GPUNS        uint64  `json:"gpu_ns"`
	LongRunShare float64 `json:"long_run_share"`
	LaunchesPerS float64 `json:"launches_per_s"`
	SyncsPerS    float64 `json:"syncs_per_s"`
	MemBytes     int64   `json:"mem_bytes"`
	QueueNS      uint64  `json:"queue_ns"` // estimated time with work queued behind others, in the window
	Processes    int     `json:"processes"`
	State        string  `json:"state"` // running (has GPU work) | idle
	// ExactShare is the share an exact source (Status.ExactSource)
	// measured over its last interval, where the host has one.
	ExactShare *float64 `json:"exact_share,omitempty"`
}

// GPU is one GPU's figures.
type GPU struct {
	Index     int     `json:"index"`
	BusyShare float64 `json:"busy_share"`
	Tenants   int     `json:"tenants"`
}

// Probes describes the probe layer behind the figures.
type Probes struct {
	Libcudas   []string `json:"libcudas"`
	Devices    []string `json:"devices"`
	Events     uint64   `json:"events"`
	LostEvents uint64   `json:"lost_events"`
	PinPath    string   `json:"pin_path"`
}

// Status is the daemon's status document.
type Status struct {
	Version  string   `json:"version"`
	WindowNS uint64   `json:"window_ns"`
	Tenants  []Tenant `json:"tenants"`
	GPUs     []GPU    `json:"gpus"`
	Probes   Probes   `json:"probes"`
	// ExactSource names the exact per-process source in use, if any.
	ExactSource string `json:"exact_source,omitempty"`
}

// ErrNoDaemon is returned when nothing serves the socket.
var ErrNoDaemon = errors.New("gpuarb daemon is not running")

// Client talks to the daemon over its Unix socket.
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client for the daemon at socket ("" for the default).
func NewClient(socket string) *Client {
	if socket == "" {
		socket = DefaultSocket
	}
	return &Client{socket: socket, http: &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}}
}

// Status fetches the status document.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://gpuarb"+StatusPath, nil)
	if err != nil {
		return st, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ne *net.OpError
		if errors.As(err, &ne) && ne.Op == "dial" {
			return st, fmt.Errorf("%w (socket %s): start it with `gpuarb daemon`", ErrNoDaemon, c.socket)
		}
		return st, fmt.Errorf("status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status: daemon answered %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("status: decode: %w", err)
	}
	return st, nil
}
