package dockerapi

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/reconciler"
)

// A follower's Docker endpoint. In a cluster of Berth servers, a server
// that does not lead follows the store with a read-only plane
// (control.Config.ReadOnly) and serves the reads that plane can answer as
// the leader would, so that the leader's CPU goes to placement and
// commits: docker ps of the running containers, docker inspect, logs and
// stats of a container on a shared back-end (driver.SharedBackend),
// docker events, and ping and version. Everything else goes on to the
// leader (Options.Leader), unchanged, and so does every read of something
// the leader alone knows: the containers created and not started yet
// live in the leader's memory, so docker ps -a, a name the follower's copy
// does not hold (or not yet: the copy may be behind the leader's by the
// store's watch delay) and a container being removed (its name may be
// taken again already) are the leader's to answer. What the follower says
// of one container is as fresh as the store (findFollowed); its docker ps
// may be behind by the watch's delay.

// followerRoutes are the routes a follower's endpoint serves itself (its
// handlers may still hand a request on with errForward).
var followerRoutes = map[string]bool{
	"GET /_ping":                 true,
	"HEAD /_ping":                true,
	"GET /version":               true,
	"GET /containers/json":       true,
	"GET /containers/{id}/json":  true,
	"GET /containers/{id}/logs":  true,
	"GET /containers/{id}/stats": true,
	"GET /events":                true,
}

// errForward is what a follower's handler returns for a request its
// read-only plane cannot answer as the leader would: the leader answers
// it instead.
var errForward = errors.New("dockerapi: the leader's to answer")

// origKey is the context key of the request as it reached the server,
// before its version prefix was taken off: what a follower forwards.
type origKey struct{}

// follower reports whether s is a follower's endpoint.
func (s *Server) follower() bool { return s.leader != nil }

// forward hands r, as it reached the server, to the leader.
func (s *Server) forward(w http.ResponseWriter, r *http.Request) {
	if orig, ok := r.Context().Value(origKey{}).(*http.Request); ok {
		r = orig
	}
	s.leader.ServeHTTP(w, r)
}

// listedByFollower reports whether a follower's copy holds every container
// docker ps with r's query lists: the running ones, without --all and
// without a status filter (which may ask for created ones).
func listedByFollower(r *http.Request) bool {
	q := r.URL.Query()
	all, _ := strconv.ParseBool(q.Get("all"))
	if all {
		return false
	}
	f, err := filters(r, listFilters...)
	return err == nil && len(f["status"]) == 0
}

// findFollowed is find on a follower: an id or a name its copy holds, of
// a container not being removed, that the caller is authorized for, as
// the store holds it now. What else the reference might be (a container
// created on the leader, one the copy does not hold yet, a prefix of an
// id, which a created container might share), the leader tells.
//
// The copy follows the store's watch, a little behind it. A client that
// changed a container through the leader and then reads it here must see
// its change, as docker clients expect (compose starts a container, then
// inspects it): the copy answers only when it holds the record the store
// holds now (control.Plane.Current).
func (s *Server) findFollowed(r *http.Request, idOrName string) (ref, error) {
	ctx := r.Context()
	in, err := s.plane.Lookup(ctx, idOrName, control.ScopeOf(identityOf(r)))
	if err != nil || in.Phase == reconciler.Deleted || in.Phase == reconciler.Deleting || !authorized(r, in.Owner) {
		return ref{}, errForward
	}
	if current, err := s.plane.Current(ctx, in); err != nil || !current {
		return ref{}, errForward
	}
	return ref{id: in.ID, in: in}, nil
}
