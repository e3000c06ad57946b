package daemon

import (
	"errors"
	"fmt"

	"github.com/gpuarb/gpuarb/api"
	nriplugin "github.com/gpuarb/gpuarb/nri-plugin"
	"github.com/gpuarb/gpuarb/policy"
)

// nriRegistry is the daemon as the NRI plugin's registry: attachments
// made as a workload's through the API are, marked viaNRI.
type nriRegistry struct{ d *Daemon }

var _ nriplugin.Registry = nriRegistry{}

func (r nriRegistry) Attach(t policy.Tenant, owner string) (api.AttachResult, error) {
	res, err := r.d.attachVia(t, owner, viaNRI)
	if errors.Is(err, errNameTaken) {
		err = fmt.Errorf("%w: %v", api.ErrConflict, err)
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
	for _, at := range r.d.attached.tenants {
		if at.Via == viaNRI {
			out[at.Owner] = at.Name
		}
	}
	return out
}
