package control

import (
	"context"
	"fmt"
	"slices"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
)

// ConnectNetwork puts the instance ref, which its back-end holds (running
// or ended), on the back-end's network name with aliases besides its name
// (driver.NetworkConnector), then records it in the instance's spec, so
// that it outlives the server: name joins Spec.Networks, aliases join
// Spec.NetworkAliases, and edit, when not nil, changes that copy of the
// spec further (its labels) in the same write. A provider that cannot is
// driver.ErrUnsupported naming it and its driver; an instance without a
// back-end resource is driver.ErrInvalid.
func (p *Plane) ConnectNetwork(ctx context.Context, ref, name string, aliases []string, edit func(*driver.Spec)) error {
	return p.setNetwork(ctx, ref, name, true, aliases, edit)
}

// DisconnectNetwork takes the instance ref off the back-end's network name
// (driver.NetworkConnector), then removes it from Spec.Networks and lets
// edit, when not nil, change that copy of the spec further in the same
// write. The errors are ConnectNetwork's.
func (p *Plane) DisconnectNetwork(ctx context.Context, ref, name string, edit func(*driver.Spec)) error {
	return p.setNetwork(ctx, ref, name, false, nil, edit)
}

func (p *Plane) setNetwork(ctx context.Context, ref, name string, connect bool, aliases []string, edit func(*driver.Spec)) error {
	if name == "" {
		return &driver.FieldError{Path: "network", Reason: "required: name the network"}
	}
	if len(aliases) > driver.MaxListItems {
		return &driver.FieldError{Path: "network_aliases", Reason: fmt.Sprintf("%d aliases: at most %d", len(aliases), driver.MaxListItems)}
	}
	in, prov, err := p.verbs.live(ref)
	if err != nil {
		return err
	}
	if !slices.Contains(prov.Capabilities(), driver.CapNetworkConnect) {
		return driver.Errorf(driver.ErrUnsupported, "provider %q (driver %q) cannot connect a running instance to a network, or disconnect it", prov.Name(), driverName(prov))
	}
	if connect {
		err = prov.ConnectNetwork(ctx, in.BackendID, name, aliases)
	} else {
		err = prov.DisconnectNetwork(ctx, in.BackendID, name)
	}
	if err != nil {
		return err
	}
	return p.verbs.mutate(context.WithoutCancel(ctx), in.ID, func(x *reconciler.Instance) {
		var spec driver.Spec
		if x.Spec != nil {
			spec = *x.Spec // shared with the request's other instances
		}
		spec.Networks = slices.DeleteFunc(slices.Clone(spec.Networks), func(n string) bool { return n == name })
		if connect {
			spec.Networks = append(spec.Networks, name)
			spec.NetworkAliases = slices.Clone(spec.NetworkAliases)
			for _, a := range aliases {
				if !slices.Contains(spec.NetworkAliases, a) {
					spec.NetworkAliases = append(spec.NetworkAliases, a)
				}
			}
		}
		if edit != nil {
			edit(&spec)
		}
		x.Spec = &spec
	})
}
