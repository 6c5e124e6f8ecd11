package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store"
)

// KeyCluster holds this cluster's identity (clusterRecord), made once.
const KeyCluster = "/berth/cluster"

// clusterRecord is the cluster's identity as stored.
type clusterRecord struct {
	// ID is written on every back-end resource as driver.TagCluster; it is
	// what makes a resource this cluster's.
	ID string `json:"id"`
	// Name is the configured name when the id was made (a label for
	// people: the resources carry the current one as
	// driver.TagClusterName).
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	// Legacy is set when the store held instances from before cluster ids:
	// their resources carry the cluster's name as its id, so the name is
	// kept as the id.
	Legacy bool `json:"legacy,omitempty"`
}

// loadIdentity reads the cluster's id from the store, or makes it: a random
// 128-bit id for a new store; the configured name for a store that already
// holds instances from before cluster ids (their resources carry the name),
// which it says in the log. It runs after load.
func (s *state) loadIdentity(ctx context.Context) error {
	for range 3 {
		kv, err := s.st.Get(ctx, KeyCluster)
		if err == nil {
			var rec clusterRecord
			if err := json.Unmarshal(kv.Value, &rec); err != nil || rec.ID == "" {
				return fmt.Errorf("control: %s: not a cluster identity: %v", KeyCluster, err)
			}
			s.clusterID = rec.ID
			return nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("control: read the cluster id: %w", err)
		}
		if s.cfg.ReadOnly {
			// The plane that writes makes it; a read-only plane tags
			// nothing.
			return nil
		}
		rec := clusterRecord{ID: newClusterID(), Name: s.cfg.Cluster, Created: s.now().UTC()}
		if s.recs.len() > 0 {
			rec.ID, rec.Legacy = s.cfg.Cluster, true
			s.log.Warn("this store holds instances from before cluster ids: their back-end resources carry the cluster name as its id, so it stays the id; another server with the same name on the same back-ends would take them for its own: give each cluster its own name, or start from a new store",
				"cluster", s.cfg.Cluster)
		}
		b, err := json.Marshal(&rec)
		if err != nil {
			return err
		}
		ok, _, err := s.commit(ctx, &txn{cmps: []store.Cmp{{Key: KeyCluster}}, ops: []store.Op{store.Put(KeyCluster, b)}})
		if err != nil {
			return fmt.Errorf("control: store the cluster id: %w", err)
		}
		if ok {
			s.clusterID = rec.ID
			return nil
		}
		// Another server on the same store made it first: read theirs.
	}
	return fmt.Errorf("control: the cluster id keeps changing in the store")
}

func newClusterID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// owns is the one adoption rule: a back-end resource is in's only when it is
// Berth's, carries this cluster's id and in's id. Launch, sync and resume
// all ask it before treating a resource as a record's; anything else is
// never adopted, stopped or deleted as in's.
func (s *state) owns(in *reconciler.Instance, got *driver.Instance) bool {
	return got != nil && got.Tags[driver.TagManaged] == "true" &&
		got.Tags[driver.TagCluster] == s.clusterID && got.Tags[driver.TagInstance] == in.ID
}

// ours reports whether a back-end resource carries this cluster's id (it
// may still be no record's: a leak).
func (s *state) ours(got *driver.Instance) bool {
	return got.Tags[driver.TagManaged] == "true" && got.Tags[driver.TagCluster] == s.clusterID
}

// ClusterID returns the id this cluster writes on every back-end resource
// (driver.TagCluster): made once, kept in the store.
func (p *Plane) ClusterID() string { return p.clusterID }
