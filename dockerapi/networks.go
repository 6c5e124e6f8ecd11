package dockerapi

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/reconciler"
)

// LabelNetwork is the label that names the Berth network a container was
// created on (docker run --network NAME, a Compose service's network). It
// is kept in the instance's spec, so the membership outlives the server.
const LabelNetwork = "io.berth.network"

// Bounds of the networks the endpoint keeps.
const (
	MaxNetworks      = 1000
	maxNetworkLabels = 64
	maxNetworkName   = 128
)

// networkName is the engine's rule for a network's name.
var networkName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// bnetwork is a network of a namespace, kept by the endpoint. Berth does
// not create it on any back-end: it names a set of containers, which run on
// their back-end's default network.
type bnetwork struct {
	id, name, owner string
	created         time.Time
	labels          map[string]string
	attachable      bool
}

// netStore holds the networks, by id. Lock order: mu is a leaf, never held
// while calling the plane or taking Server.mu.
type netStore struct {
	mu   sync.Mutex
	byID map[string]*bnetwork
}

func newNetStore() *netStore { return &netStore{byID: map[string]*bnetwork{}} }

// newNetworkID returns 64 hex digits, the engine's network id form.
func newNetworkID() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// lookup returns the network ref names among those owned by a namespace
// see accepts: an id, a name, or a unique prefix of an id. A name held in
// several namespaces resolves to the one in prefer.
func (ns *netStore) lookup(ref, prefer string, see func(string) bool) (*bnetwork, error) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	var byName, byPrefix []*bnetwork
	for _, n := range ns.byID {
		if !see(n.owner) {
			continue
		}
		switch {
		case n.id == ref:
			return n, nil
		case n.name == ref:
			byName = append(byName, n)
		case strings.HasPrefix(n.id, ref):
			byPrefix = append(byPrefix, n)
		}
	}
	if len(byName) > 1 {
		if i := slices.IndexFunc(byName, func(n *bnetwork) bool { return n.owner == prefer }); i >= 0 {
			return byName[i], nil
		}
		return nil, badRequest("network %s is in several namespaces: give its id", ref)
	}
	if len(byName) == 1 {
		return byName[0], nil
	}
	if len(byPrefix) == 1 {
		return byPrefix[0], nil
	}
	if len(byPrefix) > 1 {
		return nil, badRequest("network %s is ambiguous (%d matches): give more of its id", ref, len(byPrefix))
	}
	return nil, &httpError{http.StatusNotFound, fmt.Sprintf("network %s not found", ref)}
}

// findNetwork resolves a network reference among what r's caller sees.
func (s *Server) findNetwork(r *http.Request, ref string) (*bnetwork, error) {
	who := identityOf(r)
	prefer, _ := who.Namespace("")
	return s.nets.lookup(ref, prefer, who.Sees)
}

// members lists the containers (instances not deleted, and containers
// created here) of network n, by id.
func (s *Server) members(r *http.Request, n *bnetwork) (map[string]string, error) {
	list, err := s.plane.Instances(r.Context(), control.Filter{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, in := range list {
		if in.Owner == n.owner && in.Phase != reconciler.Deleted && in.Phase != reconciler.Deleting && networkOf(in) == n.name {
			out[in.ID] = in.Name
		}
	}
	s.mu.Lock()
	for id, c := range s.created {
		if c.owner == n.owner && c.req.Spec.Labels[LabelNetwork] == n.name {
			out[id] = instanceOf(id, c).Name
		}
	}
	s.mu.Unlock()
	return out, nil
}

// networkOf names the Berth network in was created on, if any.
func networkOf(in control.Instance) string {
	if in.Spec == nil {
		return ""
	}
	return in.Spec.Labels[LabelNetwork]
}

// endpointsOf is a container's NetworkSettings.Networks: its Berth network,
// with no address (the back-end's default network gives it one).
func endpointsOf(in control.Instance) map[string]*network.EndpointSettings {
	name := networkOf(in)
	if name == "" {
		return nil
	}
	return map[string]*network.EndpointSettings{name: {}}
}

func (n *bnetwork) summary(members map[string]string) network.Inspect {
	out := network.Inspect{
		Network: network.Network{
			Name: n.name, ID: n.id, Created: n.created, Scope: "local", Driver: "bridge",
			EnableIPv4: true, IPAM: network.IPAM{Driver: "default", Options: map[string]string{}, Config: []network.IPAMConfig{}},
			Attachable: n.attachable, Options: map[string]string{}, Labels: maps.Clone(n.labels),
		},
		Containers: map[string]network.EndpointResource{},
	}
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	for id, name := range members {
		out.Containers[id] = network.EndpointResource{Name: name}
	}
	return out
}

// networkCreate keeps a network in the caller's namespace. What the engine
// would configure on a bridge (subnets, options, internal, IPv6) is refused
// by name: Berth's containers run on their back-end's default network.
func (s *Server) networkCreate(w http.ResponseWriter, r *http.Request) error {
	var req network.CreateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return badRequest("decode the network: %v", err)
	}
	if req.Name == "" {
		return badRequest("Name: a network needs a name")
	}
	if len(req.Name) > maxNetworkName || !networkName.MatchString(req.Name) {
		return badRequest("Name %q: want at most %d of [a-zA-Z0-9_.-], starting with a letter or digit", req.Name, maxNetworkName)
	}
	switch req.Name {
	case "bridge", "host", "none", "default":
		return &httpError{http.StatusForbidden, fmt.Sprintf("%s is a pre-defined network and cannot be created", req.Name)}
	}
	if len(req.Labels) > maxNetworkLabels {
		return badRequest("Labels: %d labels, at most %d", len(req.Labels), maxNetworkLabels)
	}
	var refused []string
	refuse := func(cond bool, what string) {
		if cond {
			refused = append(refused, what)
		}
	}
	refuse(req.Driver != "" && req.Driver != "bridge", "--driver "+req.Driver+" (Berth keeps bridge networks only)")
	refuse(req.Scope != "" && req.Scope != "local", "--scope "+req.Scope)
	refuse(req.Internal, "--internal")
	refuse(req.Ingress, "--ingress")
	refuse(req.ConfigOnly || (req.ConfigFrom != nil && req.ConfigFrom.Network != ""), "--config-only/--config-from")
	refuse(req.EnableIPv6 != nil && *req.EnableIPv6, "--ipv6")
	refuse(req.EnableIPv4 != nil && !*req.EnableIPv4, "a network without IPv4")
	if req.IPAM != nil {
		refuse(req.IPAM.Driver != "" && req.IPAM.Driver != "default", "--ipam-driver "+req.IPAM.Driver)
		refuse(len(req.IPAM.Config) > 0, "--subnet/--ip-range/--gateway")
		refuse(len(req.IPAM.Options) > 0, "--ipam-opt")
	}
	refuse(len(req.Options) > 0, "--opt "+strings.Join(slices.Sorted(maps.Keys(req.Options)), ", "))
	if len(refused) > 0 {
		return unsupported("Berth cannot honour %s: its networks name a set of containers, which run on their back-end's default network", strings.Join(refused, ", "))
	}
	owner, err := identityOf(r).Namespace("")
	if err != nil {
		return err
	}
	n := &bnetwork{id: newNetworkID(), name: req.Name, owner: owner, created: time.Now().UTC(), labels: maps.Clone(req.Labels), attachable: req.Attachable}
	s.nets.mu.Lock()
	defer s.nets.mu.Unlock()
	if len(s.nets.byID) >= MaxNetworks {
		return &httpError{http.StatusTooManyRequests, fmt.Sprintf("Berth keeps at most %d networks: remove some first (docker network prune)", MaxNetworks)}
	}
	for _, o := range s.nets.byID {
		if o.owner == owner && o.name == req.Name {
			return &httpError{http.StatusConflict, fmt.Sprintf("network with name %s already exists", req.Name)}
		}
	}
	s.nets.byID[n.id] = n
	return writeJSON(w, http.StatusCreated, network.CreateResponse{ID: n.id, Warning: ""})
}

func (s *Server) networkInspect(w http.ResponseWriter, r *http.Request) error {
	if sc := r.URL.Query().Get("scope"); sc != "" && sc != "local" {
		return &httpError{http.StatusNotFound, fmt.Sprintf("network %s not found (Berth's networks are local)", r.PathValue("id"))}
	}
	n, err := s.findNetwork(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	m, err := s.members(r, n)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, n.summary(m))
}

// visibleNetworks lists the networks r's caller sees, oldest first.
func (s *Server) visibleNetworks(r *http.Request) []*bnetwork {
	who := identityOf(r)
	s.nets.mu.Lock()
	var out []*bnetwork
	for _, n := range s.nets.byID {
		if who.Sees(n.owner) {
			out = append(out, n)
		}
	}
	s.nets.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].created.Equal(out[j].created) {
			return out[i].created.Before(out[j].created)
		}
		return out[i].id < out[j].id
	})
	return out
}

// labelsMatch reports whether labels has every key (or key=value) of want.
func labelsMatch(labels map[string]string, want []string) bool {
	for _, l := range want {
		k, v, hasV := strings.Cut(l, "=")
		got, has := labels[k]
		if !has || (hasV && got != v) {
			return false
		}
	}
	return true
}

func (s *Server) networkList(w http.ResponseWriter, r *http.Request) error {
	f, err := filters(r, "id", "name", "label", "driver", "scope", "type", "dangling")
	if err != nil {
		return err
	}
	out := []network.Inspect{}
	for _, n := range s.visibleNetworks(r) {
		ok := matchAny(f["id"], func(v string) bool { return strings.HasPrefix(n.id, v) }) &&
			matchAny(f["name"], func(v string) bool { return strings.Contains(n.name, v) }) &&
			matchAny(f["driver"], func(v string) bool { return v == "bridge" }) &&
			matchAny(f["scope"], func(v string) bool { return v == "local" }) &&
			matchAny(f["type"], func(v string) bool { return v == "custom" }) &&
			labelsMatch(n.labels, f["label"])
		if !ok {
			continue
		}
		m, err := s.members(r, n)
		if err != nil {
			return err
		}
		if len(f["dangling"]) > 0 && (len(m) == 0) != (f["dangling"][0] == "true" || f["dangling"][0] == "1") {
			continue
		}
		out = append(out, n.summary(m))
	}
	return writeJSON(w, http.StatusOK, out)
}

// networkRemove removes a network no container is on, as the engine.
func (s *Server) networkRemove(w http.ResponseWriter, r *http.Request) error {
	n, err := s.findNetwork(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	m, err := s.members(r, n)
	if err != nil {
		return err
	}
	if len(m) > 0 {
		return &httpError{http.StatusForbidden, fmt.Sprintf("error while removing network: network %s id %s has active endpoints (%s)", n.name, n.id, strings.Join(slices.Sorted(maps.Values(m)), ", "))}
	}
	s.nets.mu.Lock()
	delete(s.nets.byID, n.id)
	s.nets.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// networkPrune removes the networks the caller sees that no container is
// on.
func (s *Server) networkPrune(w http.ResponseWriter, r *http.Request) error {
	f, err := filters(r, "label")
	if err != nil {
		return err
	}
	rep := network.PruneReport{NetworksDeleted: []string{}}
	for _, n := range s.visibleNetworks(r) {
		if !labelsMatch(n.labels, f["label"]) {
			continue
		}
		m, err := s.members(r, n)
		if err != nil {
			return err
		}
		if len(m) > 0 {
			continue
		}
		s.nets.mu.Lock()
		delete(s.nets.byID, n.id)
		s.nets.mu.Unlock()
		rep.NetworksDeleted = append(rep.NetworksDeleted, n.name)
	}
	return writeJSON(w, http.StatusOK, rep)
}

// networkConnect puts a container created and not started on a network.
// A started container keeps the network it was created on: Berth fixes a
// container's network when it places it.
func (s *Server) networkConnect(w http.ResponseWriter, r *http.Request) error {
	var req network.ConnectRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return badRequest("decode the connection: %v", err)
	}
	return s.setNetwork(w, r, req.Container, true)
}

func (s *Server) networkDisconnect(w http.ResponseWriter, r *http.Request) error {
	var req network.DisconnectRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return badRequest("decode the disconnection: %v", err)
	}
	return s.setNetwork(w, r, req.Container, false)
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request, ref string, connect bool) error {
	if ref == "" {
		return badRequest("Container: name the container")
	}
	n, err := s.findNetwork(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	c, err := s.find(r, ref)
	if err != nil {
		return err
	}
	if c.created == nil {
		cur := networkOf(c.in)
		switch {
		case connect && cur == n.name && c.in.Owner == n.owner:
			return &httpError{http.StatusForbidden, fmt.Sprintf("endpoint with name %s already exists in network %s", c.in.Name, n.name)}
		case !connect && (cur != n.name || c.in.Owner != n.owner):
			return &httpError{http.StatusForbidden, fmt.Sprintf("container %s is not connected to network %s", c.in.Name, n.name)}
		}
		verb := map[bool]string{true: "network connect", false: "network disconnect"}[connect]
		return unsupported("%s of a started container: Berth fixes a container's network when it places it; connect it before docker start", verb)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cc, ok := s.created[c.id]
	if !ok {
		return noSuch(ref)
	}
	if cc.owner != n.owner {
		return badRequest("container %s is in namespace %s and network %s in %s: a container joins a network of its own namespace", ref, cc.owner, n.name, n.owner)
	}
	cur := cc.req.Spec.Labels[LabelNetwork]
	switch {
	case connect && cur == n.name:
		return &httpError{http.StatusForbidden, fmt.Sprintf("endpoint with name %s already exists in network %s", instanceOf(c.id, cc).Name, n.name)}
	case connect && cur != "":
		return unsupported("network connect %s: the container is on network %s already, and Berth puts a container on one network", n.name, cur)
	case !connect && cur != n.name:
		return &httpError{http.StatusForbidden, fmt.Sprintf("container %s is not connected to network %s", ref, n.name)}
	}
	labels := maps.Clone(cc.req.Spec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	if connect {
		labels[LabelNetwork] = n.name
	} else {
		delete(labels, LabelNetwork)
	}
	cc.req.Spec.Labels = labels
	w.WriteHeader(http.StatusOK)
	return nil
}

// joinNetwork moves the Berth network a create request names (--network
// NAME, or its one endpoint) from the engine's fields to the label
// LabelNetwork: the back-end runs the container on its default network.
// A name that is no Berth network of owner is left to the back-end.
func (s *Server) joinNetwork(owner string, cr *container.CreateRequest) {
	if cr.Config == nil {
		return
	}
	var name string
	if cr.HostConfig != nil {
		switch m := string(cr.HostConfig.NetworkMode); m {
		case "", "default", "bridge", "host", "none":
		default:
			if !strings.HasPrefix(m, "container:") {
				name = m
			}
		}
	}
	if name == "" && cr.NetworkingConfig != nil && len(cr.NetworkingConfig.EndpointsConfig) == 1 {
		for k := range cr.NetworkingConfig.EndpointsConfig {
			name = k
		}
	}
	if name == "" {
		return
	}
	n, err := s.nets.lookup(name, owner, func(ns string) bool { return ns == owner })
	if err != nil {
		return // not a Berth network: the back-end's to resolve
	}
	if cr.HostConfig != nil {
		cr.HostConfig.NetworkMode = ""
	}
	if cr.NetworkingConfig != nil {
		delete(cr.NetworkingConfig.EndpointsConfig, name)
		delete(cr.NetworkingConfig.EndpointsConfig, n.id)
		if len(cr.NetworkingConfig.EndpointsConfig) == 0 {
			cr.NetworkingConfig = nil
		}
	}
	labels := maps.Clone(cr.Config.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelNetwork] = n.name
	cr.Config.Labels = labels
}
