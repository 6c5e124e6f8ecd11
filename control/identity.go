package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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

// KeyClusterCopy holds a copy of the identity at KeyCluster, written with
// it: a record that cannot be read is restored from the other.
const KeyClusterCopy = "/berth/cluster-copy"

// loadIdentity reads the cluster's id from the store, or makes it: a random
// 128-bit id for a new store; the configured name for a store that already
// holds instances from before cluster ids (their resources carry the name),
// which it says in the log. It runs after load.
//
// The identity is kept twice (KeyCluster, KeyClusterCopy). A copy that
// cannot be read is moved aside (berth doctor lists it) and written again
// from the other. When neither can be read, a store with no instances
// gets a new id (the back-end resources of the old one, if any, are
// another cluster's to this one: never adopted, never touched); a store
// with instances is refused, naming the record: with a new id every
// instance's resource would be unadopted and run a second time.
func (s *state) loadIdentity(ctx context.Context) error {
	for range 3 {
		main, mainErr, err := s.readIdentity(ctx, KeyCluster)
		if err != nil {
			return err
		}
		cp, cpErr, err := s.readIdentity(ctx, KeyClusterCopy)
		if err != nil {
			return err
		}
		switch {
		case mainErr == nil && main.rec.ID != "":
			s.clusterID = main.rec.ID
			if cpErr != nil || cp.rec.ID != main.rec.ID {
				return s.repairIdentity(ctx, cp, cpErr, KeyClusterCopy, main.kv.Value)
			}
			return nil
		case cpErr == nil && cp.rec.ID != "":
			s.clusterID = cp.rec.ID
			return s.repairIdentity(ctx, main, mainErr, KeyCluster, cp.kv.Value)
		case (mainErr != nil || cpErr != nil) && s.recs.len() > 0:
			bad := mainErr
			if bad == nil {
				bad = cpErr
			}
			return fmt.Errorf("control: the cluster's identity cannot be read (%v) and this store holds instances: their back-end resources carry the lost id, and a new one would run each of them again; restore %s from a snapshot (berth doctor shows what is stored)", bad, KeyCluster)
		}
		if s.cfg.ReadOnly {
			// The plane that writes makes it; a read-only plane tags
			// nothing.
			return nil
		}
		for _, r := range []struct {
			got identityRead
			err error
		}{{main, mainErr}, {cp, cpErr}} {
			if r.err != nil {
				if err := s.moveAside(ctx, r.got.kv, r.err); err != nil {
					return err
				}
			}
		}
		if mainErr != nil || cpErr != nil {
			s.log.Warn("the cluster's identity could not be read and the store holds no instance: a new cluster id is made; back-end resources of the old one are left alone", "cluster", s.cfg.Cluster)
			continue // read again: both keys are free now
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
		ok, _, err := s.commit(ctx, &txn{cmps: []store.Cmp{{Key: KeyCluster}, {Key: KeyClusterCopy}},
			ops: []store.Op{store.Put(KeyCluster, b), store.Put(KeyClusterCopy, b)}})
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

// identityRead is one stored copy of the identity.
type identityRead struct {
	kv  store.KV // ModRevision 0: not stored
	rec clusterRecord
}

// readIdentity reads the copy at key. A copy that is not stored has an
// empty record and no error; one that cannot be decoded, or holds no id,
// is the second result; the third is the store's.
func (s *state) readIdentity(ctx context.Context, key string) (identityRead, error, error) {
	kv, err := s.st.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return identityRead{kv: store.KV{Key: key}}, nil, nil
	}
	if err != nil {
		return identityRead{}, nil, fmt.Errorf("control: read the cluster id: %w", err)
	}
	r := identityRead{kv: kv}
	if err := json.Unmarshal(kv.Value, &r.rec); err != nil || r.rec.ID == "" {
		return r, fmt.Errorf("%s: not a cluster identity: %v", key, err), nil
	}
	return r, nil, nil
}

// repairIdentity writes good at key, whose copy got is missing, differs,
// or could not be read (bad: then it is moved aside first). A read-only
// plane leaves it to the leader.
func (s *state) repairIdentity(ctx context.Context, got identityRead, bad error, key string, good []byte) error {
	if s.cfg.ReadOnly {
		return nil
	}
	rev := got.kv.ModRevision
	if bad != nil {
		if err := s.moveAside(ctx, got.kv, bad); err != nil {
			return err
		}
		rev = 0
	} else if got.kv.ModRevision != 0 {
		s.log.Error("the cluster's two identity records differ: the copy is written again from "+KeyCluster, "copy", string(got.kv.Value))
	}
	if _, _, err := s.commit(ctx, &txn{cmps: []store.Cmp{{Key: key, ModRevision: rev}}, ops: []store.Op{store.Put(key, good)}}); err != nil {
		return fmt.Errorf("control: restore %s: %w", key, err)
	}
	return nil
}

func newClusterID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ClusterID returns the id this cluster writes on every back-end resource
// (driver.TagCluster): made once, kept in the store.
func (p *Plane) ClusterID() string { return p.clusterID }
