// Package api is the daemon's local API: the JSON documents it serves on its
// Unix socket and a client for the CLI and the hooks.
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"time"
)

// DefaultSocket is where the daemon serves its API.
const DefaultSocket = "/run/gpuarb/gpuarb.sock"

// StatusPath is the endpoint of the status document.
const StatusPath = "/v1/status"

// Tenant is one tenant on one GPU as `gpuarb status --json` prints it.
type Tenant struct {
	// Name is the tenant's key: a policy entry's or an attachment's name,
	// else (a cgroup no entry names) its cgroup's path.
	Name string `json:"name"`
	// Label is a shorter name for tables of a tenant named by its cgroup
	// (its container's short id, its systemd unit): display only, two
	// tenants may share one.
	Label string `json:"label,omitempty"`
	// Unregistered marks a container of a Kubernetes pod (a cgroup under
	// kubepods) that no integration (NRI, an OCI hook) registered: its
	// pod's gpuarb.io/* annotations are not applied.
	Unregistered bool    `json:"unregistered,omitempty"`
	Cgroup       string  `json:"cgroup"`
	CgroupID     uint64  `json:"cgroup_id"`
	GPU          int     `json:"gpu"`
	Share        float64 `json:"share"` // fraction of the GPU's time in the last window, 0..1
	GPUNS        uint64  `json:"gpu_ns"`
	LongRunShare float64 `json:"long_run_share"`
	LaunchesPerS float64 `json:"launches_per_s"`
	SyncsPerS    float64 `json:"syncs_per_s"`
	// MemBytes is the device memory its processes hold on the GPU, as the
	// driver made it (RM allocations of video memory, less their frees):
	// what a memory limit holds.
	MemBytes uint64 `json:"mem_bytes"`
	// HostMemBytes is the pinned host memory its processes allocated
	// through the driver on the GPU (cuMemHostAlloc): reported apart, never
	// charged to a limit.
	HostMemBytes uint64 `json:"host_mem_bytes,omitempty"`
	// ManagedBytes is the address space its processes reserved as managed
	// memory (cudaMallocManaged: their mappings of nvidia-uvm), an upper
	// bound of what they can hold on any GPU: on no GPU in particular, so
	// the same on each of the tenant's rows, and charged to no limit.
	ManagedBytes uint64 `json:"managed_bytes,omitempty"`
	// DriverMemBytes is the video memory the driver itself counts for its
	// processes on the GPU (GET_PID_INFO, read once a window): MemBytes
	// plus each context's own buffers, which no allocation carries. Absent
	// where the driver could not be asked.
	DriverMemBytes *uint64 `json:"driver_mem_bytes,omitempty"`
	// MemoryLimit is its GPU memory limit on this GPU (0: none), OOMKills
	// the processes killed at an allocation past it on this GPU. Where the
	// limit is a share of each GPU's memory, MemoryLimitShare is that share
	// and MemoryLimit what it comes to here: 0 until the daemon has read
	// the GPU's size from the driver.
	MemoryLimit      uint64  `json:"memory_limit,omitempty"`
	MemoryLimitShare float64 `json:"memory_limit_share,omitempty"`
	OOMKills         uint64  `json:"oom_kills,omitempty"`
	QueueNS          uint64  `json:"queue_ns"` // estimated time with work queued behind others, in the window
	Processes        int     `json:"processes"`
	// LaunchNS is the GPU time one launch costs as the meter has learned
	// it: what pacing charges a launch.
	LaunchNS float64 `json:"launch_ns,omitempty"`
	// Cumulative counts since the tenant appeared (Prometheus counters).
	GPUNSTotal    uint64 `json:"gpu_ns_total"`
	LaunchesTotal uint64 `json:"launches_total"`
	SyncsTotal    uint64 `json:"syncs_total"`
	// State is what gpuarb does to it now: idle (no work), running (work,
	// nothing held back), steered (its channel groups given a timeslice
	// other than the driver's default, or paused part of each period, by
	// gpuarb), paused (its groups off the GPU now), paced (its launches
	// admitted at a rate), held (a process of it held at the launch gate
	// now), frozen (its cgroup or process stopped now), throttled (between
	// freezes of a timeslice-mode GPU).
	State string `json:"state"`
	// Actuator is how gpuarb holds it to its share: gpu scheduler, launch
	// gate, freeze, freeze windows, or freeze (launch gate escaped) once
	// GateEscapes reached 3; "launch gate (channel groups unknown or
	// refused)" on a steered GPU for a tenant whose channel groups gpuarb
	// never saw, or whose process's controls the driver refused.
	Actuator string `json:"actuator,omitempty"`
	// UnprobedPIDs are its processes that set up GPU channels but map no
	// libcuda gpuarb probes (a driver linked in, or a copy it could not
	// probe): their launches are unseen, so each is metered as busy
	// whenever gpuarb lets it run, and held by pausing its channel groups
	// or freezing its cgroup, never at the launch gate.
	UnprobedPIDs []int `json:"unprobed_pids,omitempty"`
	// GateEscapes are its holds at the launch gate that someone else
	// ended (a SIGCONT from a sibling): each escaped launch is charged,
	// and at 3 its pacing moves to freezing its cgroup.
	GateEscapes uint64 `json:"gate_escapes,omitempty"`
	// GateErrors are the operations holding it back that failed (a
	// freeze not confirmed in time and undone, a cgroup gone, a pause the
	// driver refused), LastGateError the last one: while they grow it may
	// get more than its share.
	GateErrors    uint64 `json:"gate_errors,omitempty"`
	LastGateError string `json:"last_gate_error,omitempty"`
	// Demand is what it would take of the GPU alone, as its waits and idle
	// time say (1: backlogged); WantShare the part of the window its
	// processes wanted the GPU, summed.
	Demand    float64 `json:"demand"`
	WantShare float64 `json:"want_share"`
	// BurstNS is the GPU time one of its channel groups brings to a turn
	// on the GPU before its work runs out (0: it fills any timeslice); a
	// closed loop's is its work between syncs.
	BurstNS float64 `json:"burst_ns,omitempty"`
	// TimesliceUS is its channel groups' timeslice when gpuarb steers the
	// GPU's scheduler (µs).
	TimesliceUS int64 `json:"timeslice_us,omitempty"`
	// Policy and the arbiter's decision.
	Weight      int     `json:"weight"`
	Limit       float64 `json:"limit,omitempty"`
	Priority    string  `json:"priority"`
	TargetShare float64 `json:"target_share"`
	Duty        float64 `json:"duty"`
	ThrottledNS uint64  `json:"throttled_ns"` // time frozen by the arbiter since the tenant appeared
	Reason      string  `json:"reason,omitempty"`
	SyncP99MS   float64 `json:"sync_p99_ms,omitempty"`
	SLOMissed   bool    `json:"slo_missed,omitempty"`
	// FPS is its synchronizations a second over the settled window: a
	// frame loop's frame rate. EqualFPS names its equal-FPS group.
	FPS      float64 `json:"fps,omitempty"`
	EqualFPS string  `json:"equal_fps,omitempty"`
	// ExactShare is the share an exact source (Status.ExactSource)
	// measured over its last interval, where the host has one.
	ExactShare *float64 `json:"exact_share,omitempty"`
}

// GPU is one GPU's figures.
type GPU struct {
	Index     int     `json:"index"`
	BusyShare float64 `json:"busy_share"`
	Tenants   int     `json:"tenants"`
	// MemoryBytes is its memory as the driver reports it to allocators,
	// which limits given as a share are shares of; absent until the
	// daemon has read it.
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	// Actuator is how its tenants are held to their shares; where it is not
	// the GPU's own scheduler, SchedulerUnavailable says why.
	Actuator             string `json:"actuator,omitempty"`
	SchedulerUnavailable string `json:"scheduler_unavailable,omitempty"`
	// BaseSliceUS and MinSliceUS are, where gpuarb steers its scheduler,
	// the timeslice its busy groups average when they weigh the same and
	// the shortest it gives one (µs): what a switch costs there sets them.
	BaseSliceUS int64 `json:"base_slice_us,omitempty"`
	MinSliceUS  int64 `json:"min_slice_us,omitempty"`
	// LatencyHolds counts the times a latency tenant's launch took the
	// other tenants' channel groups off the GPU until its wait ended;
	// LatencyHoldsCut those that lasted the longest a hold may (20 ms)
	// instead, and LatencyHeldNS the others' time off the GPU in them.
	LatencyHolds    uint64 `json:"latency_holds,omitempty"`
	LatencyHoldsCut uint64 `json:"latency_holds_cut,omitempty"`
	LatencyHeldNS   uint64 `json:"latency_held_ns,omitempty"`
	// LatencyHoldStartUS is how long a hold took to start, from the
	// latency tenant's launch to the others off the GPU (the median of
	// the last 15, µs), and LatencyHoldBoundUS the wait for a turn the
	// slices bound without one: holds are on while the start is shorter.
	LatencyHoldStartUS int64 `json:"latency_hold_start_us,omitempty"`
	LatencyHoldBoundUS int64 `json:"latency_hold_bound_us,omitempty"`
}

// Probes describes the probe layer behind the figures.
type Probes struct {
	Libcudas   []string `json:"libcudas"`
	Devices    []string `json:"devices"`
	Events     uint64   `json:"events"`
	LostEvents uint64   `json:"lost_events"`
	PinPath    string   `json:"pin_path"`
	// UprobeMulti tells whether libcuda is probed with uprobe_multi links.
	UprobeMulti bool `json:"uprobe_multi"`
	// UnrecordedLaunches are launches the launch gate let through
	// unstopped because its table of held processes was full.
	UnrecordedLaunches uint64 `json:"unrecorded_launches"`
	// AttachDrops are libcuda opens and mapping scans left undone because
	// too many were waiting.
	AttachDrops uint64 `json:"attach_drops"`
	// MappingScans are the processes with GPU channels searched for
	// libcuda copies by what they map; FoundByMapping the copies found
	// that way, under a name the openat probe does not match (renamed,
	// from a memfd).
	MappingScans   uint64 `json:"mapping_scans"`
	FoundByMapping uint64 `json:"found_by_mapping"`
	// ExitsReconciled are processes the meter ended because they were
	// gone from /proc with no exit event seen (lost with the ring's
	// overflow): their modeled work stopped there.
	ExitsReconciled uint64 `json:"exits_reconciled"`
	// UnfollowedForks are processes forked below a pid tenant's that the
	// probes could not follow (their table was full): a double fork takes
	// such a process out of its tenant.
	UnfollowedForks uint64 `json:"unfollowed_forks"`
	// Bounds on what tenants can make the daemon keep or do. Each count is
	// since the daemon started. LibcudasRefused are copies not probed
	// because 256 were already, or 16 found mapped in one cgroup (a
	// process mapping only those is held as unprobed); FoldedLaunches
	// launches a process's bounds (1024 streams, 4096 kernels and graphs)
	// sent to one overflow stream and cost, still charged; UntrackedAllocs
	// device memory allocations beyond 65536 per process, not counted in
	// its memory;
	// ObjectsDropped RM objects (clients, devices, channel groups,
	// channels) beyond 4096 a process, not kept: what a process claims to
	// have allocated is read from its memory.
	LibcudasRefused uint64 `json:"libcudas_refused"`
	ObjectsDropped  uint64 `json:"objects_dropped"`
	FoldedLaunches  uint64 `json:"folded_launches"`
	UntrackedAllocs uint64 `json:"untracked_allocs"`
}

// Status is the daemon's status document.
type Status struct {
	Version  string   `json:"version"`
	WindowNS uint64   `json:"window_ns"`
	Tenants  []Tenant `json:"tenants"`
	GPUs     []GPU    `json:"gpus"`
	Probes   Probes   `json:"probes"`
	// Enforcing is false while observing only (--observe-only, or after
	// `gpuarb thaw --all` until a policy is applied).
	Enforcing bool `json:"enforcing"`
	// ExactSource names the exact per-process source in use, if any.
	ExactSource string `json:"exact_source,omitempty"`
	// ControlNS is the mean time of one control step (measure, decide,
	// gate) over the last window.
	ControlNS uint64 `json:"control_ns"`
	// Guardian is the thaw guardian, which resumes every tenant if the
	// daemon dies (absent when the daemon runs without one).
	Guardian *Guardian `json:"guardian,omitempty"`
	// PolicyError says why the policy file was refused the last time it
	// was read: the daemon runs on the last good policy meanwhile (at a
	// start, the copy it kept of it, else the defaults).
	PolicyError string `json:"policy_error,omitempty"`
	// NRI is the daemon's NRI plugin (absent when it runs without one).
	NRI *NRIStatus `json:"nri,omitempty"`
}

// NRIStatus is the state of the daemon's NRI plugin, through which
// containerd and CRI-O hand it their pods.
type NRIStatus struct {
	// Socket is the runtime's NRI socket.
	Socket string `json:"socket"`
	// Connected is whether a runtime is connected now.
	Connected bool `json:"connected"`
	// Runtime and RuntimeVersion name the runtime, as it introduced
	// itself at the last connection.
	Runtime        string `json:"runtime,omitempty"`
	RuntimeVersion string `json:"runtime_version,omitempty"`
	// Since is when the last connection was made.
	Since time.Time `json:"since,omitzero"`
	// Registered counts the containers registered through NRI.
	Registered uint64 `json:"registered"`
	// LastError says why the plugin is not connected, or why the last
	// connection ended.
	LastError string `json:"last_error,omitempty"`
}

// Guardian is the state of the thaw guardian.
type Guardian struct {
	// PID is the running guardian's (0: none is running now: it died and
	// is being started again, or could not be).
	PID int `json:"pid"`
	// Restarts counts the guardians started after one died.
	Restarts uint64 `json:"restarts"`
	// Cgroup is the cgroup directory it runs in, apart from the daemon's
	// so that what kills the daemon's cgroup does not kill it ("": the
	// daemon's own).
	Cgroup string `json:"cgroup,omitempty"`
}

// Endpoints that change the daemon's state; they require root.
const (
	TenantsPath = "/v1/tenants" // POST a policy.Tenant; DELETE TenantsPath/NAME
	PolicyPath  = "/v1/policy"  // GET (YAML), PUT (YAML)
	ThawPath    = "/v1/thaw"    // POST: thaw everything and stop enforcing
)

// ErrNoDaemon is returned when nothing serves the socket.
var ErrNoDaemon = errors.New("gpuarb daemon is not running")

// ErrNotFound is returned when the daemon has no such object (a tenant
// name that is not in the policy).
var ErrNotFound = errors.New("not found")

// ErrConflict is returned when a workload's attach names a tenant that is
// not its own: one of the policy file's, or one another owner attached.
var ErrConflict = errors.New("tenant name taken")

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
	resp, err := c.do(ctx, http.MethodGet, StatusPath, "", nil)
	if err != nil {
		return st, fmt.Errorf("status: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("status: decode: %w", err)
	}
	return st, nil
}

// do sends a request and turns a refused connection into ErrNoDaemon and a
// non-2xx answer into an error carrying the daemon's message.
func (c *Client) do(ctx context.Context, method, path, contentType string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://gpuarb"+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ne *net.OpError
		switch {
		case errors.As(err, &ne) && ne.Op == "dial" && errors.Is(err, os.ErrPermission):
			return nil, fmt.Errorf("no permission to connect to the daemon's socket %s: run as root (or a user the socket's mode admits)", c.socket)
		case errors.As(err, &ne) && ne.Op == "dial":
			return nil, fmt.Errorf("%w (socket %s): start it with `gpuarb daemon`", ErrNoDaemon, c.socket)
		case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF):
			// Connected to a listener that closed without answering: a
			// daemon in the middle of exiting (killed, crashed).
			return nil, fmt.Errorf("%w (socket %s): it closed the connection without answering", ErrNoDaemon, c.socket)
		}
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		switch resp.StatusCode {
		case http.StatusNotFound:
			return nil, fmt.Errorf("%w: %s", ErrNotFound, bytes.TrimSpace(msg))
		case http.StatusConflict:
			return nil, fmt.Errorf("%w: %s", ErrConflict, bytes.TrimSpace(msg))
		}
		return nil, fmt.Errorf("daemon answered %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return resp, nil
}

// OwnerParam is the query parameter of POST and DELETE TenantsPath that
// names the workload registering itself.
const OwnerParam = "owner"

// AttachResult is the daemon's answer to an attach.
type AttachResult struct {
	// Adjusted says, one line each, how the policy's admission rules
	// bounded a workload's request (empty: admitted as requested).
	Adjusted []string `json:"adjusted,omitempty"`
}

// Attach registers (or replaces) a tenant; body is a policy.Tenant as JSON.
//
// owner is "" when the operator attaches (the rules stand as given, and
// may replace a policy file entry of the same name for as long as the
// attachment lasts). A hook registering a workload with rules the workload
// brought (a container's annotations, a VM's metadata) passes the
// workload as owner ("container ID", "vm UUID"): the policy's admission
// rules bound those rules, and a name that belongs to the policy file or
// to another owner is refused with ErrConflict.
func (c *Client) Attach(ctx context.Context, owner string, tenantJSON []byte) (AttachResult, error) {
	var res AttachResult
	resp, err := c.do(ctx, http.MethodPost, TenantsPath+ownerQuery(owner), "application/json", tenantJSON)
	if err != nil {
		return res, fmt.Errorf("attach: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&res); err != nil && !errors.Is(err, io.EOF) {
		return res, fmt.Errorf("attach: the daemon's answer: %w", err)
	}
	return res, nil
}

// Detach removes an attached tenant (its processes are thawed and fall
// back to the policy file's entry of that name or the defaults). With an
// owner, only that owner's attachment is removed (ErrNotFound otherwise).
func (c *Client) Detach(ctx context.Context, owner, name string) error {
	resp, err := c.do(ctx, http.MethodDelete, TenantsPath+"/"+url.PathEscape(name)+ownerQuery(owner), "", nil)
	if err != nil {
		return fmt.Errorf("detach %s: %w", name, err)
	}
	return resp.Body.Close()
}

func ownerQuery(owner string) string {
	if owner == "" {
		return ""
	}
	return "?" + url.Values{OwnerParam: {owner}}.Encode()
}

// Policy returns the policy in force as YAML.
func (c *Client) Policy(ctx context.Context) ([]byte, error) {
	resp, err := c.do(ctx, http.MethodGet, PolicyPath, "", nil)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// ApplyPolicy replaces the policy with a YAML document (validated by the
// daemon; a bad one changes nothing).
func (c *Client) ApplyPolicy(ctx context.Context, yamlDoc []byte) error {
	resp, err := c.do(ctx, http.MethodPut, PolicyPath, "application/yaml", yamlDoc)
	if err != nil {
		return fmt.Errorf("apply policy: %w", err)
	}
	return resp.Body.Close()
}

// ThawAll thaws every tenant and stops enforcement until a policy is
// applied again.
func (c *Client) ThawAll(ctx context.Context) error {
	resp, err := c.do(ctx, http.MethodPost, ThawPath, "", nil)
	if err != nil {
		return fmt.Errorf("thaw: %w", err)
	}
	return resp.Body.Close()
}
