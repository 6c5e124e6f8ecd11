package dockerapi

import (
	"errors"
	"net/http"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
)

// A follower's Docker endpoint. In a cluster of Berth servers, a server
// that does not lead follows the store with a read-only plane
// (control.Config.ReadOnly) and serves the reads that plane and the store
// can answer as the leader would, so that the leader's CPU goes to
// placement and commits: docker ps (-a and its filters too), docker
// inspect, logs and stats of a container on a shared back-end
// (driver.SharedBackend), docker events, the networks and volumes and
// their inspects, and ping and version. Everything else goes on to the
// leader (Options.Leader), unchanged, and so does every read of something
// only the leader knows or the follower's copy may not hold yet: a name
// or an id prefix the copy does not hold (the copy may be behind the
// leader's by the store's watch delay), a container being removed (its
// name may be taken again already), docker info (the nodes' use is the
// leader's), the images and exec sessions.
//
// The containers created and not started are the leader's, kept in the
// store (PrefixCreated): a follower reads them from there at each
// request (keptByLeader), and the networks and volumes too (the
// netStore's and volStore's reread). What the follower says of one
// container is as fresh as the store (findFollowed); its docker ps may be
// behind by the watch's delay.

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
	"GET /networks":              true,
	"GET /networks/{id}":         true,
	"GET /volumes":               true,
	"GET /volumes/{name}":        true,
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
	if errors.Is(err, driver.ErrNotFound) {
		return s.findKept(r, idOrName)
	}
	if err != nil || in.Phase == reconciler.Deleted || in.Phase == reconciler.Deleting || !authorized(r, in.Owner) {
		return ref{}, errForward
	}
	if current, err := s.plane.Current(ctx, in); err != nil || !current {
		return ref{}, errForward
	}
	return ref{id: in.ID, in: in}, nil
}

// findKept is findFollowed for a container created and not started: the
// one the store keeps (keptByLeader) with idOrName as its id or name that
// r's caller may see. The store holds it now, so it is current; a
// container the leader is starting may still be kept a moment after its
// instance is in the store, and is then shown as created, as the leader
// shows it until its start returns.
func (s *Server) findKept(r *http.Request, idOrName string) (ref, error) {
	kept, err := s.keptByLeader(r.Context())
	if err != nil {
		return ref{}, err
	}
	for id, c := range kept {
		if (id == idOrName || c.req.Name == idOrName) && authorized(r, c.owner) {
			return ref{id: id, created: c}, nil
		}
	}
	return ref{}, errForward
}
