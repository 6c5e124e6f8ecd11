package dockerapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/berth-dev/berth/store"
)

// PrefixAutoRemove holds a mark per started --rm container (its key the
// prefix and the container's id, its value empty), kept in the store
// (Options.Store) from before the container is submitted until it is
// removed: a server that starts to lead, or starts again, removes the
// marked containers once they end, as the one that started them would
// have; a follower's inspect shows HostConfig.AutoRemove from it.
const PrefixAutoRemove = "/dockerapi/autoremove/"

// markTimeout bounds a store call about a mark made where no request
// bounds it (a removal in the background).
const markTimeout = 30 * time.Second

// markAutoRemove keeps id's mark. Without a store it does nothing: the
// mark is this server's memory alone (autoRm).
func (s *Server) markAutoRemove(ctx context.Context, id string) error {
	if s.st == nil {
		return nil
	}
	if _, err := s.st.Txn(ctx, nil, []store.Op{store.Put(PrefixAutoRemove+id, nil)}); err != nil {
		return fmt.Errorf("keep the --rm of container %s: %w", id, err)
	}
	return nil
}

// unmarkAutoRemove drops id's mark: the container is removed, or was
// never submitted. A mark it fails to drop is dropped by the next server
// that leads, which finds no container under it.
func (s *Server) unmarkAutoRemove(id string) {
	if s.st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), markTimeout)
	defer cancel()
	if _, err := s.st.Txn(ctx, nil, []store.Op{store.Delete(PrefixAutoRemove + id)}); err != nil {
		s.log.Warn("dockerapi: --rm: drop the mark", "container", id, "error", err)
	}
}

// autoRemoveMarked reports whether the store keeps id's mark.
func (s *Server) autoRemoveMarked(ctx context.Context, id string) (bool, error) {
	if s.st == nil {
		return false, nil
	}
	_, err := s.st.Get(ctx, PrefixAutoRemove+id)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	}
	return false, err
}

// resumeAutoRemove takes on the marks the store keeps: each marked
// container is removed once it has ended (removeWhenEnded), by this
// server, until Close.
func (s *Server) resumeAutoRemove() {
	ctx, cancel := s.until(context.Background())
	defer cancel()
	kvs, _, err := s.st.List(ctx, PrefixAutoRemove)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("dockerapi: --rm: read the marks: the containers they mark are not removed when they end", "error", err)
		}
		return
	}
	for _, kv := range kvs {
		id := strings.TrimPrefix(kv.Key, PrefixAutoRemove)
		s.mu.Lock()
		_, taken := s.autoRm[id]
		s.autoRm[id] = struct{}{}
		s.mu.Unlock()
		if !taken {
			s.wg.Go(func() { s.removeWhenEnded(id) })
		}
	}
}
