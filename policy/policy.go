package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// DefaultPath is where the daemon reads its policy file.
const DefaultPath = "/etc/gpuarb/gpuarb.yaml"

// Priority is a tenant's class.
type Priority string

// The priority classes.
const (
	// Latency tenants are never throttled; when their SLO is missed the
	// others yield.
	Latency Priority = "latency"
	// Normal tenants share by weight.
	Normal Priority = "normal"
	// Batch tenants share by weight. While a latency SLO is missed on a GPU
	// whose scheduler gpuarb steers, they are paused for part of each period
	// and normal tenants keep running at the shortest timeslice; at the
	// launch gate every other tenant's rate falls alike.
	Batch Priority = "batch"
)

// Mode is how a GPU is shared.
type Mode string

// The sharing modes.
const (
	// ModeShare is weighted max-min fair sharing among tenants with work,
	// work conserving.
	ModeShare Mode = "share"
	// ModeWindows gives tenants with work exclusive rotating freeze
	// windows sized by weight (not the GPU's own timeslices, which the
	// GPU's timeslice field and steering set).
	ModeWindows Mode = "windows"
	// modeWindowsFormerName is ModeWindows' name before 2026-12; a file
	// that uses it still loads.
	modeWindowsFormerName Mode = "timeslice"
)

// MinMemoryLimit is the smallest GPU memory limit: a CUDA context's own
// buffers and a framework's first allocations take tens of MiB.
const MinMemoryLimit = Bytes(64 << 20)

// Weight bounds, as cpu.weight.
const (
	MinWeight     = 1
	MaxWeight     = 10000
	DefaultWeight = 100
)

// DefaultPeriod is the arbiter's control period.
const DefaultPeriod = 100 * time.Millisecond

// Share is a fraction of a GPU in (0, 1]. In YAML and on the command line
// it is written as a fraction (0.3) or a percentage ("30%").
type Share float64

// ParseShare reads "0.3" or "30%".
func ParseShare(s string) (Share, error) {
	s = strings.TrimSpace(s)
	scale := 1.0
	if p, ok := strings.CutSuffix(s, "%"); ok {
		s, scale = strings.TrimSpace(p), 0.01
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a fraction (0.3) or a percentage (30%%)", s)
	}
	return Share(v * scale), nil
}

// UnmarshalYAML accepts a number or a percentage string.
func (s *Share) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseShare(n.Value)
	if err != nil {
		return lineError(n, "", err.Error())
	}
	*s = v
	return nil
}

// Weight is a tenant's relative share; 0 means unset (the default applies).
type Weight int

// UnmarshalYAML rejects an explicit 0, which would otherwise read as unset.
func (w *Weight) UnmarshalYAML(n *yaml.Node) error {
	v, err := strconv.Atoi(n.Value)
	if err != nil {
		return lineError(n, "weight", fmt.Sprintf("%q is not an integer", n.Value))
	}
	if v == 0 {
		return lineError(n, "weight", fmt.Sprintf("0 out of range %d–%d", MinWeight, MaxWeight))
	}
	*w = Weight(v)
	return nil
}

// SLO is a latency tenant's objective, measured from the probes.
type SLO struct {
	// P99SyncMS bounds the 99th percentile of the tenant's waits for the
	// GPU: synchronizing calls, and polling loops of event or stream
	// queries that found the work not done (a query that finds it done
	// waited for nothing).
	P99SyncMS float64 `yaml:"p99_sync_ms,omitempty" json:"p99_sync_ms,omitempty"`
	// FPS is the frame rate a frame loop (one sync per frame) must hold.
	FPS float64 `yaml:"fps,omitempty" json:"fps,omitempty"`
}

// Rules are what a policy says about one tenant.
type Rules struct {
	// Weight is the tenant's relative share, 1–10000 (default 100).
	Weight Weight `yaml:"weight,omitempty" json:"weight"`
	// Limit is a hard maximum share of a GPU (0: none), enforced even when
	// the GPU is otherwise idle.
	Limit Share `yaml:"limit,omitempty" json:"limit,omitempty"`
	// Priority is latency, normal (default) or batch.
	Priority Priority `yaml:"priority,omitempty" json:"priority"`
	// SLO applies to latency tenants.
	SLO SLO `yaml:"slo,omitempty" json:"slo,omitzero"`
	// MemoryLimit holds the device memory of the tenant's processes on each
	// GPU (zero: none): an allocation that would pass it kills the
	// allocating process.
	MemoryLimit MemoryLimit `yaml:"memory_limit,omitempty" json:"memory_limit,omitzero"`
	// EqualFPS names a group of frame loops (one sync per frame) held to
	// one frame rate on each GPU, the highest their share of it allows
	// (vGASA's equal-FPS policy): the group's weights, summed, are shared
	// among its tenants in proportion to the GPU time a frame of each
	// costs. Only the policy file sets it.
	EqualFPS string `yaml:"equal_fps,omitempty" json:"equal_fps,omitempty"`
}

// Selector names the processes of a tenant: exactly one of its fields.
type Selector struct {
	// Cgroup is a cgroup v2 path as in /proc/PID/cgroup, or a full path
	// under the cgroup mount.
	Cgroup string `yaml:"cgroup,omitempty" json:"cgroup,omitempty"`
	// ContainerID matches the container id in the cgroup's path.
	ContainerID string `yaml:"container_id,omitempty" json:"container_id,omitempty"`
	// PID attaches a bare process and its descendants (gated by SIGSTOP).
	PID int `yaml:"pid,omitempty" json:"pid,omitempty"`
}

// Tenant is a named selector with its rules.
type Tenant struct {
	Name     string `yaml:"name" json:"name"`
	Selector `yaml:",inline" json:",inline"`
	Rules    `yaml:",inline" json:",inline"`
}

// GPU sets one GPU's sharing mode and the scheduling facts of the GPU
// that the meter's model needs.
type GPU struct {
	Index int  `yaml:"index" json:"index"`
	Mode  Mode `yaml:"mode,omitempty" json:"mode"`
	// Preemptive says whether the GPU preempts a running kernel when its
	// timeslice ends (default true, as compute preemption on NVIDIA since
	// Pascal); false models run to completion.
	Preemptive *bool `yaml:"preemptive,omitempty" json:"preemptive,omitempty"`
	// Timeslice is the GPU's per-context timeslice (default 1024µs,
	// 100µs–1s).
	Timeslice time.Duration `yaml:"timeslice,omitempty" json:"timeslice,omitempty"`
}

// DefaultTimeslice is the GPU timeslice the meter models by default: the
// channel-group timeslice of Volta and later GPUs, 128 << 3 µs
// (open-gpu-kernel-modules kernel_fifo_gv100.c). Where the probes see a
// context's own SET_TIMESLICE, the meter uses that.
const DefaultTimeslice = 1024 * time.Microsecond

// Config is a whole policy.
type Config struct {
	// Period is the arbiter's control period (default 100ms, 10ms–10s).
	Period time.Duration `yaml:"period,omitempty" json:"period"`
	// Defaults apply to tenants no entry names, and fill what entries
	// leave out.
	Defaults Rules `yaml:"defaults,omitempty" json:"defaults"`
	// GPUs lists GPUs whose mode or scheduling is not the default.
	GPUs []GPU `yaml:"gpus,omitempty" json:"gpus,omitempty"`
	// Tenants are the named tenants.
	Tenants []Tenant `yaml:"tenants,omitempty" json:"tenants,omitempty"`
	// Admission bounds the rules workloads request for themselves (OCI
	// annotations, libvirt domain metadata); none: DefaultAdmission.
	Admission []Admission `yaml:"admission,omitempty" json:"admission,omitempty"`
}

// Default returns the policy used when no file exists.
func Default() *Config {
	c := &Config{}
	c.fill()
	return c
}

// Parse decodes YAML strictly (unknown fields are errors), fills defaults
// and validates.
//
// Every error is reported, each with its line where the file has one: the
// values that do not decode (a bad weight or limit, an unknown field), then
// the rules the decoded values break.
func Parse(data []byte) (*Config, error) {
	c := &Config{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var errs []error
	err := dec.Decode(c)
	var te *yaml.TypeError
	switch {
	case err == nil, errors.Is(err, io.EOF): // io.EOF: empty file
	case errors.As(err, &te):
		for _, msg := range te.Errors {
			errs = append(errs, errors.New(typeNames.Replace(msg)))
		}
	default:
		return nil, fmt.Errorf("policy: %w", err)
	}
	c.fill()
	if err := c.Validate(); err != nil {
		var root yaml.Node
		_ = yaml.Unmarshal(data, &root)
		for _, e := range unjoin(err) {
			errs = append(errs, withLine(&root, e))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("policy: %w", errors.Join(errs...))
	}
	return c, nil
}

// typeNames words the YAML decoder's messages without Go type names.
var typeNames = strings.NewReplacer(" in type policy.Config", " in the policy", " in type policy.Tenant", " in a tenant",
	" in type policy.GPU", " in a GPU", " in type policy.Rules", " in the defaults", " in type policy.SLO", " in an SLO", " in type policy.Admission", " in an admission rule",
	"into policy.Weight", "into a weight", "into policy.Share", "into a share", "into time.Duration", "into a duration")

// lineError is a value that does not decode, reported with its line and
// field; as a TypeError the decoder records it and goes on.
func lineError(n *yaml.Node, field, msg string) error {
	if field != "" {
		msg = field + ": " + msg
	}
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %s", n.Line, msg)}}
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// withLine prefixes a FieldError on tenants[i] or gpus[i] with the line of
// that entry in the file.
func withLine(root *yaml.Node, err error) error {
	var fe *FieldError
	if !errors.As(err, &fe) || root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		return err
	}
	list, rest, ok := strings.Cut(fe.Field, "[")
	if !ok {
		return err
	}
	idx, _, ok := strings.Cut(rest, "]")
	i, convErr := strconv.Atoi(idx)
	if !ok || convErr != nil {
		return err
	}
	m := root.Content[0]
	for k := 0; k+1 < len(m.Content); k += 2 {
		if m.Content[k].Value == list && i < len(m.Content[k+1].Content) {
			return fmt.Errorf("line %d: %w", m.Content[k+1].Content[i].Line, err)
		}
	}
	return err
}

// Load reads a policy file. A missing file is not an error: the default
// policy is returned with ok false.
func Load(path string) (c *Config, ok bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Default(), false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read policy: %w", err)
	}
	c, err = Parse(data)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", path, err)
	}
	return c, true, nil
}

func (r *Rules) fillFrom(d Rules) {
	if r.Weight == 0 {
		r.Weight = d.Weight
	}
	if r.Priority == "" {
		r.Priority = d.Priority
	}
	if r.Limit == 0 {
		r.Limit = d.Limit
	}
	if r.MemoryLimit.IsZero() {
		r.MemoryLimit = d.MemoryLimit
	}
	if r.EqualFPS == "" {
		r.EqualFPS = d.EqualFPS
	}
}

func (c *Config) fill() {
	if c.Period == 0 {
		c.Period = DefaultPeriod
	}
	c.Defaults.fillFrom(Rules{Weight: DefaultWeight, Priority: Normal})
	for i := range c.GPUs {
		switch c.GPUs[i].Mode {
		case "":
			c.GPUs[i].Mode = ModeShare
		case modeWindowsFormerName:
			c.GPUs[i].Mode = ModeWindows
		}
		if c.GPUs[i].Timeslice == 0 {
			c.GPUs[i].Timeslice = DefaultTimeslice
		}
	}
	for i := range c.Tenants {
		c.Tenants[i].Rules.fillFrom(c.Defaults)
	}
}

// FieldError is a validation error naming the field and what it allows.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Validate checks every field and reports every bad one (errors.Join of
// FieldErrors).
func (c *Config) Validate() error {
	var errs []error
	if c.Period < 10*time.Millisecond || c.Period > 10*time.Second {
		errs = append(errs, &FieldError{"period", fmt.Sprintf("%v out of range 10ms–10s", c.Period)})
	}
	errs = append(errs, c.Defaults.Validate("defaults"))
	seen := map[int]bool{}
	for i, g := range c.GPUs {
		f := fmt.Sprintf("gpus[%d]", i)
		if g.Index < 0 {
			errs = append(errs, &FieldError{f + ".index", fmt.Sprintf("%d is negative", g.Index)})
		}
		if seen[g.Index] {
			errs = append(errs, &FieldError{f + ".index", fmt.Sprintf("GPU %d listed twice", g.Index)})
		}
		seen[g.Index] = true
		if g.Mode != ModeShare && g.Mode != ModeWindows {
			errs = append(errs, &FieldError{f + ".mode", fmt.Sprintf("%q is not share or windows", g.Mode)})
		}
		if g.Timeslice < 100*time.Microsecond || g.Timeslice > time.Second {
			errs = append(errs, &FieldError{f + ".timeslice", fmt.Sprintf("%v out of range 100µs–1s", g.Timeslice)})
		}
	}
	names := map[string]bool{}
	for i, t := range c.Tenants {
		f := fmt.Sprintf("tenants[%d]", i)
		errs = append(errs, t.Validate(f))
		if names[t.Name] {
			errs = append(errs, &FieldError{f + ".name", fmt.Sprintf("%q used twice", t.Name)})
		}
		names[t.Name] = true
	}
	for i, a := range c.Admission {
		errs = append(errs, a.validate(fmt.Sprintf("admission[%d]", i)))
	}
	return errors.Join(errs...)
}

// Validate checks one tenant; field prefixes the field names in errors.
func (t *Tenant) Validate(field string) error {
	if err := CheckTenantName(t.Name); err != nil {
		return &FieldError{field + ".name", err.Error()}
	}
	n := 0
	if t.Cgroup != "" {
		n++
	}
	if t.ContainerID != "" {
		n++
	}
	if t.PID != 0 {
		n++
		if t.PID < 2 {
			return &FieldError{field + ".pid", fmt.Sprintf("%d is not a process gpuarb may stop", t.PID)}
		}
	}
	if n != 1 {
		return &FieldError{field, "needs exactly one of cgroup, container_id, pid"}
	}
	return t.Rules.Validate(field)
}

// Validate checks weight, limit, priority and SLO.
func (r *Rules) Validate(field string) error {
	if r.Weight < MinWeight || r.Weight > MaxWeight {
		return &FieldError{field + ".weight", fmt.Sprintf("%d out of range %d–%d", r.Weight, MinWeight, MaxWeight)}
	}
	// !(x >= lo && x <= hi) also refuses NaN, which every comparison fails.
	if !(r.Limit >= 0 && r.Limit <= 1) {
		return &FieldError{field + ".limit", fmt.Sprintf("%g out of range 0–1 (0%%–100%%; 0: none)", float64(r.Limit))}
	}
	if err := r.MemoryLimit.validate(); err != nil {
		return &FieldError{field + ".memory_limit", err.Error()}
	}
	switch r.Priority {
	case Latency, Normal, Batch:
	default:
		return &FieldError{field + ".priority", fmt.Sprintf("%q is not latency, normal or batch", r.Priority)}
	}
	if !(r.SLO.P99SyncMS >= 0 && r.SLO.P99SyncMS <= 60000) {
		return &FieldError{field + ".slo.p99_sync_ms", fmt.Sprintf("%g out of range 0–60000", r.SLO.P99SyncMS)}
	}
	if !(r.SLO.FPS >= 0 && r.SLO.FPS <= 1000) {
		return &FieldError{field + ".slo.fps", fmt.Sprintf("%g out of range 0–1000", r.SLO.FPS)}
	}
	if r.SLO.P99SyncMS > 0 && r.SLO.FPS > 0 {
		return &FieldError{field + ".slo", "set p99_sync_ms or fps, not both"}
	}
	if (r.SLO.P99SyncMS > 0 || r.SLO.FPS > 0) && r.Priority != Latency {
		return &FieldError{field + ".slo", "an SLO needs priority latency"}
	}
	if r.EqualFPS != "" {
		if err := CheckTenantName(r.EqualFPS); err != nil {
			return &FieldError{field + ".equal_fps", err.Error()}
		}
		if r.Priority == Latency {
			return &FieldError{field + ".equal_fps", "a latency tenant is never held back, so it cannot be held to its group's frame rate: give it priority normal"}
		}
	}
	return nil
}

// ModeOf returns a GPU's sharing mode.
func (c *Config) ModeOf(gpu int) Mode {
	for _, g := range c.GPUs {
		if g.Index == gpu {
			return g.Mode
		}
	}
	return ModeShare
}

// Scheduling returns what a GPU's scheduler does, as the policy declares
// it: its timeslice and whether it preempts running kernels.
func (c *Config) Scheduling(gpu int) (timeslice time.Duration, preemptive bool) {
	for _, g := range c.GPUs {
		if g.Index == gpu {
			return g.Timeslice, g.Preemptive == nil || *g.Preemptive
		}
	}
	return DefaultTimeslice, true
}

// Tenant returns the named tenant.
func (c *Config) Tenant(name string) (Tenant, bool) {
	for _, t := range c.Tenants {
		if t.Name == name {
			return t, true
		}
	}
	return Tenant{}, false
}

// With returns a copy with t added, or replacing the tenant of that name,
// validated.
func (c *Config) With(t Tenant) (*Config, error) {
	n := c.clone()
	t.Rules.fillFrom(n.Defaults)
	replaced := false
	for i := range n.Tenants {
		if n.Tenants[i].Name == t.Name {
			n.Tenants[i], replaced = t, true
		}
	}
	if !replaced {
		n.Tenants = append(n.Tenants, t)
	}
	if err := n.Validate(); err != nil {
		return nil, err
	}
	return n, nil
}

// Without returns a copy without the named tenant; ok is false when there
// was none.
func (c *Config) Without(name string) (n *Config, ok bool) {
	n = c.clone()
	n.Tenants = n.Tenants[:0]
	for _, t := range c.Tenants {
		if t.Name == name {
			ok = true
			continue
		}
		n.Tenants = append(n.Tenants, t)
	}
	return n, ok
}

func (c *Config) clone() *Config {
	n := *c
	n.GPUs = append([]GPU(nil), c.GPUs...)
	n.Tenants = append([]Tenant(nil), c.Tenants...)
	n.Admission = append([]Admission(nil), c.Admission...)
	return &n
}

// YAML encodes the policy.
func (c *Config) YAML() ([]byte, error) {
	out, err := yaml.Marshal(c)
	if err != nil || len(c.Admission) > 0 {
		return out, err
	}
	return append(out, []byte(defaultAdmissionNote)...), nil
}

// defaultAdmissionNote ends the YAML of a policy without admission rules:
// which apply instead.
const defaultAdmissionNote = `# admission: none given, so the default bounds what workloads ask for themselves:
#   - {cgroup_prefix: /, max_weight: 1000}   # latency priority and SLOs refused
`
