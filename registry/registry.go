// Package registry keeps the tenants registered through gpuarb's API
// (gpuarb attach, the OCI and libvirt hooks, the NRI plugin) apart from
// the policy file, so that a reload or `policy apply` does not drop them,
// and in a file (beside the daemon's socket, on /run: they last as long as
// the containers and VMs they name) so that a restarted daemon keeps them.
package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/gpuarb/gpuarb/internal/atomicfile"

	"github.com/gpuarb/gpuarb/policy"
)

// Registry is the tenants registered through the API, and the file that
// keeps them. It is not safe for concurrent use: the daemon holds it
// under its lock.
type Registry struct {
	path    string
	tenants []Entry // in attach order
	changed bool    // since the file was last written (Set, Remove)
}

// Entry is one registered tenant, as registered (rules not filled).
type Entry struct {
	policy.Tenant
	// Owner is the workload that registered it with rules of its own (a
	// container, a VM; see api.Client.Attach), "" for the operator.
	Owner string `json:"owner,omitempty"`
	// Via is the integration that registered it: ViaNRI, or "" for the
	// API (the CLI, the hooks).
	Via string `json:"via,omitempty"`
}

// ViaNRI marks the entries the NRI plugin made.
const ViaNRI = "nri"

// ErrUnreadable marks a registry file that cannot be read.
var ErrUnreadable = errors.New("unreadable attached tenants file")

// Load reads the file at path; a missing file is no tenants. A file that
// does not parse is an error wrapping ErrUnreadable, with an empty
// registry of that path.
func Load(path string) (*Registry, error) {
	a := &Registry{path: path}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return a, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read attached tenants: %w", err)
	}
	if err := json.Unmarshal(data, &a.tenants); err != nil {
		a.tenants = nil
		return a, fmt.Errorf("%w: %s: %v", ErrUnreadable, path, err)
	}
	return a, nil
}

// Path is the registry's file.
func (a *Registry) Path() string { return a.path }

// Entries are the registered tenants in attach order; the slice is the
// registry's own, to read.
func (a *Registry) Entries() []Entry { return a.tenants }

// Keep replaces the entries by kept (a subset, as a restarted daemon
// restores them) and writes the file when that dropped any.
func (a *Registry) Keep(kept []Entry) error {
	dropped := len(kept) != len(a.tenants)
	a.tenants = kept
	if !dropped {
		return nil
	}
	return a.Save()
}

// Get returns the entry of a name.
func (a *Registry) Get(name string) (Entry, bool) {
	for _, at := range a.tenants {
		if at.Name == name {
			return at, true
		}
	}
	return Entry{}, false
}

// Set adds at, or replaces the entry of its name.
func (a *Registry) Set(at Entry) {
	for i := range a.tenants {
		if a.tenants[i].Name == at.Name {
			a.tenants[i] = at
			a.changed = true
			return
		}
	}
	a.tenants = append(a.tenants, at)
	a.changed = true
}

// Remove drops the named entry; false when there is none.
func (a *Registry) Remove(name string) bool {
	for i := range a.tenants {
		if a.tenants[i].Name == name {
			a.tenants = append(a.tenants[:i], a.tenants[i+1:]...)
			a.changed = true
			return true
		}
	}
	return false
}

// Onto returns base with every entry added, validated. The
// operator's attachments replace file entries of the same name; a
// workload's never do (it is left out, and named in shadowed).
func (a *Registry) Onto(base *policy.Config) (cfg *policy.Config, shadowed []string, err error) {
	cfg = base
	for _, at := range a.tenants {
		if _, inFile := base.Tenant(at.Name); inFile && at.Owner != "" {
			shadowed = append(shadowed, at.Name)
			continue
		}
		next, err := cfg.With(at.Tenant)
		if err != nil {
			return nil, nil, fmt.Errorf("attached tenant %s: %w", at.Name, err)
		}
		cfg = next
	}
	return cfg, shadowed, nil
}

// Save writes the file atomically.
func (a *Registry) Save() error {
	data, err := a.encode()
	if err != nil {
		return err
	}
	return a.Write(data)
}

// Unsaved is the file's content if it changed since it was last written
// (nil: unchanged), for Write to write without the daemon's lock.
func (a *Registry) Unsaved() ([]byte, error) {
	if !a.changed {
		return nil, nil
	}
	a.changed = false
	return a.encode()
}

func (a *Registry) encode() ([]byte, error) {
	data, err := json.MarshalIndent(a.tenants, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode attached tenants: %w", err)
	}
	return append(data, '\n'), nil
}

// Write replaces the file with data, atomically.
func (a *Registry) Write(data []byte) error {
	if err := atomicfile.Write(a.path, data, 0o600); err != nil {
		return fmt.Errorf("save attached tenants: %w", err)
	}
	return nil
}
