package dockerapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/volume"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// Bounds of the volumes the endpoint keeps. A volume's name follows the
// engine's rule for it, as a network's does (networkName).
const (
	MaxVolumes      = 1000
	maxVolumeLabels = 64
	maxVolumeName   = 128
)

// PrefixVolumes is where the volumes are kept in Options.Store, one key
// per volume: PrefixVolumes + namespace + "/" + name.
const PrefixVolumes = "/dockerapi/volumes/"

// bvolume is a named volume of a namespace, kept by the endpoint. The
// back-end makes it, named backend(), where its first user runs; Provider
// and Node record that node once the first user is placed, and every
// later user is constrained to it.
type bvolume struct {
	Name     string            `json:"name"`
	Owner    string            `json:"owner"`
	Created  time.Time         `json:"created"`
	Labels   map[string]string `json:"labels,omitempty"`
	Provider string            `json:"provider,omitempty"`
	Node     string            `json:"node,omitempty"`
}

func (v *bvolume) key() string { return PrefixVolumes + v.Owner + "/" + v.Name }

// backend is the volume's name on the back-end: namespaces are DNS
// labels, without a dot, so no two namespaces share one.
func (v *bvolume) backend() string { return v.Owner + "." + v.Name }

// constraints keep a user of v on v's node; none before it has one.
func (v *bvolume) constraints() []string {
	if v.Node == "" {
		return nil
	}
	return []string{"provider==" + v.Provider, scheduler.NodeIs(v.Node)}
}

// volStore holds the volumes, by key, and keeps them in st when it is set.
// Lock order: mu is held while calling st, never while calling the plane
// or taking Server.mu.
type volStore struct {
	st     store.Store
	mu     sync.Mutex
	loaded bool
	// reread is set on a follower's endpoint: the leader writes st, so
	// every call reads it again.
	reread bool
	byKey  map[string]*bvolume
}

func newVolStore(st store.Store, follower bool) *volStore {
	return &volStore{st: st, byKey: map[string]*bvolume{}, loaded: st == nil, reread: follower && st != nil}
}

// load reads the volumes st keeps, once (at each call when vs.reread).
// vs.mu is held.
func (vs *volStore) load(ctx context.Context) error {
	if vs.loaded && !vs.reread {
		return nil
	}
	kvs, _, err := vs.st.List(ctx, PrefixVolumes)
	if err != nil {
		return fmt.Errorf("read the volumes: %w", err)
	}
	byKey := make(map[string]*bvolume, len(kvs))
	for _, kv := range kvs {
		var v bvolume
		if err := json.Unmarshal(kv.Value, &v); err != nil || v.Name == "" {
			return fmt.Errorf("the volume kept at %s is unreadable: %v", kv.Key, err)
		}
		byKey[v.key()] = &v
	}
	vs.byKey, vs.loaded = byKey, true
	return nil
}

// all returns copies of every volume, st read first.
func (vs *volStore) all(ctx context.Context) ([]bvolume, error) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if err := vs.load(ctx); err != nil {
		return nil, err
	}
	out := make([]bvolume, 0, len(vs.byKey))
	for _, v := range vs.byKey {
		out = append(out, *v)
	}
	return out, nil
}

// ensure returns the volume of v's namespace and name, keeping v first
// when there is none (the engine's create of an existing volume returns
// it), unless there are MaxVolumes.
func (vs *volStore) ensure(ctx context.Context, v bvolume) (bvolume, error) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if err := vs.load(ctx); err != nil {
		return bvolume{}, err
	}
	if o, ok := vs.byKey[v.key()]; ok {
		return *o, nil
	}
	if len(vs.byKey) >= MaxVolumes {
		return bvolume{}, &httpError{http.StatusTooManyRequests, fmt.Sprintf("Berth keeps at most %d volumes: remove some first (docker volume prune)", MaxVolumes)}
	}
	if err := vs.put(ctx, &v, true); err != nil {
		return bvolume{}, err
	}
	return v, nil
}

// put keeps v (only when absent if create) in st and in byKey. vs.mu is
// held.
func (vs *volStore) put(ctx context.Context, v *bvolume, create bool) error {
	if vs.st != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		var cmp []store.Cmp
		if create {
			cmp = []store.Cmp{{Key: v.key(), ModRevision: 0}}
		}
		res, err := vs.st.Txn(ctx, cmp, []store.Op{store.Put(v.key(), b)})
		if err != nil {
			return fmt.Errorf("keep the volume: %w", err)
		}
		if !res.Succeeded {
			return &httpError{http.StatusConflict, fmt.Sprintf("volume %s was created meanwhile: try again", v.Name)}
		}
	}
	vs.byKey[v.key()] = v
	return nil
}

// pin records the node of v's first user, unless v has one already, and
// returns v as kept.
func (vs *volStore) pin(ctx context.Context, v bvolume, provider, node string) (bvolume, error) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	cur, ok := vs.byKey[v.key()]
	if !ok {
		return v, nil // removed meanwhile: its next user makes it again
	}
	if cur.Node != "" {
		return *cur, nil
	}
	nv := *cur
	nv.Provider, nv.Node = provider, node
	if err := vs.put(ctx, &nv, false); err != nil {
		return *cur, err
	}
	return nv, nil
}

// remove forgets v.
func (vs *volStore) remove(ctx context.Context, v bvolume) error {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if vs.st != nil {
		if _, err := vs.st.Txn(ctx, nil, []store.Op{store.Delete(v.key())}); err != nil {
			return fmt.Errorf("remove the volume: %w", err)
		}
	}
	delete(vs.byKey, v.key())
	return nil
}

// checkVolumeName reports a name that is not the engine's form.
func checkVolumeName(field, name string) error {
	if len(name) > maxVolumeName || !networkName.MatchString(name) {
		return badRequest("%s %q: want at most %d of [a-zA-Z0-9_.-], starting with a letter or digit", field, name, maxVolumeName)
	}
	return nil
}

// visibleVolumes lists the volumes r's caller sees, by name then
// namespace.
func (s *Server) visibleVolumes(r *http.Request) ([]bvolume, error) {
	all, err := s.vols.all(r.Context())
	if err != nil {
		return nil, err
	}
	out := slices.DeleteFunc(all, func(v bvolume) bool { return !authorized(r, v.Owner) })
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Owner < out[j].Owner
	})
	return out, nil
}

// findVolume returns the volume name among those r's caller sees, the
// caller's own namespace's first.
func (s *Server) findVolume(r *http.Request, name string) (bvolume, error) {
	vols, err := s.visibleVolumes(r)
	if err != nil {
		return bvolume{}, err
	}
	prefer, _ := identityOf(r).Namespace("")
	var found []bvolume
	for _, v := range vols {
		if v.Name == name {
			if v.Owner == prefer {
				return v, nil
			}
			found = append(found, v)
		}
	}
	switch len(found) {
	case 0:
		return bvolume{}, &httpError{http.StatusNotFound, fmt.Sprintf("get %s: no such volume", name)}
	case 1:
		return found[0], nil
	}
	return bvolume{}, badRequest("volume %s is in several namespaces: use a token of one of them", name)
}

// volumeUsers lists the containers (instances not deleted, and containers
// created here) that mount each volume, by the volume's key and then the
// container's id.
func (s *Server) volumeUsers(ctx context.Context) (map[string][]string, error) {
	list, err := s.plane.Instances(ctx, control.Filter{})
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, in := range list {
		if in.Spec == nil || in.Phase == reconciler.Deleted || in.Phase == reconciler.Deleting {
			continue
		}
		for _, m := range in.Spec.Volumes {
			if name, ok := strings.CutPrefix(m.Source, in.Owner+"."); ok && !m.IsBind() {
				k := (&bvolume{Owner: in.Owner, Name: name}).key()
				out[k] = append(out[k], in.ID)
			}
		}
	}
	created, err := s.createdNow(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	for id, c := range created {
		for _, m := range c.req.Spec.Volumes {
			if !m.IsBind() {
				k := (&bvolume{Owner: c.owner, Name: m.Source}).key()
				out[k] = append(out[k], id)
			}
		}
	}
	s.mu.Unlock()
	return out, nil
}

// view is v as the engine shows a volume.
func (v bvolume) view(users int) volume.Volume {
	out := volume.Volume{
		Name: v.Name, Driver: "local", Scope: "local", Labels: maps.Clone(v.Labels), Options: map[string]string{},
		CreatedAt: v.Created.Format(time.RFC3339), Mountpoint: "",
		UsageData: &volume.UsageData{RefCount: int64(users), Size: -1},
	}
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	if v.Node != "" {
		out.Status = map[string]any{"Node": v.Provider + "/" + v.Node, "Name": v.backend()}
	}
	return out
}

// volumeCreate keeps a volume in the caller's namespace; the back-end
// makes it where its first user runs. A driver but local, driver options
// and cluster volumes are refused by name.
func (s *Server) volumeCreate(w http.ResponseWriter, r *http.Request) error {
	var req volume.CreateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return badRequest("decode the volume: %v", err)
	}
	if req.Name == "" {
		req.Name = newNetworkID() // the engine's anonymous volume name form
	}
	if err := checkVolumeName("Name", req.Name); err != nil {
		return err
	}
	if len(req.Labels) > maxVolumeLabels {
		return badRequest("Labels: %d labels, at most %d", len(req.Labels), maxVolumeLabels)
	}
	var refused []string
	if req.Driver != "" && req.Driver != "local" {
		refused = append(refused, "--driver "+req.Driver)
	}
	if len(req.DriverOpts) > 0 {
		refused = append(refused, "--opt "+strings.Join(slices.Sorted(maps.Keys(req.DriverOpts)), ", "))
	}
	if req.ClusterVolumeSpec != nil {
		refused = append(refused, "cluster volumes")
	}
	if len(refused) > 0 {
		return unsupported("Berth cannot honour %s: the back-end makes each volume with the engine's local driver and its defaults", strings.Join(refused, ", "))
	}
	owner, err := identityOf(r).Namespace("")
	if err != nil {
		return err
	}
	v, err := s.vols.ensure(r.Context(), bvolume{Name: req.Name, Owner: owner, Created: time.Now().UTC(), Labels: maps.Clone(req.Labels)})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, v.view(0))
}

func (s *Server) volumeInspect(w http.ResponseWriter, r *http.Request) error {
	v, err := s.findVolume(r, r.PathValue("name"))
	if err != nil {
		return err
	}
	users, err := s.volumeUsers(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, v.view(len(users[v.key()])))
}

func (s *Server) volumeList(w http.ResponseWriter, r *http.Request) error {
	f, err := filters(r, "name", "label", "driver", "dangling")
	if err != nil {
		return err
	}
	vols, err := s.visibleVolumes(r)
	if err != nil {
		return err
	}
	users, err := s.volumeUsers(r.Context())
	if err != nil {
		return err
	}
	out := volume.ListResponse{Volumes: []volume.Volume{}, Warnings: []string{}}
	for _, v := range vols {
		n := len(users[v.key()])
		ok := matchAny(f["name"], func(x string) bool { return strings.Contains(v.Name, x) }) &&
			matchAny(f["driver"], func(x string) bool { return x == "local" }) &&
			matchAny(f["dangling"], func(x string) bool { return (x == "true" || x == "1") == (n == 0) }) &&
			labelsMatch(v.Labels, f["label"])
		if ok {
			out.Volumes = append(out.Volumes, v.view(n))
		}
	}
	return writeJSON(w, http.StatusOK, out)
}

// volumeRemove removes a volume no container uses, from its node first.
func (s *Server) volumeRemove(w http.ResponseWriter, r *http.Request) error {
	v, err := s.findVolume(r, r.PathValue("name"))
	if err != nil {
		if f := r.URL.Query().Get("force"); statusOf(err) == http.StatusNotFound && (f == "1" || f == "true") {
			w.WriteHeader(http.StatusNoContent)
			return nil
		}
		return err
	}
	users, err := s.volumeUsers(r.Context())
	if err != nil {
		return err
	}
	if err := s.dropVolume(r.Context(), v, users[v.key()]); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// dropVolume removes v, which the containers users mount, from its node
// and then from the store: 409 while a container uses it, as the engine.
func (s *Server) dropVolume(ctx context.Context, v bvolume, users []string) error {
	if len(users) > 0 {
		slices.Sort(users)
		return &httpError{http.StatusConflict, fmt.Sprintf("remove %s: volume is in use - [%s]", v.Name, strings.Join(users, ", "))}
	}
	gone := false
	if v.Node != "" {
		var err error
		if gone, err = s.nodeGone(ctx, v.Provider, v.Node); err != nil {
			return err
		}
	}
	if gone {
		s.log.Warn("docker api: a volume forgotten whose node is gone", "volume", v.key(), "node", v.Provider+"/"+v.Node)
	} else if v.Node != "" {
		err := s.plane.RemoveVolume(ctx, v.Provider, v.Node, v.backend())
		if errors.Is(err, driver.ErrPermanent) {
			return &httpError{http.StatusConflict, fmt.Sprintf("remove %s: volume is in use on %s/%s: %v", v.Name, v.Provider, v.Node, err)}
		}
		if err != nil {
			return err
		}
	}
	return s.vols.remove(ctx, v)
}

// volumePrune removes the volumes the caller sees that no container uses
// (filter label; all, as the engine's of API 1.42, is accepted).
func (s *Server) volumePrune(w http.ResponseWriter, r *http.Request) error {
	f, err := filters(r, "label", "all")
	if err != nil {
		return err
	}
	vols, err := s.visibleVolumes(r)
	if err != nil {
		return err
	}
	users, err := s.volumeUsers(r.Context())
	if err != nil {
		return err
	}
	rep := volume.PruneReport{VolumesDeleted: []string{}}
	for _, v := range vols {
		if !labelsMatch(v.Labels, f["label"]) || len(users[v.key()]) > 0 {
			continue
		}
		if err := s.dropVolume(r.Context(), v, nil); err != nil {
			return err
		}
		rep.VolumesDeleted = append(rep.VolumesDeleted, v.Name)
	}
	return writeJSON(w, http.StatusOK, rep)
}

// onVolumes returns req, c's request as the plane is to place it, with
// each named volume of c's namespace (made here when it is new, as the
// engine makes it on first use) renamed to its back-end name and, once the
// volume has a node, a hard constraint to that node: the user waits for
// room there rather than land elsewhere. When a volume has no node yet,
// the request is submitted under the volume's lock of s.volPlacing:
// placed, called with the submit's outcome, waits until it has a node and
// records it as the volumes' node. placed is never nil.
func (s *Server) onVolumes(ctx context.Context, c *created, req scheduler.Request) (scheduler.Request, func(context.Context, error), error) {
	done := func(context.Context, error) {}
	if !slices.ContainsFunc(req.Spec.Volumes, func(m driver.Volume) bool { return !m.IsBind() }) {
		return req, done, nil
	}
	var vols []bvolume
	for i, m := range req.Spec.Volumes {
		if m.IsBind() {
			continue
		}
		if err := checkVolumeName(fmt.Sprintf("Volumes[%d].Source", i), m.Source); err != nil {
			return req, done, err
		}
		v, err := s.vols.ensure(ctx, bvolume{Name: m.Source, Owner: c.owner, Created: time.Now().UTC()})
		if err != nil {
			return req, done, err
		}
		vols = append(vols, v)
	}
	spec := req.Spec
	spec.Volumes = slices.Clone(spec.Volumes)
	j := 0
	for i, m := range spec.Volumes {
		if !m.IsBind() {
			spec.Volumes[i].Source = vols[j].backend()
			j++
		}
	}
	req.Spec = spec
	var unplaced []bvolume
	for _, v := range vols {
		if v.Node == "" {
			unplaced = append(unplaced, v)
		}
	}
	if len(unplaced) < len(vols) {
		// A volume with a node decides; the others go there too.
		for _, v := range vols {
			if v.Node != "" {
				if err := s.checkVolumeNode(ctx, v); err != nil {
					return req, done, err
				}
				req.Constraints = append(slices.Clone(req.Constraints), v.constraints()...)
				return req, func(ctx context.Context, err error) { s.pinVolumes(ctx, unplaced, v.Provider, v.Node) }, nil
			}
		}
	}
	mu := s.volumeLock(unplaced[0])
	mu.Lock()
	if cur, err := s.vols.all(ctx); err == nil {
		for _, o := range cur {
			if o.key() == unplaced[0].key() && o.Node != "" {
				mu.Unlock()
				if err := s.checkVolumeNode(ctx, o); err != nil {
					return req, done, err
				}
				req.Constraints = append(slices.Clone(req.Constraints), o.constraints()...)
				return req, func(ctx context.Context, err error) { s.pinVolumes(ctx, unplaced, o.Provider, o.Node) }, nil
			}
		}
	}
	return req, func(ctx context.Context, err error) {
		defer mu.Unlock()
		if err != nil {
			return
		}
		s.awaitNode(ctx, req.ID)
		if in, err := s.plane.Instance(ctx, req.ID); err == nil && in.Node != "" {
			s.pinVolumes(ctx, unplaced, in.Provider, in.Node)
		}
	}, nil
}

// checkVolumeNode refuses a user of v when v's node is gone: its content
// is out of reach, and no node could ever take the user (409, naming the
// volume and the node).
func (s *Server) checkVolumeNode(ctx context.Context, v bvolume) error {
	gone, err := s.nodeGone(ctx, v.Provider, v.Node)
	if err != nil || !gone {
		return err
	}
	return &httpError{http.StatusConflict, fmt.Sprintf("volume %s lives on node %s/%s, which provider %s no longer reports: its content is out of reach and no container can mount it; bring the node back, or remove the volume (docker volume rm %s) so that its next user makes it anew",
		v.Name, v.Provider, v.Node, v.Provider, v.Name)}
}

// nodeGone reports whether provider prov no longer reports node: prov is
// not configured, or it reports nodes and node is none of them. A node
// that is offline is still reported. A provider reporting no node at all
// (not listed since the server started, or every node offline and
// forgotten) is no proof, and reads as not gone.
func (s *Server) nodeGone(ctx context.Context, prov, node string) (bool, error) {
	nodes, err := s.plane.Nodes(ctx)
	if err != nil {
		return false, err
	}
	seen := false
	for _, n := range nodes {
		if n.Provider == prov {
			if n.Name == node {
				return false, nil
			}
			seen = true
		}
	}
	if seen {
		return true, nil
	}
	provs, err := s.plane.Providers(ctx)
	if err != nil {
		return false, err
	}
	return !slices.ContainsFunc(provs, func(p control.ProviderView) bool { return p.Name == prov }), nil
}

// pinVolumes records provider/node as the node of each of vols that has
// none.
func (s *Server) pinVolumes(ctx context.Context, vols []bvolume, provider, node string) {
	for _, v := range vols {
		if _, err := s.vols.pin(ctx, v, provider, node); err != nil {
			s.log.Warn("docker api: record the node of a volume", "volume", v.key(), "node", provider+"/"+node, "err", err)
		}
	}
}

// volumeLock is the lock of s.volPlacing that v's first users take.
func (s *Server) volumeLock(v bvolume) *sync.Mutex {
	h := fnv.New32a()
	_, _ = h.Write([]byte(v.backend()))
	return &s.volPlacing[h.Sum32()%uint32(len(s.volPlacing))]
}
