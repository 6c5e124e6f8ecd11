package control

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// PrefixQuarantine holds the records a plane could not take when it
// started: a value that does not decode, or that breaks an invariant of
// its kind (a number beyond its range, an instance whose spec is nowhere).
// Each is moved, not deleted, to PrefixQuarantine followed by its
// original key without the leading '/', as a quarantined record; the
// plane starts with the rest. Plane.Quarantined lists them (berth
// doctor).
const PrefixQuarantine = "/berth/quarantine/"

// quarantined is a record as kept under PrefixQuarantine.
type quarantined struct {
	Key    string    `json:"key"`
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
	Value  []byte    `json:"value"`
}

// Quarantined is a record moved aside at start-up (PrefixQuarantine). Its
// bytes stay in the store, under QuarantineKey; they may hold a spec's
// secrets and are not part of the answer.
type Quarantined struct {
	// Key is the record's original key; QuarantineKey where it is kept.
	Key           string `json:"key"`
	QuarantineKey string `json:"quarantine_key"`
	// Reason says what is wrong with it.
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
	Bytes  int       `json:"bytes"`
}

// quarantineKey is where the record under key is kept once moved aside.
func quarantineKey(key string) string { return PrefixQuarantine + strings.TrimPrefix(key, "/") }

// moveAside moves the record kv to PrefixQuarantine, saying why, in one
// transaction that deletes it only if it is still what was read, and
// logs its key. A read-only plane writes nothing: it logs the record and
// leaves it to the leader.
func (s *state) moveAside(ctx context.Context, kv store.KV, why error) error {
	if s.cfg.ReadOnly {
		s.log.Error("stored record left out: it cannot be read", "key", kv.Key, "error", why)
		return nil
	}
	b, err := json.Marshal(quarantined{Key: kv.Key, Reason: why.Error(), Time: s.now().UTC(), Value: kv.Value})
	if err != nil {
		return fmt.Errorf("control: quarantine %s: %w", kv.Key, err)
	}
	qkey := quarantineKey(kv.Key)
	t := &txn{cmps: []store.Cmp{{Key: kv.Key, ModRevision: kv.ModRevision}}, ops: []store.Op{store.Put(qkey, b), store.Delete(kv.Key)}}
	if _, _, err := s.commit(ctx, t); err != nil {
		return fmt.Errorf("control: quarantine %s: %w", kv.Key, err)
	}
	// Had the record changed meanwhile (another writer), it stays: the
	// plane that wrote it reads it.
	s.log.Error("stored record moved aside: it cannot be read; berth doctor lists it", "key", kv.Key, "kept_as", qkey, "error", why)
	return nil
}

// checkStoredRequest returns what breaks an invariant of a stored
// request: the numbers the plane keeps of it and places by beyond their
// ranges.
func checkStoredRequest(r *storedRequest) error {
	var es driver.FieldErrors
	scheduler.RangePriority.Check(&es, "priority", int64(r.Request.Priority))
	scheduler.RangeCount.Check(&es, "count", int64(r.Request.Count))
	es.AddErr("", driver.ValidateResources("", r.Request.Resources))
	return es.Err()
}

// Quarantined lists the records moved aside when a plane started
// (PrefixQuarantine), sorted by key: what berth doctor shows.
func (p *Plane) Quarantined(ctx context.Context) ([]Quarantined, error) {
	return p.quarantinedList(ctx)
}

// quarantinedList is Plane.Quarantined.
func (s *state) quarantinedList(ctx context.Context) ([]Quarantined, error) {
	kvs, _, err := s.st.List(ctx, PrefixQuarantine)
	if err != nil {
		return nil, fmt.Errorf("control: list quarantine: %w", err)
	}
	out := make([]Quarantined, 0, len(kvs))
	for _, kv := range kvs {
		q := Quarantined{QuarantineKey: kv.Key, Key: "/" + strings.TrimPrefix(kv.Key, PrefixQuarantine), Bytes: len(kv.Value)}
		var r quarantined
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			q.Reason = "the quarantined record itself cannot be read: " + err.Error()
		} else {
			q.Reason, q.Time, q.Bytes = r.Reason, r.Time, len(r.Value)
		}
		out = append(out, q)
	}
	return out, nil
}
