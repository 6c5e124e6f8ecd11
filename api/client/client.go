// Package client is the Go client of Berth's REST API, used by the berth CLI
// and the tests. Errors from the server come back as *api.Error values,
// which match the driver vocabulary under errors.Is (driver.ErrNotFound,
// driver.ErrInvalid...) and yield a *driver.FieldError under errors.As when
// the server named a field.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// Client talks to one Berth server. It is safe for concurrent use.
type Client struct {
	// bases are the servers' URLs; cur is the one in use: a server that
	// cannot be dialled passes the request on to the next.
	bases     []string
	cur       atomic.Int32
	http      *http.Client
	token     string
	namespace string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client (default: a client without timeout,
// since streams are long; calls are bounded by their ctx).
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithToken sets the bearer token sent with every call.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithNamespace sets the namespace submissions land in (one of the
// token's); empty means the token's first.
func WithNamespace(ns string) Option { return func(c *Client) { c.namespace = ns } }

// New returns a client for the server at addr ("http://127.0.0.1:7480" or
// "127.0.0.1:7480"), or for the servers of a highly available cluster at
// several addresses separated by commas: a call goes to the one that
// answered last, and to the next when that one cannot be dialled (any
// server answers: followers pass requests on to the leader).
func New(addr string, opts ...Option) (*Client, error) {
	c := &Client{http: &http.Client{}}
	for _, a := range strings.Split(addr, ",") {
		a = strings.TrimSpace(a)
		if !strings.Contains(a, "://") {
			a = "http://" + a
		}
		u, err := url.Parse(a)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, &driver.FieldError{Path: "addr", Reason: fmt.Sprintf("%q: want http://host:port", a)}
		}
		c.bases = append(c.bases, strings.TrimRight(u.String(), "/"))
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Addr returns the base URL of the server in use.
func (c *Client) Addr() string { return c.base() }

func (c *Client) base() string { return c.bases[int(c.cur.Load())%len(c.bases)] }

func (c *Client) newRequest(ctx context.Context, method, path string, q url.Values, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	u := c.base() + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// do sends a request and, for a 2xx answer, returns the open response; any
// other status is decoded into an *api.Error.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body any) (*http.Response, error) {
	var resp *http.Response
	for tries := len(c.bases); ; tries-- {
		req, err := c.newRequest(ctx, method, path, q, body)
		if err != nil {
			return nil, err
		}
		at := c.cur.Load()
		resp, err = c.http.Do(req)
		if err == nil {
			break
		}
		err = transportError(method, path, err)
		if tries <= 1 || !errors.Is(err, driver.ErrRetryable) || ctx.Err() != nil {
			return nil, err
		}
		// Not dialled: the request never left; the next server takes it.
		c.cur.CompareAndSwap(at, at+1)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// transportError classifies a failed round trip: a failed dial certainly
// did nothing (driver.ErrRetryable); anything later may have reached the
// server, so the outcome is unknown (driver.ErrTimeout).
func transportError(method, path string, err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return fmt.Errorf("%w: %s %s: %w", driver.ErrRetryable, method, path, err)
	}
	return fmt.Errorf("%w: %s %s: %w", driver.ErrTimeout, method, path, err)
}

// decodeError reads the API's error shape from resp.
func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var env struct {
		Error *api.Error `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err != nil || env.Error == nil {
		return &api.Error{Status: resp.StatusCode, Code: api.CodeInternal,
			Message: fmt.Sprintf("server answered %s: %s", resp.Status, strings.TrimSpace(string(b)))}
	}
	env.Error.Status = resp.StatusCode
	return env.Error
}

// call sends a request and decodes a JSON answer into out (if not nil).
func (c *Client) call(ctx context.Context, method, path string, q url.Values, body, out any) error {
	resp, err := c.do(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := driver.DecodeOutput(jsontext.NewDecoder(resp.Body), out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}

// nsQuery is the query of a submission: its namespace, when set.
func (c *Client) nsQuery() url.Values {
	if c.namespace == "" {
		return nil
	}
	return url.Values{"namespace": {c.namespace}}
}

func ref(r string) string { return "/v1/instances/" + url.PathEscape(r) }

// Submit submits a request and returns Citadel's answer.
func (c *Client) Submit(ctx context.Context, req scheduler.Request) (*control.Answer, error) {
	var a control.Answer
	if err := c.call(ctx, http.MethodPost, "/v1/requests", c.nsQuery(), req, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// SubmitRaw submits a request body as given (for tools that pass JSON
// through) and returns the answer.
func (c *Client) SubmitRaw(ctx context.Context, body json.RawMessage) (*control.Answer, error) {
	var a control.Answer
	if err := c.call(ctx, http.MethodPost, "/v1/requests", c.nsQuery(), body, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// SubmitGroup submits a group.
func (c *Client) SubmitGroup(ctx context.Context, g scheduler.Group) (*control.GroupAnswer, error) {
	var a control.GroupAnswer
	if err := c.call(ctx, http.MethodPost, "/v1/groups", c.nsQuery(), g, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// Plan is a dry run of Submit.
func (c *Client) Plan(ctx context.Context, req scheduler.Request) (*control.PlanAnswer, error) {
	var a control.PlanAnswer
	if err := c.call(ctx, http.MethodPost, "/v1/plan", nil, req, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// Instances lists the instances matching f, sorted by id. It follows the
// server's pages until the last one, so it returns every match; when the
// caller sets f.Limit or f.After it returns that one page only.
func (c *Client) Instances(ctx context.Context, f control.Filter) ([]control.Instance, error) {
	if f.Limit != 0 || f.After != "" {
		list, _, err := c.InstancesPage(ctx, f)
		return list, err
	}
	var all []control.Instance
	for {
		list, next, err := c.InstancesPage(ctx, f)
		if err != nil {
			return nil, err
		}
		all = append(all, list...)
		if next == "" {
			if all == nil {
				all = []control.Instance{}
			}
			return all, nil
		}
		if next <= f.After {
			return nil, fmt.Errorf("GET /v1/instances: the next page starts at %q, not after %q", next, f.After)
		}
		f.After = next
	}
}

// InstancesPage lists one page of the instances matching f, sorted by id:
// at most f.Limit of them (0: the server's default page size) whose id
// sorts after f.After. next is "" on the last page, else the f.After that
// gets the page that follows.
func (c *Client) InstancesPage(ctx context.Context, f control.Filter) (list []control.Instance, next string, err error) {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("provider", f.Provider)
	set("node", f.Node)
	set("namespace", f.Owner)
	set("pool", f.Pool)
	set("group", f.Group)
	set("request", f.Request)
	set("name", f.Name)
	for _, p := range f.Phases {
		q.Add("phase", string(p))
	}
	if f.All {
		q.Set("all", "true")
	}
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	set("after", f.After)
	resp, err := c.do(ctx, http.MethodGet, "/v1/instances", q, nil)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	if err := driver.DecodeOutput(jsontext.NewDecoder(resp.Body), &list); err != nil {
		return nil, "", fmt.Errorf("GET /v1/instances: decoding the answer: %w", err)
	}
	if u := nextLink(resp.Header.Values("Link")); u != "" {
		l, err := url.Parse(u)
		if err != nil || l.Query().Get("after") == "" {
			return nil, "", fmt.Errorf("GET /v1/instances: a next link without after: %q", u)
		}
		next = l.Query().Get("after")
	}
	return list, next, nil
}

// nextLink returns the target of the rel="next" link among the Link header
// values (RFC 8288), or "".
func nextLink(values []string) string {
	for _, v := range values {
		for link := range strings.SplitSeq(v, ",") {
			target, params, ok := strings.Cut(strings.TrimSpace(link), ";")
			if !ok || !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
				continue
			}
			for p := range strings.SplitSeq(params, ";") {
				k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
				if strings.EqualFold(strings.TrimSpace(k), "rel") && slices.Contains(strings.Fields(strings.ToLower(strings.Trim(strings.TrimSpace(v), `"`))), "next") {
					return target[1 : len(target)-1]
				}
			}
		}
	}
	return ""
}

// Instance returns one instance by id or name.
func (c *Client) Instance(ctx context.Context, r string) (*control.Instance, error) {
	var in control.Instance
	if err := c.call(ctx, http.MethodGet, ref(r), nil, nil, &in); err != nil {
		return nil, err
	}
	return &in, nil
}

func (c *Client) change(ctx context.Context, method, path string, q url.Values, body any) (*control.Instance, error) {
	var in control.Instance
	if err := c.call(ctx, method, path, q, body, &in); err != nil {
		return nil, err
	}
	return &in, nil
}

// Delete asks for the instance to be removed and returns it as it is now.
func (c *Client) Delete(ctx context.Context, r string) (*control.Instance, error) {
	return c.change(ctx, http.MethodDelete, ref(r), nil, nil)
}

// Stop stops an instance, forcing it after grace (0: the server's default).
func (c *Client) Stop(ctx context.Context, r string, grace time.Duration) (*control.Instance, error) {
	q := url.Values{}
	if grace > 0 {
		q.Set("grace", grace.String())
	}
	return c.change(ctx, http.MethodPost, ref(r)+"/stop", q, nil)
}

// Start starts a stopped instance.
func (c *Client) Start(ctx context.Context, r string) (*control.Instance, error) {
	return c.change(ctx, http.MethodPost, ref(r)+"/start", nil, nil)
}

// Restart restarts an instance.
func (c *Client) Restart(ctx context.Context, r string, grace time.Duration) (*control.Instance, error) {
	q := url.Values{}
	if grace > 0 {
		q.Set("grace", grace.String())
	}
	return c.change(ctx, http.MethodPost, ref(r)+"/restart", q, nil)
}

// Kill sends signal to an instance ("" means KILL).
func (c *Client) Kill(ctx context.Context, r, signal string) (*control.Instance, error) {
	q := url.Values{}
	if signal != "" {
		q.Set("signal", signal)
	}
	return c.change(ctx, http.MethodPost, ref(r)+"/kill", q, nil)
}

// Resize changes an instance's live limits; zero fields are unchanged.
func (c *Client) Resize(ctx context.Context, r string, res driver.Resources) (*control.Instance, error) {
	return c.change(ctx, http.MethodPost, ref(r)+"/resize", nil, res)
}

// Rename gives the instance r the name name in its namespace, and its
// back-end resource with it.
func (c *Client) Rename(ctx context.Context, r, name string) (*control.Instance, error) {
	return c.change(ctx, http.MethodPost, ref(r)+"/rename", nil, api.RenameRequest{Name: name})
}

// Logs copies an instance's output to stdout and stderr until the stream
// ends (with opts.Follow, until ctx ends or the instance ends).
func (c *Client) Logs(ctx context.Context, r string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	q := url.Values{}
	if opts.Follow {
		q.Set("follow", "true")
	}
	if opts.Tail > 0 {
		q.Set("tail", strconv.Itoa(opts.Tail))
	}
	if opts.Stdout || opts.Stderr {
		q.Set("stdout", strconv.FormatBool(opts.Stdout))
		q.Set("stderr", strconv.FormatBool(opts.Stderr))
	}
	resp, err := c.do(ctx, http.MethodGet, ref(r)+"/logs", q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return readFrames(ctx, resp.Body, func(f *api.LogFrame) error {
		if f.Error != nil {
			return f.Error
		}
		w := stdout
		if f.Stream == "stderr" {
			w = stderr
		}
		if w == nil {
			return nil
		}
		_, err := io.WriteString(w, f.Data)
		return err
	})
}

// Suspend pauses a running instance and returns it as it is now
// (suspended); a back-end that cannot suspend answers driver.ErrUnsupported.
func (c *Client) Suspend(ctx context.Context, r string) (*control.Instance, error) {
	return c.change(ctx, http.MethodPost, ref(r)+"/suspend", nil, nil)
}

// Resume continues a suspended instance and returns it as it is now; a
// running one is resumed already; a stopped, exited or failed one answers
// driver.ErrNotSuspended.
func (c *Client) Resume(ctx context.Context, r string) (*control.Instance, error) {
	return c.change(ctx, http.MethodPost, ref(r)+"/resume", nil, nil)
}

// Hold keeps a running instance for d from now, then deletes it; holding
// again moves the expiry. d must be more than 0 and at most api.MaxHold.
func (c *Client) Hold(ctx context.Context, r string, d time.Duration) (*control.Instance, error) {
	return c.change(ctx, http.MethodPost, ref(r)+"/hold", nil, api.HoldRequest{For: d.String()})
}

// Stats measures an instance's usage once.
func (c *Client) Stats(ctx context.Context, r string) (*api.Stats, error) {
	var st api.Stats
	if err := c.call(ctx, http.MethodGet, ref(r)+"/stats", url.Values{"stream": {"false"}}, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// StreamStats calls fn with a measurement of the instance's usage every
// api.StatsInterval until ctx ends (ctx's error), fn fails (its error),
// the server sends an error (that error) or closes the stream (nil, as
// it does when shutting down).
func (c *Client) StreamStats(ctx context.Context, r string, fn func(api.Stats) error) error {
	resp, err := c.do(ctx, http.MethodGet, ref(r)+"/stats", nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return readFrames(ctx, resp.Body, func(f *api.StatsFrame) error {
		switch {
		case f.Error != nil:
			return f.Error
		case f.Stats != nil:
			return fn(*f.Stats)
		}
		return nil
	})
}

// readFrames decodes NDJSON frames of type T from body until EOF.
func readFrames[T any](ctx context.Context, body io.Reader, fn func(*T) error) error {
	dec := jsontext.NewDecoder(bufio.NewReader(body))
	for {
		var f T
		if err := driver.DecodeOutput(dec, &f); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: reading the stream: %w", driver.ErrTimeout, err)
		}
		if err := fn(&f); err != nil {
			return err
		}
	}
}

// Events calls fn for every event after revision since (0: from now) until
// ctx ends or the server ends the stream. It returns ctx's error when ctx
// ended it, the error the server sent (an error event), or nil when the
// server closed the stream (as it does when shutting down).
func (c *Client) Events(ctx context.Context, since int64, fn func(control.Event)) error {
	q := url.Values{}
	if since > 0 {
		q.Set("since", strconv.FormatInt(since, 10))
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/events", q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	var event string
	var data []byte
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 {
				if event == "error" {
					return decodeEnvelope(data)
				}
				var ev control.Event
				if err := driver.UnmarshalOutput(data, &ev); err != nil {
					return fmt.Errorf("events: decoding an event: %w", err)
				}
				fn(ev)
			}
			event, data = "", nil
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")...)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%w: events: %w", driver.ErrTimeout, err)
	}
	return nil
}

func decodeEnvelope(b []byte) error {
	var env struct {
		Error *api.Error `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err != nil || env.Error == nil {
		return fmt.Errorf("events: undecodable error %q", b)
	}
	return env.Error
}

// Nodes lists every provider's nodes ("" provider: all).
func (c *Client) Nodes(ctx context.Context, provider string) ([]control.NodeView, error) {
	q := url.Values{}
	if provider != "" {
		q.Set("provider", provider)
	}
	var out []control.NodeView
	return out, c.call(ctx, http.MethodGet, "/v1/nodes", q, nil, &out)
}

// Advice returns the right sizes of the running instances f selects (at
// most f.Limit listed; its After and phase fields are not sent).
func (c *Client) Advice(ctx context.Context, f control.Filter) (*control.AdviceAnswer, error) {
	q := url.Values{}
	for k, v := range map[string]string{"provider": f.Provider, "node": f.Node, "namespace": f.Owner, "pool": f.Pool, "group": f.Group, "request": f.Request, "name": f.Name} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var out control.AdviceAnswer
	return &out, c.call(ctx, http.MethodGet, "/v1/advice", q, nil, &out)
}

// Providers describes every provider.
func (c *Client) Providers(ctx context.Context) ([]control.ProviderView, error) {
	var out []control.ProviderView
	return out, c.call(ctx, http.MethodGet, "/v1/providers", nil, nil, &out)
}

// Images lists the images on a node of a provider.
func (c *Client) Images(ctx context.Context, provider, node string) ([]driver.Image, error) {
	q := url.Values{"provider": {provider}}
	if node != "" {
		q.Set("node", node)
	}
	var out []driver.Image
	return out, c.call(ctx, http.MethodGet, "/v1/images", q, nil, &out)
}

// Preload makes image present on nodes of provider (all when empty),
// calling progress (if not nil) for every step the server reports.
func (c *Client) Preload(ctx context.Context, provider, image string, nodes []string, progress func(driver.PreloadProgress)) error {
	resp, err := c.do(ctx, http.MethodPost, "/v1/images/preload", nil, api.PreloadRequest{Provider: provider, Image: image, Nodes: nodes})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	done := false
	err = readFrames(ctx, resp.Body, func(f *api.PreloadFrame) error {
		switch {
		case f.Error != nil:
			return f.Error
		case f.Done:
			done = true
		case f.Progress != nil && progress != nil:
			progress(*f.Progress)
		}
		return nil
	})
	if err == nil && !done {
		return fmt.Errorf("%w: preload: the stream ended before the preload did", driver.ErrTimeout)
	}
	return err
}

// Scheduler returns the scheduler's counters: the schedulers sharing a
// placement round, the placements committed and the conflicts.
func (c *Client) Scheduler(ctx context.Context) (control.SchedulerStats, error) {
	var out control.SchedulerStats
	return out, c.call(ctx, http.MethodGet, "/v1/scheduler", nil, nil, &out)
}

// Quotas returns every quota with its use.
func (c *Client) Quotas(ctx context.Context) ([]control.QuotaUse, error) {
	var out []control.QuotaUse
	return out, c.call(ctx, http.MethodGet, "/v1/quotas", nil, nil, &out)
}

// Doctor returns what the server found wrong with its data (admin
// only).
func (c *Client) Doctor(ctx context.Context) (*api.Doctor, error) {
	var out api.Doctor
	if err := c.call(ctx, http.MethodGet, "/v1/doctor", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Drivers describes the server's registered drivers.
func (c *Client) Drivers(ctx context.Context) ([]api.DriverInfo, error) {
	var out []api.DriverInfo
	return out, c.call(ctx, http.MethodGet, "/v1/drivers", nil, nil, &out)
}

// Health returns nil when the server answers.
func (c *Client) Health(ctx context.Context) error {
	return c.call(ctx, http.MethodGet, "/v1/health", nil, nil, nil)
}

// CreateToken makes a token; the answer holds its secret, shown this once.
func (c *Client) CreateToken(ctx context.Context, req api.TokenRequest) (*api.NewToken, error) {
	var t api.NewToken
	if err := c.call(ctx, http.MethodPost, "/v1/tokens", nil, req, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Tokens lists the tokens (never their secrets).
func (c *Client) Tokens(ctx context.Context) ([]api.TokenInfo, error) {
	var list []api.TokenInfo
	return list, c.call(ctx, http.MethodGet, "/v1/tokens", nil, nil, &list)
}

// RevokeToken deletes the token whose accessor id or name is r.
func (c *Client) RevokeToken(ctx context.Context, r string) (*api.TokenInfo, error) {
	var t api.TokenInfo
	if err := c.call(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(r), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// WhoAmI returns the identity of the client's token.
func (c *Client) WhoAmI(ctx context.Context) (*auth.Identity, error) {
	var id auth.Identity
	if err := c.call(ctx, http.MethodGet, "/v1/whoami", nil, nil, &id); err != nil {
		return nil, err
	}
	return &id, nil
}

// Members lists the etcd members under a highly available cluster.
func (c *Client) Members(ctx context.Context) ([]api.Member, error) {
	var out []api.Member
	if err := c.call(ctx, http.MethodGet, "/v1/members", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// AddMember adds a member with its peer URL to the etcd cluster; the
// server to run it then starts with --etcd-initial-cluster-state existing.
func (c *Client) AddMember(ctx context.Context, peerURL string) (*api.Member, error) {
	var m api.Member
	if err := c.call(ctx, http.MethodPost, "/v1/members", nil, api.MemberRequest{PeerURL: peerURL}, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// RemoveMember removes the member with the hexadecimal id.
func (c *Client) RemoveMember(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, "/v1/members/"+url.PathEscape(id), nil, nil, nil)
}

// PlanRebalance asks for a rebalance plan; nothing is changed.
func (c *Client) PlanRebalance(ctx context.Context, opt control.RebalanceOptions) (*control.RebalanceAnswer, error) {
	var out control.RebalanceAnswer
	if err := c.call(ctx, http.MethodPost, "/v1/rebalance/plan", nil, opt, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ApplyRebalance plans a rebalance and starts carrying it out; it answers
// the run (follow it with RebalanceStatus).
func (c *Client) ApplyRebalance(ctx context.Context, opt control.ApplyOptions) (*control.RebalanceRun, error) {
	var out control.RebalanceRun
	if err := c.call(ctx, http.MethodPost, "/v1/rebalance/apply", nil, opt, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RebalanceStatus returns the current or latest rebalance run.
func (c *Client) RebalanceStatus(ctx context.Context) (*control.RebalanceRun, error) {
	var out control.RebalanceRun
	if err := c.call(ctx, http.MethodGet, "/v1/rebalance", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
