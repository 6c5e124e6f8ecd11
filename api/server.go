// Package api is Berth's REST API under /v1 (JSON), served over a
// control.Plane, and (in api/client) the Go client for it.
//
// Every handler returns an error; ServeHTTP turns it into the one error
// shape, {"error": {"code", "message", "field"}}, in one place (toError).
// Request bodies are decoded strictly: unknown fields and wrong types are
// 400 naming the field, bodies above the limit are 413.
//
// Lists: GET /v1/instances answers one page, sorted by id; a full page
// carries a Link header (RFC 8288) naming the next one.
//
// Streams: logs, usage (stats) and image preloads are NDJSON (one JSON
// object per line, see LogFrame, StatsFrame and PreloadFrame); events are
// server-sent events whose id is the store revision, so a client resumes
// with Last-Event-ID, within the history the store keeps (else the error
// event has code CodeCompacted).
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// DefaultMaxBodySize is the body limit when Options.MaxBodySize is 0.
const DefaultMaxBodySize = 1 << 20

// DefaultMaxCount is the instance limit per submission when
// Options.MaxCount is 0.
const DefaultMaxCount = 10_000

// DefaultPageSize is how many instances GET /v1/instances answers when the
// request gives no limit and Options.PageSize is 0.
const DefaultPageSize = 1000

// MaxPageSize is the largest limit GET /v1/instances accepts.
const MaxPageSize = 10_000

// Options configures a Server.
type Options struct {
	// MaxBodySize caps request bodies in bytes; 0 means DefaultMaxBodySize.
	MaxBodySize int64
	// MaxCount caps the instances one submission (a request's count, or
	// the sum of a group's counts) or plan may ask for; 0 means
	// DefaultMaxCount. It keeps one small body from costing the server
	// minutes of work and a response of hundreds of megabytes.
	MaxCount int
	// PageSize is how many instances GET /v1/instances answers when the
	// request gives no limit; 0 means DefaultPageSize, and it is at most
	// MaxPageSize.
	PageSize int
	// Logger receives request errors; nil means slog.Default().
	Logger *slog.Logger

	// Tokens authenticates every route but GET /v1/health, and keeps the
	// tokens /v1/tokens manages. Without it every other route answers 401.
	Tokens *auth.Tokens
	// AuditLog receives one record per mutating call; nil means Logger.
	AuditLog *slog.Logger
	// LoopbackOnly answers only requests whose Host names the loopback
	// interface (localhost, 127.0.0.0/8, ::1): a server listening on
	// loopback is then out of reach of DNS-rebinding pages.
	LoopbackOnly bool
	// AllowedOrigins are the values of an Origin header that are served;
	// a request with any other Origin (a browser's cross-site request) is
	// refused. Empty: every request with an Origin is refused.
	AllowedOrigins []string
	// Plugins lists the drivers served by the configured plugins, for
	// GET /v1/drivers; nil means none.
	Plugins func() []DriverInfo
	// Rate is the requests per second one token may make (0:
	// DefaultRate; negative: no limit), Burst how many at once (0:
	// DefaultBurst or Rate, whichever is larger).
	Rate  float64
	Burst int
	// MaxStreams is how many log, stats, event and preload streams one
	// token may hold open (0: DefaultStreams); the server holds at most 8
	// times it.
	MaxStreams int
	// WriteTimeout is the HTTP server's write timeout, the deadline of
	// every answer (0: DefaultWriteTimeout). A stop whose grace it cannot
	// wait out (LongGrace) is answered once stored and carried out after.
	WriteTimeout time.Duration
	// Leader, on a server that does not lead, takes the reads its
	// read-only plane leaves to the leader: the logs and stats of an
	// instance whose back-end only the leader reads
	// (control.Plane.ReadsBackend), and a GET of one instance whose copy
	// is not the store's record now (control.Plane.Current) or that the
	// copy does not hold. A follower forwards them there. nil: the
	// plane's error (control.ErrReadOnly) answers them, and the copy the
	// GETs.
	Leader http.Handler
}

// DefaultWriteTimeout is the write timeout Options.WriteTimeout stands for
// when zero: the server's default (config.DefaultWriteTimeout).
const DefaultWriteTimeout = 60 * time.Second

// LongGrace reports whether a stop or restart with grace is longer than
// an answer due within writeTimeout (0: DefaultWriteTimeout) can wait:
// more than half of it, the other half being the back-end's
// (CallTimeout). Such a stop is answered 202 once stored, the instance
// stopping, and carried out by the reconciler (control.Plane.StopLater,
// RestartLater): a client is never left with a timeout while the stop
// goes on, or does not.
func LongGrace(grace, writeTimeout time.Duration) bool {
	if writeTimeout <= 0 {
		writeTimeout = DefaultWriteTimeout
	}
	return grace > writeTimeout/2
}

// Server serves the API over a plane. It is an http.Handler.
type Server struct {
	plane        *control.Plane
	log          *slog.Logger
	auditLog     *slog.Logger
	tokens       *auth.Tokens
	guard        *guard
	loopbackOnly bool
	origins      []string
	plugins      func() []DriverInfo
	maxBody      int64
	maxCount     int
	pageSize     int
	writeTimeout time.Duration
	leader       http.Handler
	mux          *http.ServeMux

	routeList []Route

	closeOnce sync.Once
	closing   chan struct{} // closed by CloseStreams
}

// New returns the API server for plane.
func New(plane *control.Plane, opts Options) *Server {
	s := &Server{plane: plane, log: opts.Logger, maxBody: opts.MaxBodySize, maxCount: opts.MaxCount, pageSize: opts.PageSize, writeTimeout: opts.WriteTimeout, mux: http.NewServeMux(), closing: make(chan struct{}),
		auditLog: opts.AuditLog, tokens: opts.Tokens, guard: newGuard(opts), loopbackOnly: opts.LoopbackOnly, origins: slices.Clone(opts.AllowedOrigins), plugins: opts.Plugins, leader: opts.Leader}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.auditLog == nil {
		s.auditLog = s.log
	}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodySize
	}
	if s.maxCount <= 0 {
		s.maxCount = DefaultMaxCount
	}
	if s.pageSize <= 0 {
		s.pageSize = DefaultPageSize
	}
	s.pageSize = min(s.pageSize, MaxPageSize)
	s.routes()
	return s
}

// Route is one route of the API and the permission it needs.
type Route struct {
	Pattern    string // "METHOD /path/{param}"
	Permission auth.Permission
}

// Routes lists every route with its permission, as registered.
func (s *Server) Routes() []Route { return slices.Clone(s.routeList) }

// CloseStreams ends every open stream (logs, events, preload progress) so
// that a graceful shutdown is not held up by followers; requests in flight
// finish normally.
func (s *Server) CloseStreams() { s.closeOnce.Do(func() { close(s.closing) }) }

func (s *Server) routes() {
	// Each route names the permission it needs (see guard.go).
	h := func(pattern string, perm auth.Permission, fn func(http.ResponseWriter, *http.Request) error) {
		s.mux.Handle(pattern, handler{s, perm, fn})
		s.routeList = append(s.routeList, Route{Pattern: pattern, Permission: perm})
	}
	h("POST /v1/requests", auth.Operate, s.submit)
	h("POST /v1/groups", auth.Operate, s.submitGroup)
	h("GET /v1/groups/{id}", auth.Read, s.group)
	h("POST /v1/plan", auth.Read, s.plan)
	h("GET /v1/instances", auth.Read, s.instances)
	h("GET /v1/instances/{ref}", auth.Read, s.instance)
	h("DELETE /v1/instances/{ref}", auth.Operate, s.delete)
	h("POST /v1/instances/{ref}/stop", auth.Operate, s.stop)
	h("POST /v1/instances/{ref}/start", auth.Operate, s.start)
	h("POST /v1/instances/{ref}/restart", auth.Operate, s.restart)
	h("POST /v1/instances/{ref}/kill", auth.Operate, s.kill)
	h("POST /v1/instances/{ref}/resize", auth.Operate, s.resize)
	h("POST /v1/instances/{ref}/rename", auth.Operate, s.rename)
	h("POST /v1/instances/{ref}/suspend", auth.Operate, s.suspend)
	h("POST /v1/instances/{ref}/resume", auth.Operate, s.resume)
	h("POST /v1/instances/{ref}/hold", auth.Operate, s.hold)
	h("GET /v1/instances/{ref}/logs", auth.Read, s.logs)
	h("GET /v1/instances/{ref}/stats", auth.Read, s.stats)
	h("POST /v1/instances/{ref}/attach", auth.Operate, s.attach)
	h("POST /v1/instances/{ref}/exec", auth.Operate, s.exec)
	h("GET /v1/events", auth.Read, s.events)
	h("GET /v1/nodes", auth.Read, s.nodes)
	h("GET /v1/advice", auth.Read, s.advice)
	h("POST /v1/rebalance/plan", auth.Operate, s.rebalancePlan)
	h("POST /v1/rebalance/apply", auth.Operate, s.rebalanceApply)
	h("GET /v1/rebalance", auth.Operate, s.rebalanceStatus)
	h("GET /v1/providers", auth.Read, s.providers)
	h("GET /v1/scheduler", auth.Read, s.scheduler)
	h("GET /v1/images", auth.Read, s.images)
	h("POST /v1/images/preload", auth.Admin, s.preload)
	h("GET /v1/quotas", auth.Read, s.quotas)
	h("GET /v1/drivers", auth.Read, s.drivers)
	h("GET /v1/version", auth.Read, s.version)
	h("GET /v1/whoami", auth.Read, s.whoami)
	h("GET /v1/tokens", auth.Admin, s.listTokens)
	h("POST /v1/tokens", auth.Admin, s.createToken)
	h("DELETE /v1/tokens/{ref}", auth.Admin, s.revokeToken)
	h("GET /v1/doctor", auth.Admin, s.doctor)
	h("GET /v1/health", auth.Public, func(w http.ResponseWriter, r *http.Request) error {
		return writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
}

// ServeHTTP routes r. Requests the mux has no handler for (404, 405) are
// answered in the API's error shape too.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if e := s.admit(r); e != nil {
		writeError(w, e)
		return
	}
	if _, pattern := s.mux.Handler(r); pattern == "" {
		rec := &statusRecorder{header: http.Header{}}
		s.mux.ServeHTTP(rec, r)
		e := &Error{Code: CodeNotFound, Status: http.StatusNotFound, Message: "no such endpoint: " + r.Method + " " + r.URL.Path}
		if rec.status == http.StatusMethodNotAllowed {
			e = &Error{Code: CodeMethodNotAllowed, Status: rec.status, Message: "method " + r.Method + " not allowed on " + r.URL.Path}
			w.Header().Set("Allow", rec.header.Get("Allow"))
		}
		writeError(w, e)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// statusRecorder captures the status the mux would have written.
type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header         { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *statusRecorder) WriteHeader(status int)      { r.status = status }

type handler struct {
	s    *Server
	perm auth.Permission
	fn   func(http.ResponseWriter, *http.Request) error
}

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cw := &committedWriter{ResponseWriter: w}
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			h.s.log.Error("api: panic", "method", r.Method, "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
			if !cw.committed {
				writeError(cw, &Error{Code: CodeInternal, Status: http.StatusInternalServerError, Message: fmt.Sprint("internal error: ", p)})
			}
		}
	}()
	r, err := h.guarded(cw, r)
	if err == nil {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			defer func() { h.s.audit(r, cw.status(), err) }()
		}
		err = h.fn(cw, r)
	}
	if err == nil {
		return
	}
	e := toError(err)
	if e.Status >= 500 {
		h.s.log.Error("api: request failed", "method", r.Method, "path", r.URL.Path, "error", err)
	}
	if cw.committed {
		// A stream already started; stream handlers report their own errors
		// in-band, so this is a write failure to a gone client.
		return
	}
	writeError(cw, e)
}

// committedWriter remembers whether the status line was sent.
type committedWriter struct {
	http.ResponseWriter
	committed bool
	code      int
}

func (w *committedWriter) WriteHeader(code int) {
	if !w.committed {
		w.code = code
	}
	w.committed = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *committedWriter) Write(b []byte) (int, error) {
	if !w.committed {
		w.code = http.StatusOK
	}
	w.committed = true
	return w.ResponseWriter.Write(b)
}

// status is the status written so far (0: none yet).
func (w *committedWriter) status() int { return w.code }

// Unwrap lets http.ResponseController reach the flusher.
func (w *committedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func writeError(w http.ResponseWriter, e *Error) {
	status := e.Status
	if status == 0 {
		status = http.StatusInternalServerError
	}
	_ = writeJSON(w, status, envelope{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := driver.MarshalOutput(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}

// namespace returns the namespace a submission lands in: the query's
// namespace when the caller's token has it, else the token's first.
func namespace(r *http.Request) (string, error) {
	q := r.URL.Query()
	if err := onlyParams(q, "namespace"); err != nil {
		return "", err
	}
	if len(q["namespace"]) > 1 {
		return "", &driver.FieldError{Path: "namespace", Reason: "given more than once: give it once"}
	}
	return caller(r).Namespace(q.Get("namespace"))
}

func (s *Server) submit(w http.ResponseWriter, r *http.Request) error {
	ns, err := namespace(r)
	if err != nil {
		return err
	}
	var req scheduler.Request
	if err := s.decodeRequest(w, r, &req); err != nil {
		return err
	}
	if req.ID != "" {
		chosen := req.ID
		if req.ID, err = control.ChosenID(caller(r), ns, chosen, "id"); err != nil {
			return err
		}
		if req.Name == "" && req.ID != chosen {
			req.Name = chosen // the instances are named as the client named the request
		}
	}
	ans, err := s.plane.Submit(r.Context(), req, ns)
	if err != nil {
		return err
	}
	redactPlaced(ans.Instances)
	return writeJSON(w, http.StatusCreated, ans)
}

func (s *Server) submitGroup(w http.ResponseWriter, r *http.Request) error {
	ns, err := namespace(r)
	if err != nil {
		return err
	}
	var g scheduler.Group
	if err := decodeBody(w, r, s.maxBody, &g); err != nil {
		return err
	}
	if err := g.Validate(); err != nil {
		return err
	}
	if g.ID, err = control.ChosenID(caller(r), ns, g.ID, "id"); err != nil {
		return err
	}
	total := 0
	for _, svc := range g.Services {
		total += svc.N()
	}
	if total > s.maxCount {
		return &driver.FieldError{Path: "services", Reason: fmt.Sprintf("%d instances in all: this server takes at most %d per submission", total, s.maxCount)}
	}
	ans, err := s.plane.SubmitGroup(r.Context(), g, ns)
	if err != nil {
		return err
	}
	redactPlaced(ans.Instances)
	return writeJSON(w, http.StatusCreated, ans)
}

func (s *Server) group(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if c := caller(r); !c.All() {
		// A group is seen by those who see its instances; its id is the
		// stored one or the one chosen in one of the caller's namespaces.
		seen := false
		for _, cand := range append([]string{id}, chosenIDs(c, id)...) {
			members, err := s.plane.Instances(r.Context(), control.Filter{Group: cand, All: true, Limit: 1})
			if err != nil {
				return err
			}
			if len(members) > 0 && c.Authorize(auth.Read, members[0].Owner) == nil {
				id, seen = cand, true
				break
			}
		}
		if !seen {
			return driver.Errorf(driver.ErrNotFound, "group %q", id)
		}
	}
	st, err := s.plane.Group(r.Context(), id)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, st)
}

// chosenIDs is what id is stored as when c chooses it in each of its
// namespaces (control.ChosenID), those that differ from id.
func chosenIDs(c auth.Identity, id string) []string {
	var out []string
	for _, ns := range c.Namespaces {
		if q, err := control.ChosenID(c, ns, id, "id"); err == nil && q != id {
			out = append(out, q)
		}
	}
	return out
}

func (s *Server) plan(w http.ResponseWriter, r *http.Request) error {
	var req scheduler.Request
	if err := s.decodeRequest(w, r, &req); err != nil {
		return err
	}
	ans, err := s.plane.Plan(r.Context(), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ans)
}

// decodeRequest decodes and validates a request body, and applies the
// server's count limit.
func (s *Server) decodeRequest(w http.ResponseWriter, r *http.Request, req *scheduler.Request) error {
	if err := decodeBody(w, r, s.maxBody, req); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return err
	}
	if req.N() > s.maxCount {
		return &driver.FieldError{Path: "count", Reason: fmt.Sprintf("%d: this server takes at most %d instances per submission", req.Count, s.maxCount)}
	}
	return nil
}

// filterOf reads an instance filter from the query: provider, node, owner,
// pool, group, request, name, phase (comma-separated or repeated), all,
// and the page: limit (1 to MaxPageSize, pageSize when absent) and after.
func filterOf(r *http.Request, pageSize int) (control.Filter, error) {
	q := r.URL.Query()
	if err := onlyParams(q, "provider", "node", "namespace", "pool", "group", "request", "name", "phase", "all", "limit", "after"); err != nil {
		return control.Filter{}, err
	}
	f := control.Filter{
		Provider: q.Get("provider"), Node: q.Get("node"), Owner: q.Get("namespace"), Pool: q.Get("pool"),
		Group: q.Get("group"), Request: q.Get("request"), Name: q.Get("name"),
		Limit: pageSize, After: q.Get("after"),
	}
	for _, k := range []string{"limit", "after"} {
		if len(q[k]) > 1 {
			return f, &driver.FieldError{Path: k, Reason: fmt.Sprintf("given %d times: give it once", len(q[k]))}
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageSize {
			return f, &driver.FieldError{Path: "limit", Reason: fmt.Sprintf("%q: want an integer from 1 to %d", v, MaxPageSize)}
		}
		f.Limit = n
	}
	for _, v := range q["phase"] {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			ph := control.Phase(p)
			if !ph.Valid() {
				return f, &driver.FieldError{Path: "phase", Reason: fmt.Sprintf("%q is not a phase", p)}
			}
			f.Phases = append(f.Phases, ph)
		}
	}
	var err error
	f.All, err = boolParam(q.Get("all"), "all")
	return f, err
}

func onlyParams(q map[string][]string, known ...string) error {
	for k := range q {
		ok := false
		for _, n := range known {
			ok = ok || k == n
		}
		if !ok {
			return &driver.FieldError{Path: k, Reason: "unknown query parameter; known: " + strings.Join(known, ", ")}
		}
	}
	return nil
}

func boolParam(v, name string) (bool, error) {
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, &driver.FieldError{Path: name, Reason: fmt.Sprintf("%q: want true or false", v)}
	}
	return b, nil
}

func durationParam(v, name string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, &driver.FieldError{Path: name, Reason: fmt.Sprintf("%q: want a duration such as 10s", v)}
	}
	return d, nil
}

func intParam(v, name string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, &driver.FieldError{Path: name, Reason: fmt.Sprintf("%q: want a non-negative integer", v)}
	}
	return n, nil
}

// instances answers one page of instances, sorted by id. A full page may
// have more after it: its Link header (RFC 8288) names the next page, the
// same query with after set to the page's last id.
func (s *Server) instances(w http.ResponseWriter, r *http.Request) error {
	f, err := filterOf(r, s.pageSize)
	if err != nil {
		return err
	}
	if c := caller(r); !c.All() {
		if f.Owner != "" && c.Authorize(auth.Read, f.Owner) != nil {
			return writeJSON(w, http.StatusOK, []control.Instance{})
		}
		if f.Owner == "" {
			f.Owners = c.Namespaces
		}
	}
	list, err := s.plane.Instances(r.Context(), f)
	if err != nil {
		return err
	}
	if list == nil {
		list = []control.Instance{}
	}
	for i := range list {
		list[i] = redacted(list[i])
	}
	if len(list) == f.Limit {
		q := r.URL.Query()
		q.Set("after", list[len(list)-1].ID)
		w.Header().Set("Link", fmt.Sprintf("<%s?%s>; rel=\"next\"", r.URL.EscapedPath(), q.Encode()))
	}
	return writeJSON(w, http.StatusOK, list)
}

// advice answers the right sizes of the running instances the caller sees
// (the instance filters of GET /v1/instances but paging and phase): at
// most limit of them (default the page size), those that give back the
// most first, with the sums over all.
func (s *Server) advice(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := onlyParams(q, "provider", "node", "namespace", "pool", "group", "request", "name", "limit"); err != nil {
		return err
	}
	f := control.Filter{Provider: q.Get("provider"), Node: q.Get("node"), Owner: q.Get("namespace"), Pool: q.Get("pool"),
		Group: q.Get("group"), Request: q.Get("request"), Name: q.Get("name"), Limit: s.pageSize}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageSize {
			return &driver.FieldError{Path: "limit", Reason: fmt.Sprintf("%q: want an integer from 1 to %d", v, MaxPageSize)}
		}
		f.Limit = n
	}
	if c := caller(r); !c.All() {
		if f.Owner != "" && c.Authorize(auth.Read, f.Owner) != nil {
			return writeJSON(w, http.StatusOK, control.AdviceAnswer{Instances: []control.InstanceAdvice{}, Groups: []control.GroupAdvice{}})
		}
		if f.Owner == "" {
			f.Owners = c.Namespaces
		}
	}
	ans, err := s.plane.Advice(r.Context(), f, scheduler.AdviceOptions{})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ans)
}

func (s *Server) instance(w http.ResponseWriter, r *http.Request) error {
	in, err := s.visible(r)
	if s.leader != nil && (err == nil || errors.Is(err, driver.ErrNotFound)) {
		// A follower answers from its copy only the record the store
		// holds now: a client reads what it just changed through the
		// leader, or the leader answers (it may hold what the copy
		// does not yet).
		current := false
		if err == nil {
			current, _ = s.plane.Current(r.Context(), in)
		}
		if !current {
			s.leader.ServeHTTP(w, r)
			return nil
		}
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, redacted(in))
}

// afterChange answers a change of instance id with the instance as it is
// now.
func (s *Server) afterChange(w http.ResponseWriter, r *http.Request, id string, status int) error {
	in, err := s.plane.Instance(r.Context(), id)
	if err != nil {
		return err
	}
	return writeJSON(w, status, redacted(in))
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) error {
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if err := s.plane.Delete(r.Context(), in.ID); err != nil {
		return err
	}
	return s.afterChange(w, r, in.ID, http.StatusAccepted)
}

func (s *Server) stop(w http.ResponseWriter, r *http.Request) error {
	if err := onlyParams(r.URL.Query(), "grace"); err != nil {
		return err
	}
	grace, err := durationParam(r.URL.Query().Get("grace"), "grace")
	if err != nil {
		return err
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	stop := s.plane.Stop
	if LongGrace(grace, s.writeTimeout) {
		stop = s.plane.StopLater
	}
	if err := stop(r.Context(), in.ID, grace); err != nil {
		return err
	}
	return s.afterChange(w, r, in.ID, http.StatusAccepted)
}

func (s *Server) start(w http.ResponseWriter, r *http.Request) error {
	if err := onlyParams(r.URL.Query()); err != nil {
		return err
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if err := s.plane.Start(r.Context(), in.ID); err != nil {
		return err
	}
	return s.afterChange(w, r, in.ID, http.StatusAccepted)
}

func (s *Server) restart(w http.ResponseWriter, r *http.Request) error {
	if err := onlyParams(r.URL.Query(), "grace"); err != nil {
		return err
	}
	grace, err := durationParam(r.URL.Query().Get("grace"), "grace")
	if err != nil {
		return err
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	restart := s.plane.Restart
	if LongGrace(grace, s.writeTimeout) {
		restart = s.plane.RestartLater
	}
	if err := restart(r.Context(), in.ID, grace); err != nil {
		return err
	}
	return s.afterChange(w, r, in.ID, http.StatusAccepted)
}

// DefaultSignal is the signal POST /v1/instances/{ref}/kill sends when the
// request names none.
const DefaultSignal = "KILL"

func (s *Server) kill(w http.ResponseWriter, r *http.Request) error {
	if err := onlyParams(r.URL.Query(), "signal"); err != nil {
		return err
	}
	sig := r.URL.Query().Get("signal")
	if sig == "" {
		sig = DefaultSignal
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if err := s.plane.Kill(r.Context(), in.ID, sig); err != nil {
		return err
	}
	return s.afterChange(w, r, in.ID, http.StatusAccepted)
}

func (s *Server) resize(w http.ResponseWriter, r *http.Request) error {
	var res driver.Resources
	if err := decodeBody(w, r, s.maxBody, &res); err != nil {
		return err
	}
	if err := driver.ValidateResources("", res); err != nil {
		return err
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if err := s.plane.Resize(r.Context(), in.ID, res); err != nil {
		return err
	}
	return s.afterChange(w, r, in.ID, http.StatusAccepted)
}

// RenameRequest is the body of POST /v1/instances/{ref}/rename.
type RenameRequest struct {
	Name string `json:"name"`
}

// rename renames an instance in its namespace, and its back-end resource
// with it (Plane.Rename).
func (s *Server) rename(w http.ResponseWriter, r *http.Request) error {
	var req RenameRequest
	if err := decodeBody(w, r, s.maxBody, &req); err != nil {
		return err
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if err := s.plane.Rename(r.Context(), in.ID, req.Name, nil); err != nil {
		return err
	}
	return s.afterChange(w, r, in.ID, http.StatusOK)
}

func (s *Server) suspend(w http.ResponseWriter, r *http.Request) error {
	if err := onlyParams(r.URL.Query()); err != nil {
		return err
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if err := s.plane.Suspend(r.Context(), in.ID); err != nil {
		return err
	}
	return s.afterChange(w, r, in.ID, http.StatusAccepted)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) error {
	if err := onlyParams(r.URL.Query()); err != nil {
		return err
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if err := s.plane.Resume(r.Context(), in.ID); err != nil {
		return err
	}
	return s.afterChange(w, r, in.ID, http.StatusAccepted)
}

// MaxHold is the longest hold POST /v1/instances/{ref}/hold takes.
const MaxHold = 30 * 24 * time.Hour

// HoldRequest is the body of POST /v1/instances/{ref}/hold.
type HoldRequest struct {
	// For is how long the instance is kept from now before it is deleted:
	// a Go duration ("2h", "90m"), more than 0 and at most MaxHold.
	For string `json:"for"`
}

// duration checks For and returns it.
func (h HoldRequest) duration() (time.Duration, error) {
	if h.For == "" {
		return 0, &driver.FieldError{Path: "for", Reason: "required: how long to hold the instance, such as 2h"}
	}
	d, err := time.ParseDuration(h.For)
	switch {
	case err != nil:
		return 0, &driver.FieldError{Path: "for", Reason: fmt.Sprintf("%q: want a duration such as 2h or 90m", h.For)}
	case d <= 0:
		return 0, &driver.FieldError{Path: "for", Reason: fmt.Sprintf("%q: want more than 0", h.For)}
	case d > MaxHold:
		return 0, &driver.FieldError{Path: "for", Reason: fmt.Sprintf("%q: want at most %s (30 days)", h.For, MaxHold)}
	}
	return d, nil
}

func (s *Server) hold(w http.ResponseWriter, r *http.Request) error {
	if err := onlyParams(r.URL.Query()); err != nil {
		return err
	}
	var req HoldRequest
	if err := decodeBody(w, r, s.maxBody, &req); err != nil {
		return err
	}
	d, err := req.duration()
	if err != nil {
		return err
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if err := s.plane.Hold(r.Context(), in.ID, time.Now().Add(d)); err != nil {
		return err
	}
	return s.afterChange(w, r, in.ID, http.StatusAccepted)
}

// LogFrame is one line of a logs stream: a chunk of one stream's output, or
// the error that ended the stream.
type LogFrame struct {
	// Stream is "stdout" or "stderr".
	Stream string `json:"stream,omitempty"`
	Data   string `json:"data,omitempty"`
	Error  *Error `json:"error,omitempty"`
}

// frameWriter writes NDJSON frames to a response, one per Write, flushing
// each so that followers see output at once. It is safe for concurrent use.
type frameWriter struct {
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newFrameWriter(w http.ResponseWriter) *frameWriter {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	fw := &frameWriter{w: w, rc: http.NewResponseController(w)}
	_ = fw.rc.Flush()
	return fw
}

func (f *frameWriter) frame(v any) error {
	b, err := driver.MarshalOutput(v)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.w.Write(append(b, '\n')); err != nil {
		return err
	}
	return f.rc.Flush()
}

type streamWriter struct {
	f    *frameWriter
	name string
}

func (s streamWriter) Write(p []byte) (int, error) {
	if err := s.f.frame(LogFrame{Stream: s.name, Data: string(p)}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// streamContext derives the context of a long stream: it ends with the
// request or when the server closes its streams. It counts the stream
// against the caller's open streams (refused past the cap) and lifts the
// server's write deadline, which bounds every other response.
func (s *Server) streamContext(w http.ResponseWriter, r *http.Request) (context.Context, context.CancelFunc, error) {
	release, err := s.guard.openStream(caller(r).Accessor)
	if err != nil {
		return nil, nil, err
	}
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	ctx, cancel := context.WithCancel(r.Context())
	context.AfterFunc(ctx, release)
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel, nil
}

func (s *Server) logs(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := onlyParams(q, "follow", "tail", "stdout", "stderr"); err != nil {
		return err
	}
	follow, err := boolParam(q.Get("follow"), "follow")
	if err != nil {
		return err
	}
	tail, err := intParam(q.Get("tail"), "tail")
	if err != nil {
		return err
	}
	opts := driver.LogOptions{Stdout: true, Stderr: true, Tail: int(tail), Follow: follow}
	if q.Has("stdout") || q.Has("stderr") {
		if opts.Stdout, err = boolParam(q.Get("stdout"), "stdout"); err != nil {
			return err
		}
		if opts.Stderr, err = boolParam(q.Get("stderr"), "stderr"); err != nil {
			return err
		}
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if s.toLeader(w, r, in.ID) {
		return nil
	}
	ctx, cancel, err := s.streamContext(w, r)
	if err != nil {
		return err
	}
	defer cancel()
	fw := newFrameWriter(w)
	err = s.plane.Logs(ctx, in.ID, opts, streamWriter{fw, "stdout"}, streamWriter{fw, "stderr"})
	if err != nil && ctx.Err() == nil {
		return fw.frame(LogFrame{Error: toError(err)})
	}
	return nil
}

// toLeader hands r to Options.Leader when the plane does not read
// instance id's back-end itself, and reports whether it did.
func (s *Server) toLeader(w http.ResponseWriter, r *http.Request, id string) bool {
	if s.leader == nil || s.plane.ReadsBackend(id) {
		return false
	}
	s.leader.ServeHTTP(w, r)
	return true
}

// StatsInterval is how often GET /v1/instances/{ref}/stats measures.
const StatsInterval = time.Second

// Stats is one measurement of an instance's usage.
type Stats struct {
	ID    string        `json:"id"`
	Name  string        `json:"name,omitempty"`
	Phase control.Phase `json:"phase"`
	// Time is when the back-end measured.
	Time time.Time `json:"time"`
	// CPUs is the cpus used, averaged over the back-end's sampling window
	// (0.5 is half a cpu's time).
	CPUs driver.MilliCPU `json:"cpus"`
	// MemoryBytes is the memory resident now.
	MemoryBytes int64 `json:"memory_bytes"`
	// CPULimit and MemoryLimitBytes are the instance's limits; 0 means
	// none.
	CPULimit         driver.MilliCPU `json:"cpu_limit,omitempty"`
	MemoryLimitBytes int64           `json:"memory_limit_bytes,omitempty"`
}

// StatsFrame is one line of a stats stream: a measurement, or the error
// that ended the stream.
type StatsFrame struct {
	Stats *Stats `json:"stats,omitempty"`
	Error *Error `json:"error,omitempty"`
}

// measure measures instance in once.
func (s *Server) measure(ctx context.Context, in control.Instance) (*Stats, error) {
	u, err := s.plane.Usage(ctx, in.ID)
	if err != nil {
		return nil, err
	}
	if cur, err := s.plane.Instance(ctx, in.ID); err == nil {
		in = cur
	}
	st := &Stats{ID: in.ID, Name: in.Name, Phase: in.Phase, Time: u.Time.UTC(), CPUs: u.CPU, MemoryBytes: int64(u.Memory)}
	if in.Spec != nil {
		st.CPULimit, st.MemoryLimitBytes = in.Spec.CPU, int64(in.Spec.Memory)
	}
	return st, nil
}

// stats answers one measurement with stream=false; otherwise it streams one
// StatsFrame every StatsInterval until the client leaves, the server closes
// its streams or a measurement fails (its error is the last frame). A
// failure of the first measurement (a back-end that cannot measure, an
// instance with nothing to measure) is answered as any error is.
func (s *Server) stats(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := onlyParams(q, "stream"); err != nil {
		return err
	}
	stream := true
	if v := q.Get("stream"); v != "" {
		var err error
		if stream, err = boolParam(v, "stream"); err != nil {
			return err
		}
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if s.toLeader(w, r, in.ID) {
		return nil
	}
	first, err := s.measure(r.Context(), in)
	if err != nil {
		return err
	}
	if !stream {
		return writeJSON(w, http.StatusOK, first)
	}
	ctx, cancel, err := s.streamContext(w, r)
	if err != nil {
		return err
	}
	defer cancel()
	fw := newFrameWriter(w)
	t := time.NewTicker(StatsInterval)
	defer t.Stop()
	for st := first; ; {
		if err := fw.frame(StatsFrame{Stats: st}); err != nil {
			return nil // the client left
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if st, err = s.measure(ctx, in); err != nil {
			if ctx.Err() == nil {
				_ = fw.frame(StatsFrame{Error: toError(err)})
			}
			return nil
		}
	}
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := onlyParams(q, "since"); err != nil {
		return err
	}
	since, err := intParam(q.Get("since"), "since")
	if err != nil {
		return err
	}
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		if since, err = intParam(id, "Last-Event-ID"); err != nil {
			return err
		}
	}
	ctx, cancel, err := s.streamContext(w, r)
	if err != nil {
		return err
	}
	defer cancel()
	c := caller(r)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	var mu sync.Mutex
	var writeErr error
	send := func(id, event string, v any) {
		b, err := driver.MarshalOutput(v)
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if writeErr != nil {
			return
		}
		if id != "" {
			_, writeErr = fmt.Fprintf(w, "id: %s\n", id)
		}
		if writeErr == nil {
			_, writeErr = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
		}
		if writeErr == nil {
			writeErr = rc.Flush()
		}
		if writeErr != nil {
			cancel()
		}
	}
	err = s.plane.Events(ctx, since, func(ev control.Event) {
		if ev.Instance != nil {
			if c.Authorize(auth.Read, ev.Instance.Owner) != nil {
				return
			}
			in := redacted(*ev.Instance)
			ev.Instance = &in
		}
		send(strconv.FormatInt(ev.Revision, 10), string(ev.Kind), ev)
	})
	if err != nil && ctx.Err() == nil {
		send("", "error", envelope{Error: toError(err)})
	}
	return nil
}

func (s *Server) nodes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := onlyParams(q, "provider"); err != nil {
		return err
	}
	list, err := s.plane.Nodes(r.Context())
	if err != nil {
		return err
	}
	out := make([]control.NodeView, 0, len(list))
	for _, n := range list {
		if p := q.Get("provider"); p == "" || n.Provider == p {
			out = append(out, n)
		}
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) providers(w http.ResponseWriter, r *http.Request) error {
	list, err := s.plane.Providers(r.Context())
	if err != nil {
		return err
	}
	if list == nil {
		list = []control.ProviderView{}
	}
	return writeJSON(w, http.StatusOK, list)
}

func (s *Server) scheduler(w http.ResponseWriter, r *http.Request) error {
	st, err := s.plane.Scheduler(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, st)
}

func (s *Server) images(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := onlyParams(q, "provider", "node"); err != nil {
		return err
	}
	if q.Get("provider") == "" {
		return &driver.FieldError{Path: "provider", Reason: "required"}
	}
	list, err := s.plane.Images(r.Context(), q.Get("provider"), q.Get("node"))
	if err != nil {
		return err
	}
	if list == nil {
		list = []driver.Image{}
	}
	return writeJSON(w, http.StatusOK, list)
}

// PreloadRequest is the body of POST /v1/images/preload.
type PreloadRequest struct {
	Provider string `json:"provider"`
	Image    string `json:"image"`
	// Nodes are the nodes to preload; empty means all.
	Nodes []string `json:"nodes,omitempty"`
}

// PreloadFrame is one line of a preload stream: progress, the end (Done) or
// the error that ended it.
type PreloadFrame struct {
	Progress *driver.PreloadProgress `json:"progress,omitempty"`
	Done     bool                    `json:"done,omitempty"`
	Error    *Error                  `json:"error,omitempty"`
}

func (s *Server) preload(w http.ResponseWriter, r *http.Request) error {
	var req PreloadRequest
	if err := decodeBody(w, r, s.maxBody, &req); err != nil {
		return err
	}
	var es driver.FieldErrors
	if req.Provider == "" {
		es.Add("provider", "required")
	}
	if req.Image == "" {
		es.Add("image", "required")
	}
	if err := es.Err(); err != nil {
		return err
	}
	ctx, cancel, err := s.streamContext(w, r)
	if err != nil {
		return err
	}
	defer cancel()
	fw := newFrameWriter(w)
	err = s.plane.Preload(ctx, req.Provider, req.Image, req.Nodes, func(p driver.PreloadProgress) {
		_ = fw.frame(PreloadFrame{Progress: &p})
	})
	if err != nil {
		return fw.frame(PreloadFrame{Error: toError(err)})
	}
	return fw.frame(PreloadFrame{Done: true})
}

func (s *Server) quotas(w http.ResponseWriter, r *http.Request) error {
	list, err := s.plane.Quotas(r.Context())
	if err != nil {
		return err
	}
	c := caller(r)
	// A namespace's quota is seen by those who see the namespace; the
	// others (per provider or pool) by everyone.
	list = slices.DeleteFunc(list, func(q control.QuotaUse) bool { return q.Owner != "" && c.Authorize(auth.Read, q.Owner) != nil })
	if list == nil {
		list = []control.QuotaUse{}
	}
	return writeJSON(w, http.StatusOK, list)
}

// Doctor is the answer of GET /v1/doctor: what the server found wrong
// with its data.
type Doctor struct {
	// Quarantined are the stored records moved aside when a plane
	// started, as they could not be read (control.PrefixQuarantine).
	Quarantined []control.Quarantined `json:"quarantined"`
}

// doctor answers what is wrong with the server's data: admin only, as the
// records moved aside are anyone's.
func (s *Server) doctor(w http.ResponseWriter, r *http.Request) error {
	list, err := s.plane.Quarantined(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, Doctor{Quarantined: list})
}

// DriverInfo describes a registered driver, or the driver a configured
// plugin serves (then Provider, Plugin and Version are set).
type DriverInfo struct {
	Name    string          `json:"name"`
	Summary string          `json:"summary,omitempty"`
	Options []driver.Option `json:"options"`
	// Provider is the provider the plugin is configured for.
	Provider string `json:"provider,omitempty"`
	// Plugin is the plugin binary's path.
	Plugin string `json:"plugin,omitempty"`
	// Version is what the plugin says its version is.
	Version string `json:"version,omitempty"`
}

// Drivers describes every registered driver, sorted by name.
func Drivers() []DriverInfo {
	var out []DriverInfo
	for _, name := range driver.Drivers() {
		def, err := driver.Lookup(name)
		if err != nil {
			continue
		}
		opts := def.Options()
		if opts == nil {
			opts = []driver.Option{}
		}
		out = append(out, DriverInfo{Name: def.Name, Summary: def.Summary, Options: opts})
	}
	return out
}

func (s *Server) drivers(w http.ResponseWriter, r *http.Request) error {
	list := Drivers()
	if s.plugins != nil {
		list = append(list, s.plugins()...)
	}
	if list == nil {
		list = []DriverInfo{}
	}
	return writeJSON(w, http.StatusOK, list)
}

var _ http.Handler = (*Server)(nil)
