package daemon

import (
	"errors"
	"fmt"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/cgroup"
	nriplugin "github.com/gpuarb/gpuarb/nri-plugin"
	"github.com/gpuarb/gpuarb/policy"
	"github.com/gpuarb/gpuarb/registry"
)

// nriRegistry is the daemon as the NRI plugin's registry: attachments
// made as a workload's through the API are, marked registry.ViaNRI.
type nriRegistry struct{ d *Daemon }

var _ nriplugin.Registry = nriRegistry{}

func (r nriRegistry) Attach(t policy.Tenant, owner string) (api.AttachResult, error) {
	res, err := r.d.attachVia(t, owner, registry.ViaNRI)
	switch {
	case errors.Is(err, errNameTaken):
		err = fmt.Errorf("%w: %v", api.ErrConflict, err)
	case errors.Is(err, cgroup.ErrHoldsGpuarb):
		err = fmt.Errorf("%w: %v", nriplugin.ErrOwnContainer, err)
	}
	return res, err
}

func (r nriRegistry) Detach(name, owner string) (bool, error) {
	err := r.d.detach(name, owner)
	if errors.Is(err, errNoTenant) {
		return false, nil
	}
	return err == nil, err
}

func (r nriRegistry) Attached() map[string]string {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	out := map[string]string{}
	for _, at := range r.d.attached.Entries() {
		if at.Via == registry.ViaNRI {
			out[at.Owner] = at.Name
		}
	}
	return out
}
