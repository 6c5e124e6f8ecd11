package control

import (
	"context"

	"github.com/berth-dev/berth/driver"
)

// Usage measures the instance's live cpu and memory use through its
// provider; a provider that cannot measure answers driver.ErrUnsupported,
// an instance with no back-end resource driver.ErrInvalid.
func (p *Plane) Usage(ctx context.Context, ref string) (*driver.Usage, error) {
	in, prov, err := p.live(ref)
	if err != nil {
		return nil, err
	}
	return prov.Usage(ctx, in.BackendID)
}
