package dockerapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
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
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// LabelNetwork is the label that names the Berth networks a container is
// on (docker run --network NAME, a Compose service's networks, network
// connect), comma-separated, the one it was created on first. It is kept
// in the instance's spec, so the membership outlives the server.
const LabelNetwork = "io.berth.network"

// LabelAliases keeps the aliases a client gave the container on its
// networks (comma-separated): the names, besides its own, that the other
// members of each of its networks reach it by.
const LabelAliases = "io.berth.network.aliases"

// LabelBackendNetwork prefixes the label that marks a container as a
// member of a back-end network: LabelBackendNetwork + "." +
// "<namespace>.<network>" = "true", where "<namespace>.<network>" is the
// bridge the docker back-end makes on each engine where a member runs.
// Placement keeps the members of a network together by it (an affinity
// label.io.berth.backend-network.NS.NAME==true, which berth why shows).
// A container placed before a container could be on several networks
// carries LabelBackendNetwork = "<namespace>.<network>" instead.
const LabelBackendNetwork = "io.berth.backend-network"

// memberLabel is the label that marks a member of back-end network
// backend.
func memberLabel(backend string) string { return LabelBackendNetwork + "." + backend }

// isMember reports whether labels mark a member of back-end network
// backend, in either form LabelBackendNetwork describes.
func isMember(labels map[string]string, backend string) bool {
	return labels[memberLabel(backend)] == "true" || labels[LabelBackendNetwork] == backend
}

// maxContainerNetworks bounds the Berth networks a container is on.
const maxContainerNetworks = 16

// networksIn are the names of the Berth networks labels put a container on.
func networksIn(labels map[string]string) []string {
	v := labels[LabelNetwork]
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// setNetworks records nets as the Berth networks of labels (nil: none) and
// aliases as their aliases (nil: none).
func setNetworks(labels map[string]string, nets, aliases []string) {
	delete(labels, LabelNetwork)
	delete(labels, LabelAliases)
	if len(nets) > 0 {
		labels[LabelNetwork] = strings.Join(nets, ",")
	}
	if len(nets) > 0 && len(aliases) > 0 {
		labels[LabelAliases] = strings.Join(aliases, ",")
	}
}

// aliasesIn are the aliases labels give a container on its networks.
func aliasesIn(labels map[string]string) []string {
	if a := labels[LabelAliases]; a != "" {
		return strings.Split(a, ",")
	}
	return nil
}

// union is a with those of b it lacks, in order.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// OptSpread is the network option (docker network create -o
// io.berth.spread=true) that lets placement put the network's members on
// any node: each engine then has a bridge of its own, and members on two
// engines do not reach each other by name.
const OptSpread = "io.berth.spread"

// maxAliases bounds a container's aliases on its network.
const maxAliases = 32

// aliasesOf checks an endpoint's settings and returns its aliases. What
// the back-end would configure on the endpoint (addresses, links, driver
// options, a MAC address) is refused by name: it gives each endpoint the
// engine's defaults.
func aliasesOf(net string, es *network.EndpointSettings) ([]string, error) {
	if es == nil {
		return nil, nil
	}
	var refused []string
	if c := es.IPAMConfig; c != nil && (c.IPv4Address.IsValid() || c.IPv6Address.IsValid() || len(c.LinkLocalIPs) > 0) {
		refused = append(refused, "--ip/--ip6/--link-local-ip")
	}
	if len(es.Links) > 0 {
		refused = append(refused, "--link")
	}
	if len(es.DriverOpts) > 0 {
		refused = append(refused, "--driver-opt")
	}
	if len(es.MacAddress) > 0 {
		refused = append(refused, "--mac-address")
	}
	if len(refused) > 0 {
		return nil, unsupported("EndpointsConfig.%s: Berth cannot honour %s: the back-end gives each endpoint the engine's defaults", net, strings.Join(refused, ", "))
	}
	if len(es.Aliases) == 0 {
		return nil, nil
	}
	if len(es.Aliases) > maxAliases {
		return nil, badRequest("EndpointsConfig.%s.Aliases: %d aliases, at most %d", net, len(es.Aliases), maxAliases)
	}
	for i, a := range es.Aliases {
		if len(a) > maxNetworkName || !networkName.MatchString(a) {
			return nil, badRequest("EndpointsConfig.%s.Aliases[%d] %q: want at most %d of [a-zA-Z0-9_.-], starting with a letter or digit", net, i, a, maxNetworkName)
		}
	}
	return slices.Clone(es.Aliases), nil
}

// checkAliases bounds the aliases a container has on all its networks.
func checkAliases(aliases []string) error {
	if len(aliases) > maxAliases {
		return badRequest("Aliases: %d aliases over the container's networks, at most %d", len(aliases), maxAliases)
	}
	return nil
}

// Bounds of the networks the endpoint keeps.
const (
	MaxNetworks      = 1000
	maxNetworkLabels = 64
	maxNetworkName   = 128
)

// networkName is the engine's rule for a network's name.
var networkName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// PrefixNetworks is where the networks are kept in Options.Store, one key
// per network: PrefixNetworks + namespace + "/" + name.
const PrefixNetworks = "/dockerapi/networks/"

// bnetwork is a network of a namespace, kept by the endpoint. Its members
// run on the back-end network backend() names, which the back-end makes
// where a member runs (the docker driver: a bridge per engine); placement
// keeps them on one node unless Spread is set.
type bnetwork struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	Owner      string            `json:"owner"`
	Created    time.Time         `json:"created"`
	Labels     map[string]string `json:"labels,omitempty"`
	Attachable bool              `json:"attachable,omitempty"`
	Spread     bool              `json:"spread,omitempty"`
}

func (n *bnetwork) key() string { return PrefixNetworks + n.Owner + "/" + n.Name }

// backend is the name of n's back-end network: namespaces are DNS labels,
// without a dot, so no two networks share one.
func (n *bnetwork) backend() string { return n.Owner + "." + n.Name }

// netStore holds the networks, by id, and keeps them in st when it is set.
// Lock order: mu is held while calling st, never while calling the plane or
// taking Server.mu.
type netStore struct {
	st     store.Store
	mu     sync.Mutex
	loaded bool // byID holds what st keeps
	// reread is set on a follower's endpoint: the leader writes st, so
	// every call reads it again.
	reread bool
	byID   map[string]*bnetwork
}

func newNetStore(st store.Store, follower bool) *netStore {
	return &netStore{st: st, byID: map[string]*bnetwork{}, loaded: st == nil, reread: follower && st != nil}
}

// load reads the networks st keeps, once (at each call when ns.reread).
// ns.mu is held.
func (ns *netStore) load(ctx context.Context) error {
	if ns.loaded && !ns.reread {
		return nil
	}
	kvs, _, err := ns.st.List(ctx, PrefixNetworks)
	if err != nil {
		return fmt.Errorf("read the networks: %w", err)
	}
	byID := make(map[string]*bnetwork, len(kvs))
	for _, kv := range kvs {
		var n bnetwork
		if err := json.Unmarshal(kv.Value, &n); err != nil || n.ID == "" {
			return fmt.Errorf("the network kept at %s is unreadable: %v", kv.Key, err)
		}
		byID[n.ID] = &n
	}
	ns.byID, ns.loaded = byID, true
	return nil
}

// all returns every network, st read first.
func (ns *netStore) all(ctx context.Context) ([]*bnetwork, error) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if err := ns.load(ctx); err != nil {
		return nil, err
	}
	return slices.Collect(maps.Values(ns.byID)), nil
}

// add keeps n unless its namespace has a network of its name, or there are
// MaxNetworks.
func (ns *netStore) add(ctx context.Context, n *bnetwork) error {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if err := ns.load(ctx); err != nil {
		return err
	}
	if len(ns.byID) >= MaxNetworks {
		return &httpError{http.StatusTooManyRequests, fmt.Sprintf("Berth keeps at most %d networks: remove some first (docker network prune)", MaxNetworks)}
	}
	exists := &httpError{http.StatusConflict, fmt.Sprintf("network with name %s already exists", n.Name)}
	for _, o := range ns.byID {
		if o.Owner == n.Owner && o.Name == n.Name {
			return exists
		}
	}
	if ns.st != nil {
		v, err := json.Marshal(n)
		if err != nil {
			return err
		}
		res, err := ns.st.Txn(ctx, []store.Cmp{{Key: n.key(), ModRevision: 0}}, []store.Op{store.Put(n.key(), v)})
		if err != nil {
			return fmt.Errorf("keep the network: %w", err)
		}
		if !res.Succeeded {
			return exists
		}
	}
	ns.byID[n.ID] = n
	return nil
}

// remove forgets n.
func (ns *netStore) remove(ctx context.Context, n *bnetwork) error {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.st != nil {
		if _, err := ns.st.Txn(ctx, nil, []store.Op{store.Delete(n.key())}); err != nil {
			return fmt.Errorf("remove the network: %w", err)
		}
	}
	delete(ns.byID, n.ID)
	return nil
}

// newNetworkID returns 64 hex digits, the engine's network id form.
func newNetworkID() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// lookup returns the network ref names among those owned by a namespace
// see accepts: an id, a name, or a unique prefix of an id. A name held in
// several namespaces resolves to the one in prefer.
func (ns *netStore) lookup(ctx context.Context, ref, prefer string, see func(string) bool) (*bnetwork, error) {
	all, err := ns.all(ctx)
	if err != nil {
		return nil, err
	}
	var byName, byPrefix []*bnetwork
	for _, n := range all {
		if !see(n.Owner) {
			continue
		}
		switch {
		case n.ID == ref:
			return n, nil
		case n.Name == ref:
			byName = append(byName, n)
		case strings.HasPrefix(n.ID, ref):
			byPrefix = append(byPrefix, n)
		}
	}
	if len(byName) > 1 {
		if i := slices.IndexFunc(byName, func(n *bnetwork) bool { return n.Owner == prefer }); i >= 0 {
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
	return s.nets.lookup(r.Context(), ref, prefer, func(ns string) bool { return authorized(r, ns) })
}

// members lists the containers (instances not deleted, and containers
// created here) of network n, by id.
func (s *Server) members(r *http.Request, n *bnetwork) (map[string]string, error) {
	all, err := s.membership(r)
	if err != nil {
		return nil, err
	}
	return all[n.key()], nil
}

// membership lists the containers of every network, by the network's key
// and then the container's id: one listing of the plane for many networks.
func (s *Server) membership(r *http.Request) (map[string]map[string]string, error) {
	list, err := s.plane.Instances(r.Context(), control.Filter{})
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]string{}
	add := func(owner, net, id, name string) {
		if net == "" {
			return
		}
		k := (&bnetwork{Owner: owner, Name: net}).key()
		if out[k] == nil {
			out[k] = map[string]string{}
		}
		out[k][id] = name
	}
	for _, in := range list {
		if in.Phase != reconciler.Deleted && in.Phase != reconciler.Deleting {
			for _, net := range networksOf(in) {
				add(in.Owner, net, in.ID, in.Name)
			}
		}
	}
	created, err := s.createdNow(r.Context())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	for id, c := range created {
		for _, net := range networksIn(c.req.Spec.Labels) {
			add(c.owner, net, id, instanceOf(id, c).Name)
		}
	}
	s.mu.Unlock()
	return out, nil
}

// networksOf names the Berth networks in is on.
func networksOf(in control.Instance) []string {
	if in.Spec == nil {
		return nil
	}
	return networksIn(in.Spec.Labels)
}

// endpointsOf is a container's NetworkSettings.Networks: its Berth
// networks and its aliases on each (the address is the back-end's, not
// shown).
func endpointsOf(in control.Instance) map[string]*network.EndpointSettings {
	nets := networksOf(in)
	if len(nets) == 0 {
		return nil
	}
	out := map[string]*network.EndpointSettings{}
	for _, name := range nets {
		out[name] = &network.EndpointSettings{Aliases: aliasesIn(in.Spec.Labels)}
	}
	return out
}

// options are n's driver options as the engine shows them.
func (n *bnetwork) options() map[string]string {
	if n.Spread {
		return map[string]string{OptSpread: "true"}
	}
	return map[string]string{}
}

func (n *bnetwork) summary(members map[string]string) network.Inspect {
	out := network.Inspect{
		Network: network.Network{
			Name: n.Name, ID: n.ID, Created: n.Created, Scope: "local", Driver: "bridge",
			EnableIPv4: true, IPAM: network.IPAM{Driver: "default", Options: map[string]string{}, Config: []network.IPAMConfig{}},
			Attachable: n.Attachable, Options: n.options(), Labels: maps.Clone(n.Labels),
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

// networkCreate keeps a network in the caller's namespace; the back-end
// makes its bridges when members run. What the engine would configure on a
// bridge (subnets, options but OptSpread, internal, IPv6) is refused by
// name: the back-end makes each bridge with its defaults.
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
	opts := maps.Clone(req.Options)
	spread := opts[OptSpread]
	delete(opts, OptSpread)
	refuse(len(opts) > 0, "--opt "+strings.Join(slices.Sorted(maps.Keys(opts)), ", "))
	refuse(spread != "" && spread != "true" && spread != "false", fmt.Sprintf("--opt %s=%s (want true or false)", OptSpread, spread))
	if len(refused) > 0 {
		return unsupported("Berth cannot honour %s: the back-end makes each of its networks' bridges with the engine's defaults", strings.Join(refused, ", "))
	}
	owner, err := identityOf(r).Namespace("")
	if err != nil {
		return err
	}
	n := &bnetwork{ID: newNetworkID(), Name: req.Name, Owner: owner, Created: time.Now().UTC(), Labels: maps.Clone(req.Labels), Attachable: req.Attachable, Spread: spread == "true"}
	if err := s.nets.add(r.Context(), n); err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, network.CreateResponse{ID: n.ID, Warning: ""})
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
func (s *Server) visibleNetworks(r *http.Request) ([]*bnetwork, error) {
	all, err := s.nets.all(r.Context())
	if err != nil {
		return nil, err
	}
	var out []*bnetwork
	for _, n := range all {
		if authorized(r, n.Owner) {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
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
	nets, err := s.visibleNetworks(r)
	if err != nil {
		return err
	}
	all, err := s.membership(r)
	if err != nil {
		return err
	}
	out := []network.Inspect{}
	for _, n := range nets {
		ok := matchAny(f["id"], func(v string) bool { return strings.HasPrefix(n.ID, v) }) &&
			matchAny(f["name"], func(v string) bool { return strings.Contains(n.Name, v) }) &&
			matchAny(f["driver"], func(v string) bool { return v == "bridge" }) &&
			matchAny(f["scope"], func(v string) bool { return v == "local" }) &&
			matchAny(f["type"], func(v string) bool { return v == "custom" }) &&
			labelsMatch(n.Labels, f["label"])
		if !ok {
			continue
		}
		m := all[n.key()]
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
		return &httpError{http.StatusForbidden, fmt.Sprintf("error while removing network: network %s id %s has active endpoints (%s)", n.Name, n.ID, strings.Join(slices.Sorted(maps.Values(m)), ", "))}
	}
	if err := s.nets.remove(r.Context(), n); err != nil {
		return err
	}
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
	nets, err := s.visibleNetworks(r)
	if err != nil {
		return err
	}
	all, err := s.membership(r)
	if err != nil {
		return err
	}
	rep := network.PruneReport{NetworksDeleted: []string{}}
	for _, n := range nets {
		if !labelsMatch(n.Labels, f["label"]) {
			continue
		}
		m := all[n.key()]
		if len(m) > 0 {
			continue
		}
		if err := s.nets.remove(r.Context(), n); err != nil {
			return err
		}
		rep.NetworksDeleted = append(rep.NetworksDeleted, n.Name)
	}
	return writeJSON(w, http.StatusOK, rep)
}

// networkConnect puts a container on a network of its namespace: a
// container created and not started in the spec its start submits, a
// started one through the plane (the back-end connects it where it runs).
func (s *Server) networkConnect(w http.ResponseWriter, r *http.Request) error {
	var req network.ConnectRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return badRequest("decode the connection: %v", err)
	}
	return s.setNetwork(w, r, req.Container, true, req.EndpointConfig)
}

func (s *Server) networkDisconnect(w http.ResponseWriter, r *http.Request) error {
	var req network.DisconnectRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return badRequest("decode the disconnection: %v", err)
	}
	return s.setNetwork(w, r, req.Container, false, nil)
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request, ref string, connect bool, es *network.EndpointSettings) error {
	if ref == "" {
		return badRequest("Container: name the container")
	}
	aliases, err := aliasesOf(r.PathValue("id"), es)
	if err != nil {
		return err
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
		err = s.setStartedNetwork(r.Context(), c.in, n, connect, aliases)
	} else {
		err = s.setCreatedNetwork(r.Context(), c.id, ref, n, connect, aliases)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// checkMembership is the engine's answer to a connect of a container on
// network n already, or a disconnect of one not on it; nil otherwise.
func checkMembership(name, owner string, labels map[string]string, n *bnetwork, connect bool) error {
	on := owner == n.Owner && slices.Contains(networksIn(labels), n.Name)
	switch {
	case owner != n.Owner:
		return badRequest("container %s is in namespace %s and network %s in %s: a container joins a network of its own namespace", name, owner, n.Name, n.Owner)
	case connect && on:
		return &httpError{http.StatusForbidden, fmt.Sprintf("endpoint with name %s already exists in network %s", name, n.Name)}
	case !connect && !on:
		return &httpError{http.StatusForbidden, fmt.Sprintf("container %s is not connected to network %s", name, n.Name)}
	case connect && len(networksIn(labels)) >= maxContainerNetworks:
		return badRequest("network connect %s: container %s is on %d networks, at most %d", n.Name, name, maxContainerNetworks, maxContainerNetworks)
	}
	return nil
}

// setCreatedNetwork connects or disconnects the created container id in
// the spec its start submits.
func (s *Server) setCreatedNetwork(ctx context.Context, id, ref string, n *bnetwork, connect bool, aliases []string) error {
	return s.changeCreated(ctx, id, ref, func(cc *created) error {
		return setCreatedNetworkLocked(id, cc, n, connect, aliases)
	})
}

// setCreatedNetworkLocked is setCreatedNetwork's change, made with s.mu
// held.
func setCreatedNetworkLocked(id string, cc *created, n *bnetwork, connect bool, aliases []string) error {
	labels := maps.Clone(cc.req.Spec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	if err := checkMembership(instanceOf(id, cc).Name, cc.owner, labels, n, connect); err != nil {
		return err
	}
	nets := slices.DeleteFunc(networksIn(labels), func(x string) bool { return x == n.Name })
	all := aliasesIn(labels)
	if connect {
		nets = append(nets, n.Name)
		all = union(all, aliases)
	}
	if err := checkAliases(all); err != nil {
		return err
	}
	setNetworks(labels, nets, all)
	cc.req.Spec.Labels = labels
	return nil
}

// setStartedNetwork connects or disconnects the started container in
// through the plane, which records it in the instance's spec. A connect
// to a network whose members are kept on one node is refused for a
// container on another node.
func (s *Server) setStartedNetwork(ctx context.Context, in control.Instance, n *bnetwork, connect bool, aliases []string) error {
	var labels map[string]string
	if in.Spec != nil {
		labels = in.Spec.Labels
	}
	if err := checkMembership(in.Name, in.Owner, labels, n, connect); err != nil {
		return err
	}
	if err := checkAliases(union(aliasesIn(labels), aliases)); err != nil {
		return err
	}
	backend := n.backend()
	if !connect {
		return s.plane.DisconnectNetwork(ctx, in.ID, backend, func(spec *driver.Spec) {
			spec.Labels = maps.Clone(spec.Labels)
			delete(spec.Labels, memberLabel(backend))
			if spec.Labels[LabelBackendNetwork] == backend {
				delete(spec.Labels, LabelBackendNetwork)
			}
			nets := slices.DeleteFunc(networksIn(spec.Labels), func(x string) bool { return x == n.Name })
			setNetworks(spec.Labels, nets, aliasesIn(spec.Labels))
			if len(spec.Networks) == 0 {
				spec.NetworkAliases = nil
			}
		})
	}
	if !n.Spread {
		home, ok, err := s.homeOf(ctx, n, in.ID)
		if err != nil {
			return err
		}
		if ok && (home.Provider != in.Provider || home.Node != in.Node) {
			return &httpError{http.StatusConflict, fmt.Sprintf("network connect %s: the network's members run on node %s/%s and container %s on node %s/%s; Berth keeps a network's members on one node (a network made with -o %s=true has no such rule)",
				n.Name, home.Provider, home.Node, in.Name, in.Provider, in.Node, OptSpread)}
		}
	}
	// Its own name is an alias too: the back-end's name for it may differ.
	want := union(aliases, []string{in.Name})
	return s.plane.ConnectNetwork(ctx, in.ID, backend, want, func(spec *driver.Spec) {
		spec.Labels = maps.Clone(spec.Labels)
		if spec.Labels == nil {
			spec.Labels = map[string]string{}
		}
		spec.Labels[memberLabel(backend)] = "true"
		nets := union(networksIn(spec.Labels), []string{n.Name})
		setNetworks(spec.Labels, nets, union(aliasesIn(spec.Labels), aliases))
	})
}

// joinNetwork moves the Berth networks a create request names (--network
// NAME, and the endpoints of its networking config) from the engine's
// fields to the label LabelNetwork (and their aliases to LabelAliases),
// where connect and disconnect change them until the start; onNetwork
// turns them into the spec's back-end networks then. A name that is no
// Berth network of owner is left to the back-end.
func (s *Server) joinNetwork(ctx context.Context, owner string, cr *container.CreateRequest) error {
	if cr.Config == nil {
		return nil
	}
	var names []string
	if cr.HostConfig != nil {
		switch m := string(cr.HostConfig.NetworkMode); m {
		case "", "default", "bridge", "host", "none":
		default:
			if !strings.HasPrefix(m, "container:") {
				names = append(names, m)
			}
		}
	}
	if cr.NetworkingConfig != nil {
		if len(cr.NetworkingConfig.EndpointsConfig) > maxContainerNetworks {
			return badRequest("NetworkingConfig.EndpointsConfig: %d networks, at most %d", len(cr.NetworkingConfig.EndpointsConfig), maxContainerNetworks)
		}
		names = union(names, slices.Sorted(maps.Keys(cr.NetworkingConfig.EndpointsConfig)))
	}
	var nets, aliases []string
	for _, name := range names {
		n, err := s.nets.lookup(ctx, name, owner, func(ns string) bool { return ns == owner })
		if err != nil {
			if statusOf(err) == http.StatusNotFound {
				continue // not a Berth network: the back-end's to resolve
			}
			return err
		}
		if cr.HostConfig != nil && string(cr.HostConfig.NetworkMode) == name {
			cr.HostConfig.NetworkMode = ""
		}
		if cr.NetworkingConfig != nil {
			for _, k := range []string{name, n.ID} {
				a, err := aliasesOf(k, cr.NetworkingConfig.EndpointsConfig[k])
				if err != nil {
					return err
				}
				aliases = union(aliases, a)
				delete(cr.NetworkingConfig.EndpointsConfig, k)
			}
		}
		nets = union(nets, []string{n.Name})
	}
	if len(nets) == 0 {
		return nil
	}
	if err := checkAliases(aliases); err != nil {
		return err
	}
	if cr.NetworkingConfig != nil && len(cr.NetworkingConfig.EndpointsConfig) == 0 {
		cr.NetworkingConfig = nil
	}
	labels := maps.Clone(cr.Config.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	setNetworks(labels, nets, aliases)
	cr.Config.Labels = labels
	return nil
}

// placeWait bounds how long the first member of a network to be placed
// holds the next ones back: past it they are placed as if it were not.
const placeWait = 30 * time.Second

// onNetwork returns c's request as the plane is to place it. On Berth
// networks it runs on their back-end networks (the spec's Networks), where
// the other members reach it by its name and its aliases (the spec's
// NetworkAliases), labelled a member of each (memberLabel). Unless a
// network spreads, a hard affinity keeps it on the node that network's
// placed members are on; networks whose members are on two nodes cannot
// be joined together, and the start is refused. When no network of c's
// has a placed member, c is submitted under its networks' locks of
// s.placing: placed, called with the submit's outcome, waits until it has
// a node (or cannot have one now) and lets the next members go, which
// then have a member to follow. placed is never nil.
func (s *Server) onNetwork(ctx context.Context, c *created) (scheduler.Request, func(context.Context, error), error) {
	req := c.req
	done := func(context.Context, error) {}
	names := networksIn(req.Spec.Labels)
	if len(names) == 0 {
		return req, done, nil
	}
	var kept []*bnetwork // the networks whose members share a node
	spec := req.Spec
	spec.Labels = maps.Clone(spec.Labels)
	spec.Networks = nil
	for _, name := range names {
		n, err := s.nets.lookup(ctx, name, c.owner, func(ns string) bool { return ns == c.owner })
		if err != nil {
			return req, done, err
		}
		spec.Labels[memberLabel(n.backend())] = "true"
		spec.Networks = append(spec.Networks, n.backend())
		if !n.Spread {
			kept = append(kept, n)
		}
	}
	spec.NetworkAliases = aliasesIn(spec.Labels)
	if req.Name != "" && !slices.Contains(spec.NetworkAliases, req.Name) {
		// The back-end's name for it may differ (name.1 once placed
		// again): its own name is an alias too.
		spec.NetworkAliases = append(spec.NetworkAliases, req.Name)
	}
	req.Spec = spec
	if len(kept) == 0 {
		return req, done, nil
	}
	follow := func() (bool, error) {
		affs, err := s.networkAffinities(ctx, req.Name, kept)
		if err != nil || len(affs) == 0 {
			return false, err
		}
		req.Affinities = append(slices.Clone(req.Affinities), affs...)
		return true, nil
	}
	if ok, err := follow(); err != nil || ok {
		return req, done, err
	}
	unlock := s.placingLocks(kept)
	if ok, err := follow(); err != nil || ok {
		unlock()
		return req, done, err
	}
	return req, func(ctx context.Context, err error) {
		defer unlock()
		if err == nil {
			s.awaitNode(ctx, req.ID)
		}
	}, nil
}

// networkAffinities are the affinities that keep a container of the
// networks nets with their placed members: one per network that has one.
// Networks whose members are on different nodes are a conflict naming
// them and the nodes.
func (s *Server) networkAffinities(ctx context.Context, name string, nets []*bnetwork) ([]string, error) {
	var affs []string
	var first *bnetwork
	var at control.Instance
	for _, n := range nets {
		home, ok, err := s.homeOf(ctx, n, "")
		if err != nil || !ok {
			if err != nil {
				return nil, err
			}
			continue
		}
		if first != nil && (home.Provider != at.Provider || home.Node != at.Node) {
			return nil, &httpError{http.StatusConflict, fmt.Sprintf("container %s: the members of network %s run on node %s/%s and those of network %s on node %s/%s; Berth keeps a network's members on one node (a network made with -o %s=true has no such rule)",
				name, first.Name, at.Provider, at.Node, n.Name, home.Provider, home.Node, OptSpread)}
		}
		if first == nil {
			first, at = n, home
		}
		if home.Spec.Labels[memberLabel(n.backend())] == "true" {
			affs = append(affs, "label."+memberLabel(n.backend())+"==true")
		} else {
			affs = append(affs, "label."+LabelBackendNetwork+"=="+n.backend())
		}
	}
	return affs, nil
}

// placingLocks takes the locks of s.placing that the first members of nets
// take, in one order, and returns what releases them.
func (s *Server) placingLocks(nets []*bnetwork) func() {
	var idx []int
	for _, n := range nets {
		h := fnv.New32a()
		_, _ = h.Write([]byte(n.backend()))
		idx = append(idx, int(h.Sum32()%uint32(len(s.placing))))
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	for _, i := range idx {
		s.placing[i].Lock()
	}
	return func() {
		for _, i := range slices.Backward(idx) {
			s.placing[i].Unlock()
		}
	}
}

// homeOf returns an instance of network n, but except, that has a node.
func (s *Server) homeOf(ctx context.Context, n *bnetwork, except string) (control.Instance, bool, error) {
	list, err := s.plane.Instances(ctx, control.Filter{Owner: n.Owner})
	if err != nil {
		return control.Instance{}, false, err
	}
	for _, in := range list {
		if in.ID != except && in.Node != "" && in.Phase != reconciler.Deleting && in.Phase != reconciler.Deleted && in.Spec != nil && isMember(in.Spec.Labels, n.backend()) {
			return in, true, nil
		}
	}
	return control.Instance{}, false, nil
}

// awaitNode waits, at most placeWait, until the instance id has a node,
// or is pending with a reason (no node takes it now), or is over.
func (s *Server) awaitNode(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, placeWait)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		in, err := s.plane.Instance(ctx, id)
		if err != nil || in.Node != "" || (in.Phase == reconciler.Pending && in.Message != "") ||
			in.Phase == reconciler.Failed || in.Phase == reconciler.Deleted {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
