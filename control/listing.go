package control

import (
	"context"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
)

// listingTTL is how long one listing of a provider's tagged resources is
// shared by the operations that look instances up by tag.
const listingTTL = 250 * time.Millisecond

// tagIndex is one listing of a provider's resources carrying this
// cluster's tags, indexed by Berth's instance id.
type tagIndex map[string][]*driver.Instance

// listings shares one listing per provider among the many operations that
// look instances up by tag (adoption after a restart, deletes of instances
// whose back-end id is unknown), so that thousands of them cost one call.
type listings map[string]*driver.ListCache[tagIndex]

func (s syncer) newListings() listings {
	ls := listings{}
	for name, p := range s.provs {
		ls[name] = &driver.ListCache[tagIndex]{
			TTL: listingTTL,
			Fetch: func(ctx context.Context) (tagIndex, error) {
				all, err := p.List(ctx, map[string]string{driver.TagCluster: s.clusterID})
				if err != nil {
					return nil, err
				}
				idx := make(tagIndex, len(all))
				for _, in := range all {
					id := in.Tags[driver.TagInstance]
					idx[id] = append(idx[id], in)
				}
				return idx, nil
			},
		}
	}
	return ls
}

// tagged returns p's resources tagged with instance id, from a listing at
// most listingTTL old.
func (s syncer) tagged(ctx context.Context, p *provider.Provider, id string) ([]*driver.Instance, error) {
	idx, err := s.lists[p.Name()].Get(ctx)
	if err != nil {
		return nil, err
	}
	return idx[id], nil
}
