package control

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/driver"
)

// Berth's own prefixes: its tags and labels (driver.TagManaged and the
// others; Kubernetes also takes "berth/") and the environment the local
// back-end gives a process (BERTH_INSTANCE_ID...). A submission may not
// set them: a label such as berth.instance would pass a user's resource
// for another instance, or for none of Berth's.
var (
	reservedLabelPrefixes = []string{"berth.", "berth/"}
	reservedEnvPrefix     = "BERTH_"
)

// checkReserved refuses a spec that sets a label, tag or variable of
// Berth's own; each error names the field (prefix+"labels.<key>"...).
func checkReserved(spec *driver.Spec, prefix string) error {
	var es driver.FieldErrors
	for _, m := range []struct {
		name string
		kv   map[string]string
	}{{"labels", spec.Labels}, {"tags", spec.Tags}} {
		for _, k := range slices.Sorted(maps.Keys(m.kv)) {
			for _, p := range reservedLabelPrefixes {
				if strings.HasPrefix(k, p) {
					es.Add(prefix+m.name+"."+k, "the prefix %q is reserved for Berth's own %s", p, m.name)
					break
				}
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		if strings.HasPrefix(k, reservedEnvPrefix) {
			es.Add(prefix+"env."+k, "the prefix %q is reserved for the variables Berth sets", reservedEnvPrefix)
		}
	}
	return es.Err()
}

// RunAs is a namespace's policy of who its workloads may run as: the
// users and groups its specs may name. Empty lists allow any user or
// group but root (the user or group "root" or "0"), which is allowed only
// when listed. A namespace with no policy is "non-root only". The policy
// binds every caller but admins; a spec that names no user runs as its
// back-end's default (the local back-end's default_user when the server
// runs as root; a container image's own user).
type RunAs struct {
	Namespace string   `json:"namespace" yaml:"namespace"`
	Users     []string `json:"users,omitempty" yaml:"users"`
	Groups    []string `json:"groups,omitempty" yaml:"groups"`
}

// CheckRunAs checks the run-as policies; paths are "run_as[i]...".
func CheckRunAs(policies []RunAs) driver.FieldErrors {
	var es driver.FieldErrors
	seen := map[string]bool{}
	for i, p := range policies {
		f := fmt.Sprintf("run_as[%d]", i)
		if err := auth.ValidName(p.Namespace); err != nil {
			es.Add(f+".namespace", "%v", err)
		} else if seen[p.Namespace] {
			es.Add(f+".namespace", "%q has a policy already", p.Namespace)
		}
		seen[p.Namespace] = true
		for _, l := range []struct {
			name string
			list []string
		}{{"users", p.Users}, {"groups", p.Groups}} {
			for j, v := range l.list {
				if v == "" || len(v) > 256 || strings.ContainsAny(v, ":\x00") {
					es.Add(fmt.Sprintf("%s.%s[%d]", f, l.name, j), "%q: want a name or a numeric id", v)
				}
			}
		}
	}
	return es
}

// isRoot reports whether a user or group names root: its name or id 0.
func isRoot(v string) bool {
	return v == "root" || strings.TrimLeft(v, "0") == "" && v != ""
}

// checkRunAs refuses a spec whose user or group the run-as policy of
// namespace owner does not allow, when ctx carries a caller that is not an
// admin (auth.NewContext: the API and the Docker endpoint set it). What
// the server submits itself carries none. The error is
// auth.ErrForbidden with the field named (403).
func (s admitter) checkRunAs(ctx context.Context, spec *driver.Spec, owner, prefix string) error {
	id, ok := auth.FromContext(ctx)
	if !ok || id.Role == auth.RoleAdmin {
		return nil
	}
	var pol RunAs
	if i := slices.IndexFunc(s.cfg.RunAs, func(p RunAs) bool { return p.Namespace == owner }); i >= 0 {
		pol = s.cfg.RunAs[i]
	}
	for _, f := range []struct {
		name, v string
		allow   []string
	}{{"user", spec.User, pol.Users}, {"group", spec.Group, pol.Groups}} {
		switch {
		case f.v == "":
		case slices.Contains(f.allow, f.v):
		case len(f.allow) > 0:
			return &refused{&driver.FieldError{Path: prefix + f.name,
				Reason: fmt.Sprintf("%q: namespace %q runs its workloads as %s %s only", f.v, owner, f.name, strings.Join(f.allow, ", "))}}
		case isRoot(f.v):
			return &refused{&driver.FieldError{Path: prefix + f.name,
				Reason: fmt.Sprintf("%q is root: namespace %q runs its workloads as non-root %ss only (run_as in the server's configuration)", f.v, owner, f.name)}}
		}
	}
	return nil
}

// refused is a field a policy does not allow the caller: auth.ErrForbidden
// (403) and the *driver.FieldError naming the field, with the field's
// message alone.
type refused struct{ fe *driver.FieldError }

func (e *refused) Error() string   { return e.fe.Error() }
func (e *refused) Unwrap() []error { return []error{auth.ErrForbidden, e.fe} }

// checkSubmitted is what a caller's submission must satisfy beyond its
// validity: no field of Berth's own, and a user its namespace allows.
func (s admitter) checkSubmitted(ctx context.Context, spec *driver.Spec, owner, prefix string) error {
	if err := checkReserved(spec, prefix); err != nil {
		return err
	}
	return s.checkRunAs(ctx, spec, owner, prefix)
}

// ChosenID is the id under which a request or group id chosen by caller
// in namespace ns is stored, so that two namespaces may choose the same
// id and no answer reveals another namespace's. A caller who sees every
// namespace (an admin) keeps its id; anyone else's is stored as
// ns+"_"+id (an id that carries its namespace so already is kept). Ids
// kept as chosen take no '_' in their first part (up to the first '.')
// but after the namespace they are submitted to: namespaces are DNS
// labels, so the ids of two namespaces never meet, and a tenant's 409 is
// only ever about its own. Ids Berth makes itself (random ones) are
// stored as they are. The errors name path.
func ChosenID(caller auth.Identity, ns, id, path string) (string, error) {
	if !idRE.MatchString(id) {
		return "", &driver.FieldError{Path: path, Reason: fmt.Sprintf("%q: use 1 to 48 letters, digits, '_', '.' or '-', starting with a letter or digit", id)}
	}
	own := strings.HasPrefix(id, ns+"_")
	if caller.All() {
		if first, _, _ := strings.Cut(id, "."); strings.Contains(first, "_") && !own {
			return "", &driver.FieldError{Path: path, Reason: fmt.Sprintf("%q: NAMESPACE_ID is the form of other namespaces' ids; in namespace %s an id takes no '_' before its first '.' but after %s_", id, ns, ns)}
		}
		return id, nil
	}
	if own {
		return id, nil
	}
	q := ns + "_" + id
	if !idRE.MatchString(q) {
		return "", &driver.FieldError{Path: path, Reason: fmt.Sprintf("%q: stored as %q in namespace %s, longer than 48 characters: choose a shorter id", id, q, ns)}
	}
	return q, nil
}
