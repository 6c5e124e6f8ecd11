package web

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/reconciler"
)

// pages are the parsed templates, one per page, each with the layout.
type pages struct {
	t map[string]*template.Template
}

var pageNames = []string{"signin", "overview", "instances", "instance", "pending", "whatif", "rebalance", "error"}

func parsePages() (*pages, error) {
	funcs := template.FuncMap{
		"has": func(list []string, v string) bool { return slices.Contains(list, v) },
		"plural": func(n int, one, many string) string {
			if n == 1 {
				return strconv.Itoa(n) + " " + one
			}
			return strconv.Itoa(n) + " " + many
		},
	}
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return nil, err
	}
	p := &pages{t: map[string]*template.Template{}}
	for _, name := range pageNames {
		t, err := template.Must(base.Clone()).ParseFS(templateFS, "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		p.t[name] = t
	}
	return p, nil
}

// frame is what the layout needs besides the page's own data.
type frame struct {
	Title string
	Nav   string
	User  *Identity
	CSRF  string
	// Events is the event stream the page follows for its live regions;
	// Refresh is the least time between two refreshes, in milliseconds.
	Events  string
	Refresh int
	Page    any
}

// render writes page name with data.
func (s *Server) render(w http.ResponseWriter, status int, name string, f frame) error {
	var buf bytes.Buffer
	if err := s.pages.t[name].Execute(&buf, f); err != nil {
		return fmt.Errorf("web: rendering %s: %w", name, err)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, err := w.Write(buf.Bytes())
	return err
}

func (s *Server) frame(c *caller, title, nav string, page any) frame {
	f := frame{Title: title, Nav: nav, Page: page, Refresh: 1000}
	if c != nil {
		id := c.Identity
		f.User, f.CSRF = &id, c.csrf
	}
	return f
}

// renderError answers err: a browser that is not signed in goes to the
// sign-in page; everything else gets the error page with its status.
func (s *Server) renderError(w http.ResponseWriter, r *http.Request, c *caller, err error) {
	status, msg := statusOf(err)
	if status >= 500 {
		s.log.Error("web: request failed", "method", r.Method, "path", r.URL.Path, "error", err)
	}
	if status == http.StatusUnauthorized && r.Method == http.MethodGet && r.Header.Get("Authorization") == "" &&
		!strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		http.Redirect(w, r, Prefix+"signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		return
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="berth"`)
	}
	if err := s.render(w, status, "error", s.frame(c, "Error", "", struct {
		Status int
		Text   string
		Msg    string
	}{status, http.StatusText(status), msg})); err != nil {
		s.log.Error("web: rendering an error page", "error", err)
	}
}

// overview is the cluster at a glance.
// overviewNodes is how many nodes of each provider the overview lists
// unless asked for all (?nodes=all): the totals count every node, and a
// page of 10,000 rows weighs megabytes on every live refresh.
const overviewNodes = 500

func (s *Server) overview(w http.ResponseWriter, r *http.Request, c *caller) error {
	q := r.URL.Query()
	for k := range q {
		if k != "nodes" {
			return &httpError{http.StatusBadRequest, fmt.Sprintf("unknown query parameter %q; known: nodes", k)}
		}
	}
	limit := overviewNodes
	switch v := q.Get("nodes"); v {
	case "":
	case "all":
		limit = 0
	default:
		return &httpError{http.StatusBadRequest, fmt.Sprintf("nodes %q: want all, or leave it out for the first %d of each provider", v, overviewNodes)}
	}
	d, err := s.overviewData(r, c, limit)
	if err != nil {
		return err
	}
	f := s.frame(c, "Overview", "overview", d)
	f.Events, f.Refresh = Prefix+"events?usage=1", 3000 // the heaviest page
	return s.render(w, http.StatusOK, "overview", f)
}

func (s *Server) overviewData(r *http.Request, c *caller, nodeLimit int) (overviewData, error) {
	if !c.Allows(auth.Read) { // the cluster as a whole
		return overviewData{}, errDenied
	}
	ctx := r.Context()
	nodes, err := s.plane.Nodes(ctx)
	if err != nil {
		return overviewData{}, err
	}
	provs, err := s.plane.Providers(ctx)
	if err != nil {
		return overviewData{}, err
	}
	quotas, err := s.plane.Quotas(ctx)
	if err != nil {
		return overviewData{}, err
	}
	counts, err := s.plane.Counts(ctx)
	if err != nil {
		return overviewData{}, err
	}
	d := buildOverview(nodes, provs, quotas, counts, c.Identity, nodeLimit)
	now := s.now()
	d.Hour = viewHour(s.plane.ClusterUsageHour(), now, hourW, hourH)
	s.nodeHours(&d, now)
	return d, nil
}

// instancesData is the instances page.
type instancesData struct {
	Rows []instanceRow
	// Filter values as given.
	Namespace, Provider, Node, Phase, Name string
	Limit                                  int
	// Namespaces the caller may choose from; nil means any (a text field).
	Namespaces []string
	Providers  []string
	Phases     []string
	Next       string // query of the next page, "" on the last
	First      string // query of the first page, "" on it
}

// instances is the table of instances, filtered and paged like
// GET /v1/instances.
func (s *Server) instances(w http.ResponseWriter, r *http.Request, c *caller) error {
	q := r.URL.Query()
	for k, v := range q {
		if !slices.Contains([]string{"namespace", "provider", "node", "phase", "name", "limit", "after"}, k) {
			return &httpError{http.StatusBadRequest, "unknown query parameter " + strconv.Quote(k) + "; known: namespace, provider, node, phase, name, limit, after"}
		}
		if len(v) > 1 {
			return &httpError{http.StatusBadRequest, fmt.Sprintf("query parameter %q given %d times: give it once", k, len(v))}
		}
	}
	d := instancesData{Namespace: q.Get("namespace"), Provider: q.Get("provider"), Node: q.Get("node"), Phase: q.Get("phase"),
		Name: q.Get("name"), Limit: s.pageSize}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > api.MaxPageSize {
			return &httpError{http.StatusBadRequest, fmt.Sprintf("limit %q: want an integer from 1 to %d", v, api.MaxPageSize)}
		}
		d.Limit = n
	}
	f := control.Filter{Provider: d.Provider, Node: d.Node, Owner: d.Namespace, Name: d.Name, Limit: d.Limit, After: q.Get("after")}
	if d.Phase != "" {
		ph := control.Phase(d.Phase)
		if !ph.Valid() {
			return &httpError{http.StatusBadRequest, fmt.Sprintf("phase %q is not a phase; want one of %s", d.Phase, phaseList())}
		}
		f.Phases = []control.Phase{ph}
	}
	if !c.All() {
		// One namespace at a time: a page of one filter stays a page.
		d.Namespaces = c.Namespaces
		if d.Namespace == "" && len(c.Namespaces) > 0 {
			d.Namespace = c.Namespaces[0]
			f.Owner = d.Namespace
		}
	}
	if c.Authorize(auth.Read, f.Owner) != nil { // "": every namespace
		return errDenied
	}
	list, err := s.plane.Instances(r.Context(), f)
	if err != nil {
		return err
	}
	d.Rows = make([]instanceRow, 0, len(list))
	for i := range list {
		d.Rows = append(d.Rows, rowOf(&list[i]))
	}
	keep := url.Values{}
	for _, k := range []string{"namespace", "provider", "node", "phase", "name", "limit"} {
		if v := q.Get(k); v != "" {
			keep.Set(k, v)
		}
	}
	if q.Get("after") != "" {
		d.First = "?" + keep.Encode()
	}
	if len(list) == f.Limit {
		next := url.Values{}
		for k, v := range keep {
			next[k] = v
		}
		next.Set("after", list[len(list)-1].ID)
		d.Next = "?" + next.Encode()
	}
	provs, err := s.plane.Providers(r.Context())
	if err != nil {
		return err
	}
	for _, p := range provs {
		d.Providers = append(d.Providers, p.Name)
	}
	d.Phases = phaseStrings()
	fr := s.frame(c, "Instances", "instances", d)
	fr.Events = Prefix + "events"
	return s.render(w, http.StatusOK, "instances", fr)
}

func phaseStrings() []string {
	out := make([]string, len(reconciler.Phases))
	for i, p := range reconciler.Phases {
		out[i] = string(p)
	}
	return out
}

func phaseList() string { return strings.Join(phaseStrings(), ", ") }

// instanceData is one instance's page.
type instanceData struct {
	Row       instanceRow
	Spec      specView
	History   []changeRow
	Created   string
	Attempts  int
	BackendID string
	Group     string
	Request   string
	Pool      string
	CanManage bool
	Logs      string
	Hour      hourView
}

type changeRow struct {
	At, Phase, Node, Message string
}

// visibleInstance returns the instance ref (a name is looked up in the
// caller's namespaces) if the caller may do what needs p to it; 403 when
// its role does not allow p, checked first as the API's routes do, and
// 404, as for one that does not exist, when it lives where the caller
// does not see. The rule is auth.Identity.Authorize, the API's.
func (s *Server) visibleInstance(r *http.Request, c *caller, ref string, p auth.Permission) (control.Instance, error) {
	if !c.Allows(p) {
		return control.Instance{}, errDenied
	}
	in, err := s.plane.Lookup(r.Context(), ref, control.ScopeOf(c.Identity))
	if err != nil {
		return in, err
	}
	switch err := c.Authorize(p, in.Owner); {
	case errors.Is(err, auth.ErrNotVisible):
		return control.Instance{}, fmt.Errorf("%w: no instance %q", errNotFound, ref)
	case err != nil:
		return control.Instance{}, errDenied
	}
	return in, nil
}

func (s *Server) instance(w http.ResponseWriter, r *http.Request, c *caller) error {
	in, err := s.visibleInstance(r, c, r.PathValue("ref"), auth.Read)
	if err != nil {
		return err
	}
	d := instanceData{Row: rowOf(&in), Spec: viewSpec(in.Spec, in.HostPorts), Attempts: in.Attempts, BackendID: in.BackendID,
		Group: in.Group, Request: in.Request, Pool: in.Pool, CanManage: c.Authorize(auth.Operate, in.Owner) == nil,
		Logs: Prefix + "instances/" + url.PathEscape(in.ID) + "/logs"}
	if !in.Created.IsZero() {
		d.Created = in.Created.UTC().Format("2006-01-02 15:04:05")
	}
	if pts, err := s.plane.UsageHour(r.Context(), in.ID); err == nil {
		d.Hour = viewHour(pts, s.now(), hourW, hourH)
	}
	for _, ch := range s.hub.history(in.ID) {
		d.History = append(d.History, changeRow{At: ch.At.UTC().Format("15:04:05.000"), Phase: string(ch.Phase), Node: ch.Node, Message: ch.Message})
	}
	f := s.frame(c, "Instance "+in.ID, "instances", d)
	f.Events = Prefix + "events?usage=1&instance=" + url.QueryEscape(in.ID)
	return s.render(w, http.StatusOK, "instance", f)
}

// act stops, starts, restarts or deletes an instance, then shows it. Each
// is an audit record, as the API's calls are (api.Audit).
func (s *Server) act(w http.ResponseWriter, r *http.Request, c *caller) (err error) {
	defer func() {
		status := http.StatusSeeOther
		if err != nil {
			status, _ = statusOf(err)
		}
		api.Audit(s.audit, r, c.Identity, status, err)
	}()
	in, err := s.visibleInstance(r, c, r.PathValue("ref"), auth.Operate)
	if err != nil {
		return err
	}
	ctx := r.Context()
	switch a := r.PathValue("action"); a {
	case "stop":
		err = s.plane.Stop(ctx, in.ID, 0)
	case "start":
		err = s.plane.Start(ctx, in.ID)
	case "restart":
		err = s.plane.Restart(ctx, in.ID, 0)
	case "delete":
		err = s.plane.Delete(ctx, in.ID)
	default:
		return &httpError{http.StatusNotFound, "no such action: " + strconv.Quote(a) + "; want stop, start, restart or delete"}
	}
	if err != nil {
		return err
	}
	http.Redirect(w, r, Prefix+"instances/"+url.PathEscape(in.ID), http.StatusSeeOther)
	return nil
}

// pendingLimit bounds the pending instances and groups the page reads.
const (
	pendingLimit = 10_000
	groupLimit   = 200
)

// pendingData is the pending page.
type pendingData struct {
	Reasons   []reasonGroup
	Shown     int
	Total     int  // pending in the whole cluster; -1 when not shown
	Truncated bool // more pending than were read
	Groups    []groupView
}

type groupView struct {
	ID       string
	State    string
	Message  string
	Services []serviceView
}

type serviceView struct {
	Request          string
	Count            int
	Essential        int
	Elastic          int
	Running          int
	EssentialRunning int
}

func (s *Server) pending(w http.ResponseWriter, r *http.Request, c *caller) error {
	ctx := r.Context()
	namespaces := []string{""}
	if !c.All() {
		namespaces = c.Namespaces
	}
	var pend, withGroup []control.Instance
	d := pendingData{Total: -1}
	for _, ns := range namespaces {
		if c.Authorize(auth.Read, ns) != nil {
			continue
		}
		list, err := s.plane.Instances(ctx, control.Filter{Owner: ns, Phases: []control.Phase{reconciler.Pending}, Limit: pendingLimit})
		if err != nil {
			return err
		}
		if len(list) == pendingLimit {
			d.Truncated = true
		}
		pend = append(pend, list...)
		all, err := s.plane.Instances(ctx, control.Filter{Owner: ns, Limit: pendingLimit})
		if err != nil {
			return err
		}
		for i := range all {
			if all[i].Group != "" {
				withGroup = append(withGroup, all[i])
			}
		}
	}
	d.Reasons = groupReasons(pend)
	d.Shown = len(pend)
	if c.All() {
		counts, err := s.plane.Counts(ctx)
		if err != nil {
			return err
		}
		d.Total = counts[reconciler.Pending]
	}
	seen := map[string]bool{}
	for _, in := range append(pend, withGroup...) {
		if in.Group == "" || seen[in.Group] || len(seen) >= groupLimit {
			continue
		}
		seen[in.Group] = true
		st, err := s.plane.Group(ctx, in.Group)
		if err != nil {
			continue // forgotten since listed
		}
		g := groupView{ID: st.ID, State: string(st.State), Message: st.Message}
		for _, sv := range st.Services {
			g.Services = append(g.Services, serviceView{Request: sv.Request, Count: sv.Count, Essential: sv.Essential,
				Elastic: sv.Count - sv.Essential, Running: sv.Running, EssentialRunning: sv.EssentialRunning})
		}
		d.Groups = append(d.Groups, g)
	}
	slices.SortFunc(d.Groups, func(a, b groupView) int { return strings.Compare(a.ID, b.ID) })
	f := s.frame(c, "Pending", "pending", d)
	f.Events = Prefix + "events"
	return s.render(w, http.StatusOK, "pending", f)
}

// signinData is the sign-in page.
type signinData struct {
	CSRF    string
	Next    string
	Message string
	Locked  bool
}

// safeNext keeps a post-sign-in target only when it is a dashboard path.
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return Prefix
	}
	return next
}

func (s *Server) signinCookie(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(signinCookie); err == nil && len(c.Value) == 43 {
		return c.Value
	}
	v := randomToken()
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Value: v, Path: Prefix, HttpOnly: true, Secure: s.secureFor(r),
		SameSite: http.SameSiteStrictMode, MaxAge: 3600})
	return v
}

func (s *Server) secureFor(r *http.Request) bool { return s.secure || r.TLS != nil }

func (s *Server) signinPage(w http.ResponseWriter, r *http.Request, _ *caller) error {
	d := signinData{Next: safeNext(r.URL.Query().Get("next")), Locked: s.auth == nil}
	status := http.StatusOK
	if d.Locked {
		status = http.StatusServiceUnavailable
		d.Message = errNoAuth.Error()
	} else {
		d.CSRF = s.signinCookie(w, r)
	}
	return s.render(w, status, "signin", s.frame(nil, "Sign in", "", d))
}

// maxTokenSize bounds the token field of the sign-in form.
const maxTokenSize = 4096

func (s *Server) signin(w http.ResponseWriter, r *http.Request, _ *caller) error {
	if s.auth == nil {
		return errNoAuth
	}
	if err := r.ParseForm(); err != nil {
		return formError(w, err, "reading the form")
	}
	ck, err := r.Cookie(signinCookie)
	if err != nil || !sameSecret(r.PostFormValue("csrf"), ck.Value) {
		return errCSRF
	}
	d := signinData{Next: safeNext(r.PostFormValue("next")), CSRF: ck.Value}
	if s.signins.Tokens() < 1 {
		return &httpError{http.StatusTooManyRequests, "too many failed sign-ins; wait a moment and try again"}
	}
	tok := strings.TrimSpace(r.PostFormValue("token"))
	if tok == "" || len(tok) > maxTokenSize {
		d.Message = "give a token"
		return s.render(w, http.StatusUnauthorized, "signin", s.frame(nil, "Sign in", "", d))
	}
	id, err := s.auth.Authenticate(r.Context(), tok)
	if err != nil {
		s.signins.Allow() // failures spend the allowance
		d.Message = "that token was not accepted (unknown, revoked or expired)"
		return s.render(w, http.StatusUnauthorized, "signin", s.frame(nil, "Sign in", "", d))
	}
	sid, _ := s.sessions.add(tok, s.now())
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: sid, Path: Prefix, HttpOnly: true, Secure: s.secureFor(r),
		SameSite: http.SameSiteStrictMode, MaxAge: int(s.sessions.ttl.Seconds())})
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true, Secure: s.secureFor(r), SameSite: http.SameSiteStrictMode})
	s.log.Info("web: signed in", "token", id.Name)
	http.Redirect(w, r, d.Next, http.StatusSeeOther)
	return nil
}

func (s *Server) signout(w http.ResponseWriter, r *http.Request, c *caller) error {
	if c.sessionID != "" {
		s.sessions.remove(c.sessionID)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true, Secure: s.secureFor(r), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, Prefix+"signin", http.StatusSeeOther)
	return nil
}
