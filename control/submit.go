package control

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

var idRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,47}$`)

// maxNameLen bounds instance names, leaving room in driver.MaxNameLength
// for the incarnation suffix of a replacement copy.
const maxNameLen = driver.MaxNameLength - 6

// checkNames refuses a request whose instance names (its name or id, with
// the index suffix) would be too long for the back-ends.
func checkNames(r *scheduler.Request, prefix string) error {
	last := instanceName(r, r.N()-1)
	if len(last) <= maxNameLen {
		return nil
	}
	field := "id"
	if r.Name != "" {
		field = "name"
	}
	return &driver.FieldError{Path: prefix + field, Reason: fmt.Sprintf("instance names such as %q are longer than %d characters", last, maxNameLen)}
}

// part is one request of a submission with its owner, pool and label.
type part struct {
	req   scheduler.Request
	owner string
	pool  string
	label string
}

// submit is Plane.Submit.
func (s admitter) submit(ctx context.Context, req scheduler.Request, owner string) (*Answer, error) {
	if err := s.checkSubmitted(ctx, &req.Spec, owner, ""); err != nil {
		return nil, err
	}
	if err := s.checkRequest(&req, ""); err != nil {
		return nil, err
	}
	if err := s.checkEverPlaceable(&req); err != nil {
		return nil, err
	}
	placed, err := s.accept(ctx, []part{{req: req, owner: owner}}, nil, nil)
	if err != nil {
		return nil, err
	}
	return &Answer{Request: req.ID, Instances: placed}, nil
}

// checkRequest validates req, names it when it has no id, and refuses what
// could never fit a quota. prefix is the field path of req.
func (s admitter) checkRequest(req *scheduler.Request, prefix string) error {
	if err := req.Validate(); err != nil {
		return prefixErr(prefix, err)
	}
	var es driver.FieldErrors
	if req.ID == "" {
		req.ID = newID()
	}
	if !idRE.MatchString(req.ID) {
		es = append(es, &driver.FieldError{Path: prefix + "id", Reason: fmt.Sprintf("%q: use 1 to 48 letters, digits, '_', '.' or '-', starting with a letter or digit", req.ID)})
	} else if err := checkNames(req, prefix); err != nil {
		es = append(es, err.(*driver.FieldError))
	}
	if req.Provider != "" {
		if _, err := s.verbs.provider(req.Provider); err != nil {
			es = append(es, &driver.FieldError{Path: prefix + "provider", Reason: fmt.Sprintf("unknown provider %q; known: %v", req.Provider, s.provNames)})
		}
	}
	needFeatures(req)
	if size := req.Spec.Size(); size*req.N() > MaxRequestBytes {
		es = append(es, &driver.FieldError{Path: prefix + "count", Reason: fmt.Sprintf("%d instances of a %d-byte spec: at most %d bytes in all; fewer instances or a smaller spec", req.N(), size, MaxRequestBytes)})
	}
	if err := es.Err(); err != nil {
		return err
	}
	return prefixErr(prefix, s.checkSpec(&req.Spec, req.Provider))
}

// checkEverPlaceable refuses a request that no node known now could take
// even empty: every node fails one of its hard constraints, lacks a
// capability it needs or is of another provider. These are static facts
// of the nodes (labels, provider, features); an offline node, a full one
// or no node known at all lets the request through, to wait.
func (s admitter) checkEverPlaceable(req *scheduler.Request) error {
	if len(req.Constraints) == 0 && len(req.Capabilities) == len(driver.SpecFeatures(&req.Spec)) {
		// Nothing but the features, which checkSpec has found a provider
		// for: no probe needed (it costs a placement over every node).
		return nil
	}
	probe := *req
	probe.ID, probe.Name, probe.Group, probe.Count = "probe", "", "", 1
	probe.Resources, probe.Ports, probe.Affinities, probe.MaxPerNode = driver.Resources{}, nil, nil, 0
	plan, err := s.cluster.c.Snapshot(scheduler.Options{}).Plan(&probe)
	if err != nil || len(plan.Placements) > 0 || len(plan.Unplaced) == 0 || plan.Unplaced[0].Reasons.Nodes == 0 {
		return nil
	}
	rs := plan.Unplaced[0].Reasons
	field := ""
	for _, c := range rs.Counts {
		switch {
		case strings.HasPrefix(c.Reason, "constraint "):
			if field == "" {
				field = "constraints"
				if i := slices.Index(req.Constraints, strings.TrimPrefix(c.Reason, "constraint ")); i >= 0 {
					field = fmt.Sprintf("constraints[%d]", i)
				}
			}
		case strings.HasPrefix(c.Reason, "provider lacks capability "), strings.HasPrefix(c.Reason, "provider is not "):
			if field == "" {
				field = "capabilities"
			}
		default:
			return nil
		}
	}
	return fmt.Errorf("%w: %w", driver.ErrUnsupported, &driver.FieldError{Path: field, Reason: "no node can ever take it: " + rs.String()})
}

// MaxRequestBytes bounds the bytes of spec one request keeps (its spec's
// Size times its count), so that a small body cannot ask the server to
// keep gigabytes.
const MaxRequestBytes = 64 << 20

// needFeatures adds to req's capabilities the features its spec needs of a
// back-end (driver.SpecFeatures): placement then considers only the
// providers that have them.
func needFeatures(req *scheduler.Request) {
	caps := append(slices.Clone(req.Capabilities), driver.SpecFeatures(&req.Spec)...)
	slices.Sort(caps)
	req.Capabilities = slices.Compact(caps)
}

// checkSpec refuses a spec that no eligible provider (prov, or every one
// when empty) could ever run, naming the field and each provider's reason:
// a feature the spec needs that the provider lacks (driver.SpecFeatures),
// or its own refusal (driver.SpecChecker).
func (s admitter) checkSpec(spec *driver.Spec, prov string) error {
	names := s.provNames
	if prov != "" {
		names = []string{prov}
	}
	need := driver.SpecFeatures(spec)
	path := ""
	var why []string
	for _, n := range names {
		p, err := s.verbs.provider(n)
		if err != nil {
			continue
		}
		has := p.Features()
		if i := slices.IndexFunc(need, func(f string) bool { return !slices.Contains(has, f) }); i >= 0 {
			err = &driver.FieldError{Path: driver.FeatureField(need[i]), Reason: "cannot run " + need[i]}
		} else if err = p.CheckSpec(spec); err == nil {
			return nil
		}
		reason := err.Error()
		var fe *driver.FieldError
		if errors.As(err, &fe) {
			reason = fe.Path + ": " + fe.Reason
			// The field named is the first one of a provider that has
			// the kind: what stands between the spec and the provider
			// closest to running it.
			if path == "" || path == "kind" {
				path = fe.Path
			}
		}
		why = append(why, fmt.Sprintf("provider %s: %s", n, reason))
	}
	if why == nil {
		return nil
	}
	if path == "" {
		path = "spec"
	}
	return fmt.Errorf("%w: %w", driver.ErrUnsupported, &driver.FieldError{Path: path, Reason: "no provider can run this: " + strings.Join(why, "; ")})
}

func prefixErr(prefix string, err error) error {
	if prefix == "" || err == nil {
		return err
	}
	return appendPrefixed(nil, prefix, err).Err()
}

// instanceName is the name of instance i of r (the scheduler's naming).
func instanceName(r *scheduler.Request, i int) string {
	if r.Name == "" {
		return r.InstanceID(i)
	}
	if r.N() > 1 {
		return r.Name + "-" + strconv.Itoa(i)
	}
	return r.Name
}

// indexOf returns the instance index of in within its request.
func indexOf(in *reconciler.Instance) int {
	if in.ID == in.Request {
		return 0
	}
	n, err := strconv.Atoi(in.ID[len(in.Request)+1:])
	if err != nil {
		return -1
	}
	return n
}

// submitGroup is Plane.SubmitGroup.
func (s admitter) submitGroup(ctx context.Context, g scheduler.Group, owner string) (*GroupAnswer, error) {
	for i := range g.Services {
		if err := s.checkSubmitted(ctx, &g.Services[i].Spec, owner, fmt.Sprintf("services[%d].", i)); err != nil {
			return nil, err
		}
	}
	if err := s.fromPool(&g); err != nil {
		return nil, err
	}
	if err := g.Validate(); err != nil {
		return nil, err
	}
	if !idRE.MatchString(g.ID) {
		return nil, &driver.FieldError{Path: "id", Reason: fmt.Sprintf("%q: use 1 to 48 letters, digits, '_', '.' or '-', starting with a letter or digit", g.ID)}
	}
	if g.Provider != "" {
		if _, err := s.verbs.provider(g.Provider); err != nil {
			return nil, &driver.FieldError{Path: "provider", Reason: fmt.Sprintf("unknown provider %q; known: %v", g.Provider, s.provNames)}
		}
	}
	if _, err := s.st.Get(ctx, PrefixGroups+g.ID); err == nil {
		return nil, fmt.Errorf("%w: group %s: %w", driver.ErrAlreadyExists, g.ID, &driver.FieldError{Path: "id", Reason: "exists already"})
	}
	var reused []Placed
	if g.Kind == scheduler.KindNodeSet {
		var err error
		if reused, err = s.reuse(ctx, &g, owner); err != nil {
			return nil, err
		}
	}
	ans := &GroupAnswer{Group: g.ID, Instances: reused}
	if len(g.Services) == 0 {
		return ans, nil
	}
	for i := range g.Services {
		needFeatures(&g.Services[i].Request)
		if err := prefixErr(fmt.Sprintf("services[%d].", i), s.checkSpec(&g.Services[i].Spec, g.Services[i].Provider)); err != nil {
			return nil, err
		}
		r := g.ServiceRequest(i)
		if err := prefixErr(fmt.Sprintf("services[%d].", i), s.checkEverPlaceable(&r)); err != nil {
			return nil, err
		}
	}
	// The requests as the scheduler names them, for storing and re-placing.
	parts := make([]part, len(g.Services))
	for i := range g.Services {
		r := g.ServiceRequest(i)
		if err := checkNames(&r, fmt.Sprintf("services[%d].", i)); err != nil {
			return nil, err
		}
		parts[i] = part{req: r, owner: owner}
	}
	if why := s.groupNeverFits(&g, owner); why != "" {
		return nil, driver.Errorf(driver.ErrQuotaExceeded, "group %s can never fit: %s", g.ID, why)
	}
	start := time.Now()
	g.Owner = owner
	plan, err := s.cluster.c.PlaceGroup(&g)
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Scheduled(time.Since(start), err == nil && plan.Complete())
	}
	if err != nil {
		return nil, err
	}
	forget := s.placer.evict(plan.Evicted)
	placed, err := s.accept(ctx, parts, plan, &g)
	if err != nil {
		forget()
		return nil, err
	}
	s.placer.deleteVictims(ctx, plan.Evicted)
	if ans.Instances == nil {
		ans.Instances = placed // a thousand instances are not copied
	} else {
		ans.Instances = append(ans.Instances, placed...)
	}
	return ans, nil
}

// reuse hands ready pool instances to a node set: each service naming a
// pool label takes unassigned running instances of that label (Nodepool's
// reuse of ready nodes). Services fully served are removed from g.
func (s admitter) reuse(ctx context.Context, g *scheduler.Group, owner string) ([]Placed, error) {
	var out []Placed
	rest := g.Services[:0]
	for _, sv := range g.Services {
		need := sv.N()
		ready := s.snapshot(func(in *rec) bool {
			return in.Pool != "" && (g.Pool == "" || in.Pool == g.Pool) && in.Label() == sv.Name && in.Owner == "" && in.Group() == "" &&
				in.Phase == reconciler.Running && (g.Provider == "" || in.Provider == g.Provider)
		})
		for _, in := range ready {
			if need == 0 {
				break
			}
			got, ok, err := s.assign(ctx, in.ID, owner, g.ID)
			if err != nil {
				return nil, err
			}
			if ok {
				out = append(out, Placed{Instance: viewOf(&got), Node: s.nodeRef(got.Provider, got.Node)})
				need--
			}
		}
		if need > 0 {
			sv.Count = need
			if sv.Essential != nil && *sv.Essential > need {
				e := need
				sv.Essential = &e
			}
			rest = append(rest, sv)
		}
	}
	g.Services = rest
	return out, nil
}

// fromPool fills in a node set that names a pool: its provider is the
// pool's, and each service names one of the pool's labels and, when it
// gives no image, takes that label's spec. A service that gives its own
// spec keeps it. Every service counts against the pool's quotas.
func (s admitter) fromPool(g *scheduler.Group) error {
	if g.Pool == "" || g.Kind != scheduler.KindNodeSet {
		return nil // Validate says what is wrong with a pool outside a node set
	}
	i := slices.IndexFunc(s.cfg.Pools, func(p Pool) bool { return p.Name == g.Pool })
	if i < 0 {
		names := make([]string, len(s.cfg.Pools))
		for k, p := range s.cfg.Pools {
			names[k] = p.Name
		}
		return &driver.FieldError{Path: "pool", Reason: fmt.Sprintf("unknown pool %q; known: %v", g.Pool, names)}
	}
	pool := &s.cfg.Pools[i]
	if g.Provider != "" && g.Provider != pool.Provider {
		return &driver.FieldError{Path: "provider", Reason: fmt.Sprintf("%q: pool %q is on provider %q", g.Provider, pool.Name, pool.Provider)}
	}
	g.Provider = pool.Provider
	g.Services = slices.Clone(g.Services)
	for k := range g.Services {
		sv := &g.Services[k]
		j := slices.IndexFunc(pool.Labels, func(l Label) bool { return l.Name == sv.Name })
		if j < 0 {
			labels := make([]string, len(pool.Labels))
			for n, l := range pool.Labels {
				labels[n] = l.Name
			}
			return &driver.FieldError{Path: fmt.Sprintf("services[%d].name", k), Reason: fmt.Sprintf("pool %q has no label %q; its labels: %v", pool.Name, sv.Name, labels)}
		}
		if sv.Image == "" && sv.Kind == "" {
			name := sv.Name
			sv.Spec = pool.Labels[j].Spec // as the pool's own requests take it
			sv.Name = name
		}
		sv.Pool = pool.Name
	}
	return nil
}

// assign gives a ready pool instance to owner and group, if it is still
// ready and unassigned.
func (s admitter) assign(ctx context.Context, id, owner, group string) (reconciler.Instance, bool, error) {
	mu := s.lockOf(id)
	mu.Lock()
	defer mu.Unlock()
	for range 10 {
		cur, ok := s.get(id)
		if !ok || cur.Owner != "" || cur.Group != "" || cur.Phase != reconciler.Running {
			return cur, false, nil
		}
		next := cur
		next.Owner, next.Group, next.Updated = owner, group, s.now()
		if next.Owner == "" {
			next.Owner = "-"
		}
		ok, _, err := s.commit(ctx, &txn{puts: []instPut{{base: cur.Revision, in: &next}}})
		if err != nil {
			return cur, false, err
		}
		if !ok {
			if err := s.reload(ctx, id); err != nil {
				return cur, false, err
			}
			continue
		}
		return next, true, nil
	}
	return reconciler.Instance{}, false, nil
}

// plan is Plane.Plan: the request placed on a private snapshot.
func (s admitter) plan(ctx context.Context, req scheduler.Request) (*PlanAnswer, error) {
	if err := s.checkRequest(&req, ""); err != nil {
		return nil, err
	}
	plan, err := s.cluster.c.Snapshot(scheduler.Options{}).Plan(&req)
	if err != nil {
		return nil, err
	}
	ans := &PlanAnswer{Placements: []PlanPlacement{}}
	for _, pl := range plan.Placements {
		ans.Placements = append(ans.Placements, PlanPlacement{Instance: pl.Instance, Node: *s.nodeRef(pl.Provider, pl.Node)})
	}
	for _, u := range plan.Unplaced {
		ans.Unplaced += len(u.Indexes)
		ans.Reasons = append(ans.Reasons, u.Reasons.String())
	}
	return ans, nil
}

// groupNeverFits says why the essential instances of g, which are placed
// all at once, could never fit together within a quota of owner (or of
// g's provider, when g names one) even if nothing else were held; or "".
func (s admitter) groupNeverFits(g *scheduler.Group, owner string) string {
	n := 0
	var cpu driver.MilliCPU
	var mem driver.Bytes
	for i := range g.Services {
		sv := &g.Services[i]
		e := sv.EssentialCount()
		n += e
		cpu += driver.MilliCPU(e) * sv.CPU
		mem += driver.Bytes(e) * sv.Memory
	}
	for _, u := range s.placer.quotaUse() {
		if u.Pool != "" || (u.Provider != "" && u.Provider != g.Provider) || !u.Covers(owner, "", g.Provider) {
			continue
		}
		scope := u.Scope()
		switch {
		case u.Instances > 0 && n > u.Instances:
			return fmt.Sprintf("quota %s allows %d instances; the group's essential instances are %d", scope, u.Instances, n)
		case u.CPU > 0 && cpu > u.CPU:
			return fmt.Sprintf("quota %s allows %s cpus; the group's essential instances ask for %s", scope, u.CPU, cpu)
		case u.Memory > 0 && mem > u.Memory:
			return fmt.Sprintf("quota %s allows %s memory; the group's essential instances ask for %s", scope, u.Memory, mem)
		}
	}
	return ""
}

// holdGroup marks group id as about to be queued (queueGroup), before its
// pending instances are stored: from then on the one-by-one placer never
// places them alone. release undoes it when they are not stored.
func (s admitter) holdGroup(id string) (release func()) {
	s.gangMu.Lock()
	s.gang.held[id] = true
	s.gangMu.Unlock()
	return func() {
		s.gangMu.Lock()
		delete(s.gang.held, id)
		s.gangMu.Unlock()
	}
}

// queueGroup adds g to the gang queue (and ends its hold).
func (s admitter) queueGroup(g *scheduler.Group, now time.Time) {
	s.gangMu.Lock()
	defer s.gangMu.Unlock()
	delete(s.gang.held, g.ID)
	if s.gang.ids[g.ID] {
		return
	}
	if err := s.gang.queueOf(g).Push(g, now); err != nil {
		s.log.Warn("gang queue", "group", g.ID, "err", err)
		return
	}
	s.gang.ids[g.ID] = true
}

// gangQueued reports whether group id waits in the gang queue, or is
// about to (holdGroup).
func (s admitter) gangQueued(id string) bool {
	if id == "" {
		return false
	}
	s.gangMu.Lock()
	defer s.gangMu.Unlock()
	return s.gang.ids[id] || s.gang.held[id]
}
