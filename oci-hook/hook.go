// Package ocihook attaches OCI containers to the gpuarb daemon from the
// container runtime's lifecycle hooks (runc, crun, CRI-O, podman,
// containerd): the runtime writes the container's state to the hook's
// stdin; the hook reads the few parts of the bundle's config.json it needs
// (linux.cgroupsPath and the annotations), turns gpuarb.io/* annotations
// into a policy and registers the container's cgroup as a tenant, or
// removes it when the container stops.
//
// A hook must never hold a container up for long: every call to the
// daemon is bounded (Options.Timeout, default 800 ms, so the hook exits
// within 1 s), and a daemon that is down or slow lets the container start
// with a warning unless Options.FailClosed is set.
package ocihook

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/policy"
)

// Stage is an OCI lifecycle hook stage.
type Stage string

// The stages the hook acts on. createRuntime, prestart and poststart
// register the container (again: registering is idempotent); poststop
// unregisters it.
const (
	CreateRuntime Stage = "createRuntime"
	Prestart      Stage = "prestart"
	Poststart     Stage = "poststart"
	Poststop      Stage = "poststop"
)

// Stages lists the stages in lifecycle order.
var Stages = []Stage{CreateRuntime, Prestart, Poststart, Poststop}

// ParseStage accepts a stage name as the OCI spec spells it (any case).
func ParseStage(s string) (Stage, error) {
	for _, st := range Stages {
		if strings.EqualFold(s, string(st)) {
			return st, nil
		}
	}
	return "", fmt.Errorf("unknown hook stage %q (want createRuntime, prestart, poststart or poststop)", s)
}

// Options configure the hook.
type Options struct {
	// Socket is the daemon's API socket ("" for the default).
	Socket string
	// Timeout bounds the whole exchange with the daemon (default 800 ms).
	Timeout time.Duration
	// FailClosed makes an unreachable or refusing daemon an error, so the
	// runtime refuses to start the container. By default the container
	// starts and a warning is written.
	FailClosed bool
	// DefaultOnBadPolicy registers a container whose gpuarb.io/*
	// annotations are invalid with the default policy (and a warning)
	// instead of failing the hook.
	DefaultOnBadPolicy bool
	// ProcRoot is where /proc is mounted (default "/proc"; tests).
	ProcRoot string
}

// ErrBadState marks a malformed container state on stdin.
var ErrBadState = errors.New("malformed OCI state on stdin")

// maxState bounds what is read from stdin: a state is a few hundred bytes.
const maxState = 1 << 20

// ReadState reads and checks the OCI state document the runtime writes to
// the hook's stdin.
func ReadState(r io.Reader) (*specs.State, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxState+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadState, err)
	}
	if len(data) > maxState {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrBadState, maxState)
	}
	var st specs.State
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%w: %v (got %q)", ErrBadState, err, excerpt(data))
	}
	switch {
	case st.ID == "":
		return nil, fmt.Errorf("%w: no \"id\"", ErrBadState)
	case st.Bundle == "" || !filepath.IsAbs(st.Bundle):
		return nil, fmt.Errorf("%w: \"bundle\" must be an absolute path, got %q", ErrBadState, st.Bundle)
	case st.Pid < 0:
		return nil, fmt.Errorf("%w: negative \"pid\" %d", ErrBadState, st.Pid)
	}
	return &st, nil
}

func excerpt(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "…"
	}
	return string(b)
}

// Bundle is the part of a bundle's config.json the hook reads.
type Bundle struct {
	CgroupsPath string
	Annotations map[string]string
}

// bundleConfig decodes only the fields the hook needs from config.json.
type bundleConfig struct {
	Annotations map[string]string `json:"annotations"`
	Linux       *struct {
		CgroupsPath string `json:"cgroupsPath"`
	} `json:"linux"`
}

// ReadBundle reads linux.cgroupsPath and the annotations of the bundle at
// dir.
func ReadBundle(dir string) (Bundle, error) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return Bundle{}, fmt.Errorf("bundle: %w", err)
	}
	var cfg bundleConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return Bundle{}, fmt.Errorf("bundle %s: config.json: %w", dir, err)
	}
	b := Bundle{Annotations: cfg.Annotations}
	if cfg.Linux != nil {
		b.CgroupsPath = cfg.Linux.CgroupsPath
	}
	return b, nil
}

// Action is what one hook call did.
type Action struct {
	Stage  Stage
	Tenant policy.Tenant
	// Detached is set by poststop.
	Detached bool
	// Warnings are what the runtime's log should show (fail-open paths,
	// a policy fallen back to the defaults, a cgroup path disagreement,
	// a name taken, rules bounded by the policy's admission rules).
	Warnings []string
}

// Run handles one hook call: stage from the command line, state from
// stdin.
func Run(ctx context.Context, stage Stage, stdin io.Reader, o Options) (Action, error) {
	act := Action{Stage: stage}
	st, err := ReadState(stdin)
	if err != nil {
		return act, err
	}
	if o.Timeout <= 0 {
		o.Timeout = 800 * time.Millisecond
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	b, err := ReadBundle(st.Bundle)
	if err != nil && stage != Poststop {
		return act, err
	}
	name := TenantName(st.ID, b.Annotations)
	act.Tenant.Name = name
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	client := api.NewClient(o.Socket)
	spool := api.SpoolBeside(cmp.Or(o.Socket, api.DefaultSocket))

	owner := Owner(st.ID)
	if stage == Poststop {
		// A registration spooled while the daemon was away is not to be
		// made any more.
		if err := api.Unspool(spool, owner); err != nil {
			act.Warnings = append(act.Warnings, err.Error())
		}
		err := client.Detach(ctx, owner, name)
		if errors.Is(err, api.ErrNotFound) && name != st.ID {
			// Registered under its id: its name was taken at start.
			err = client.Detach(ctx, owner, st.ID)
		}
		switch {
		case err == nil:
			act.Detached = true
		case errors.Is(err, api.ErrNotFound):
			// Never registered (the daemon was down at start) or already
			// gone: nothing to undo.
		default:
			return act, daemonError(&act, o, err)
		}
		return act, nil
	}

	rules, err := RulesFromAnnotations(b.Annotations)
	if err != nil {
		if !o.DefaultOnBadPolicy {
			return act, err
		}
		act.Warnings = append(act.Warnings, err.Error()+"; using the default policy")
		rules = policy.Rules{}
	}
	cg, warn, err := ContainerCgroup(b.CgroupsPath, st.ID, st.Pid, o.ProcRoot)
	if err != nil {
		return act, daemonError(&act, o, fmt.Errorf("container %s: %w", st.ID, err))
	}
	if warn != "" {
		act.Warnings = append(act.Warnings, warn)
	}
	act.Tenant.Cgroup = cg
	act.Tenant.Rules = rules
	res, err := attach(ctx, client, owner, act.Tenant)
	if errors.Is(err, api.ErrConflict) && name != st.ID {
		// The annotation names a tenant that is not this container's:
		// register it under its id rather than leave it unarbitrated.
		act.Warnings = append(act.Warnings, fmt.Sprintf("%v; registered as %s instead", err, st.ID))
		act.Tenant.Name = st.ID
		res, err = attach(ctx, client, owner, act.Tenant)
	}
	if err != nil {
		if api.Unreachable(err) && !o.FailClosed {
			// The container runs: its registration is kept for the daemon
			// to make when it is back (the spool).
			body, merr := json.Marshal(act.Tenant)
			if serr := errors.Join(merr, api.Spool(spool, api.Spooled{Owner: owner, Tenant: body, Fallback: st.ID})); serr != nil {
				act.Warnings = append(act.Warnings, fmt.Sprintf("the registration could not be spooled either: %v", serr))
			} else {
				err = fmt.Errorf("%w; registration spooled for the daemon to make when it is back", err)
			}
		}
		return act, daemonError(&act, o, err)
	}
	// How the policy's admission rules bounded what the annotations asked.
	act.Warnings = append(act.Warnings, res.Adjusted...)
	return act, nil
}

// Owner is how the hook names a container to the daemon: the owner of
// the tenant it registers (api.Client.Attach).
func Owner(id string) string { return "container " + id }

func attach(ctx context.Context, client *api.Client, owner string, t policy.Tenant) (api.AttachResult, error) {
	body, err := json.Marshal(t)
	if err != nil {
		return api.AttachResult{}, err
	}
	return client.Attach(ctx, owner, body)
}

// daemonError applies the fail-open/fail-closed choice to an error that
// concerns the daemon or the cgroup rather than the input.
func daemonError(act *Action, o Options, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("gpuarb daemon did not answer within %v: %w", o.Timeout, err)
	}
	if o.FailClosed {
		return err
	}
	act.Warnings = append(act.Warnings, err.Error()+" (fail-open: the container runs unarbitrated)")
	return nil
}

// TenantName is the tenant a container is registered as: the
// gpuarb.io/name annotation, else the container id.
func TenantName(id string, annotations map[string]string) string {
	if n := annotations[AnnotationName]; n != "" {
		return n
	}
	return id
}
