package dockerapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// PrefixCreated holds each container created and not started (its key
// the prefix and the container's id, its value keptCreated's JSON), kept
// in the store (Options.Store) from its create until its start has
// submitted it or it is removed: a server that starts to lead, or starts
// again, takes them on (Open), so that a docker create accepted is not
// lost with the server that accepted it.
const PrefixCreated = "/dockerapi/created/"

// keptCreated is a created container as the store keeps it.
type keptCreated struct {
	Request    scheduler.Request `json:"request"`
	Owner      string            `json:"owner"`
	AutoRemove bool              `json:"auto_remove,omitempty"`
	At         time.Time         `json:"at"`
}

// Open is New, then the containers created and not started that
// opts.Store keeps are taken on: what an earlier server (the leader
// before, or this one before it restarted) accepted. A kept container
// the plane already holds (its start had submitted it) is dropped.
func Open(ctx context.Context, plane *control.Plane, opts Options) (*Server, error) {
	s := New(plane, opts)
	if s.st == nil || s.follower() {
		return s, nil
	}
	kvs, _, err := s.st.List(ctx, PrefixCreated)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("dockerapi: read the containers created and not started: %w", err)
	}
	for _, kv := range kvs {
		id, c, err := decodeKept(kv)
		if err != nil {
			// Left where it is, for an operator to read: nothing
			// accepted is deleted unread.
			s.log.Warn("dockerapi: a kept created container is unreadable: not taken on", "key", kv.Key, "error", err)
			continue
		}
		if _, err := plane.Instance(ctx, id); err == nil {
			s.dropKept(ctx, id) // submitted before its key went
			continue
		} else if !errors.Is(err, driver.ErrNotFound) {
			s.Close()
			return nil, fmt.Errorf("dockerapi: take on created container %s: %w", id, err)
		}
		s.mu.Lock()
		s.created[id] = c
		s.mu.Unlock()
	}
	return s, nil
}

// decodeKept reads a created container kept under PrefixCreated.
func decodeKept(kv store.KV) (string, *created, error) {
	id := strings.TrimPrefix(kv.Key, PrefixCreated)
	var k keptCreated
	if err := json.Unmarshal(kv.Value, &k); err != nil {
		return "", nil, err
	}
	if k.Request.ID != id {
		return "", nil, fmt.Errorf("its request's id is %q, not %q", k.Request.ID, id)
	}
	return id, &created{req: k.Request, owner: k.Owner, autoRemove: k.AutoRemove, at: k.At}, nil
}

// createdNow returns the containers created and not started: the
// server's own, or on a follower those the leader keeps in the store
// (keptByLeader), read now. A container being started is in the plane
// already until its start drops it from these: it is left out, the
// plane's record is the one to show. The caller reads their fields under
// s.mu.
func (s *Server) createdNow(ctx context.Context) (map[string]*created, error) {
	var out map[string]*created
	if s.follower() {
		var err error
		if out, err = s.keptByLeader(ctx); err != nil {
			return nil, err
		}
	} else {
		s.mu.Lock()
		out = maps.Clone(s.created)
		s.mu.Unlock()
	}
	for id := range out {
		if _, err := s.plane.Instance(ctx, id); err == nil {
			delete(out, id)
		}
	}
	return out, nil
}

// keptByLeader returns the containers created and not started that the
// store keeps, as a follower reads them: the leader's (Open), as they
// are now. One the leader cannot read either is left out.
func (s *Server) keptByLeader(ctx context.Context) (map[string]*created, error) {
	if s.st == nil {
		return nil, errForward
	}
	kvs, _, err := s.st.List(ctx, PrefixCreated)
	if err != nil {
		return nil, errForward
	}
	out := make(map[string]*created, len(kvs))
	for _, kv := range kvs {
		if id, c, err := decodeKept(kv); err == nil {
			out[id] = c
		}
	}
	return out, nil
}

// keep writes c, created container id, to the store, as it is now. The
// caller holds c.keeping, which orders the writes of one container:
// each writes what the container is once its change is made, so the
// last written is the last change.
func (s *Server) keep(ctx context.Context, id string, c *created) error {
	if s.st == nil {
		return nil
	}
	s.mu.Lock()
	v, err := json.Marshal(keptCreated{Request: c.req, Owner: c.owner, AutoRemove: c.autoRemove, At: c.at})
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if _, err := s.st.Txn(ctx, nil, []store.Op{store.Put(PrefixCreated+id, v)}); err != nil {
		return fmt.Errorf("keep created container %s: %w", id, err)
	}
	return nil
}

// dropKept deletes created container id from the store. A key it fails
// to delete is dropped by the next server to take on the kept ones (the
// container is then in the plane) or shown again as created (it was
// removed: remove it again).
func (s *Server) dropKept(ctx context.Context, id string) {
	if s.st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	if _, err := s.st.Txn(ctx, nil, []store.Op{store.Delete(PrefixCreated + id)}); err != nil {
		s.log.Warn("dockerapi: drop a kept created container", "container", id, "error", err)
	}
}

// changeCreated applies change to created container id under s.mu, then
// keeps the container as changed. change returns an error to refuse the
// change (nothing is kept then). A container gone meanwhile is noSuch(ref).
func (s *Server) changeCreated(ctx context.Context, id, ref string, change func(c *created) error) error {
	s.mu.Lock()
	c, ok := s.created[id]
	s.mu.Unlock()
	if !ok {
		return noSuch(ref)
	}
	c.keeping.Lock()
	defer c.keeping.Unlock()
	s.mu.Lock()
	if s.created[id] != c {
		s.mu.Unlock()
		return noSuch(ref)
	}
	err := change(c)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.keep(ctx, id, c)
}
