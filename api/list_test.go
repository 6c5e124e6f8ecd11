package api_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// pagedEnv serves 8 instances (5 of owner tester, 3 of owner other) with a
// default page size of 3, and returns the env and every instance id,
// sorted.
func pagedEnv(t *testing.T) (*env, []string) {
	t.Helper()
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 2}, api.Options{PageSize: 3})
	ctx := context.Background()
	var ids []string
	for _, s := range []struct {
		id, owner string
		count     int
	}{{"web", "tester", 5}, {"db", "other", 3}} {
		ans, err := e.Plane.Submit(ctx, scheduler.Request{ID: s.id, Count: s.count, Spec: driver.Spec{Image: "x"}}, s.owner)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ans.Instances {
			ids = append(ids, p.Instance.ID)
		}
	}
	slices.Sort(ids)
	c, err := client.New(e.HTTP.URL, client.WithToken(e.Token))
	if err != nil {
		t.Fatal(err)
	}
	return &env{api: e.API, http: e.HTTP, client: c, plane: e.Plane, h: withToken(e.API, e.Token)}, ids
}

// get serves GET path and returns the status, the listed ids and the next
// link ("" without one).
func get(t *testing.T, h http.Handler, path string) (int, []string, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var list []control.Instance
	if rec.Code == http.StatusOK {
		if err := driver.UnmarshalOutput(rec.Body.Bytes(), &list); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, rec.Body)
		}
	}
	var ids []string
	for _, in := range list {
		ids = append(ids, in.ID)
	}
	next := ""
	if l := rec.Header().Get("Link"); l != "" {
		target, rel, ok := strings.Cut(l, ">; ")
		if !ok || !strings.HasPrefix(target, "<") || rel != `rel="next"` {
			t.Fatalf("GET %s: Link %q, want <...>; rel=\"next\"", path, l)
		}
		next = target[1:]
	}
	return rec.Code, ids, next
}

func TestInstancesLinkHeader(t *testing.T) {
	e, all := pagedEnv(t)

	// The default page: 3 of 8, then links to the rest until the short page.
	var got []string
	path := "/v1/instances"
	for pages := 0; path != ""; pages++ {
		if pages > 3 {
			t.Fatalf("more than 3 pages of 3 for 8 instances")
		}
		status, ids, next := get(t, e.h, path)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d", path, status)
		}
		if len(ids) == 3 && next == "" || len(ids) < 3 && next != "" {
			t.Fatalf("GET %s: %d instances with next link %q", path, len(ids), next)
		}
		got = append(got, ids...)
		path = next
	}
	if !slices.Equal(got, all) {
		t.Fatalf("pages %v, want %v", got, all)
	}

	// The link keeps the filters and the limit and moves after on.
	status, ids, next := get(t, e.h, "/v1/instances?namespace=tester&phase=pending,scheduled,creating,running&all=true&limit=2")
	if status != http.StatusOK || len(ids) != 2 {
		t.Fatalf("namespace tester, limit 2: %d %v", status, ids)
	}
	u, err := url.Parse(next)
	if err != nil || u.Path != "/v1/instances" {
		t.Fatalf("next link %q: %v", next, err)
	}
	if q := u.Query(); q.Get("namespace") != "tester" || q.Get("limit") != "2" || q.Get("phase") != "pending,scheduled,creating,running" || q.Get("all") != "true" || q.Get("after") != ids[1] {
		t.Fatalf("next link %q does not hold the query with after=%s", next, ids[1])
	}
	_, ids2, _ := get(t, e.h, next)
	if len(ids2) != 2 || ids2[0] <= ids[1] {
		t.Fatalf("the next page %v does not follow %v", ids2, ids)
	}

	// Everything in one page: no link.
	if _, ids, next := get(t, e.h, "/v1/instances?limit=8"); len(ids) != 8 || next == "" {
		t.Fatalf("limit 8 of 8: %d instances, next %q; want a link (the page is full)", len(ids), next)
	}
	if _, ids, next := get(t, e.h, "/v1/instances?limit=9"); len(ids) != 8 || next != "" {
		t.Fatalf("limit 9 of 8: %d instances, next %q; want no link", len(ids), next)
	}
	if _, ids, next := get(t, e.h, "/v1/instances?after="+all[7]); len(ids) != 0 || next != "" {
		t.Fatalf("after the last: %v, next %q; want nothing", ids, next)
	}
}

func TestInstancesBadPage(t *testing.T) {
	e, _ := pagedEnv(t)
	for _, q := range []struct{ query, field string }{
		{"limit=0", "limit"},
		{"limit=-1", "limit"},
		{"limit=10001", "limit"},
		{"limit=ten", "limit"},
		{"limit=1&limit=2", "limit"},
		{"after=a&after=b", "after"},
	} {
		status, eb, raw := do(t, e.h, http.MethodGet, "/v1/instances?"+q.query, "")
		if status != http.StatusBadRequest || eb.Error.Code != "invalid" || eb.Error.Field != q.field || !strings.Contains(eb.Error.Message, q.field) {
			t.Errorf("%s: %d %s, want 400 invalid naming %s", q.query, status, raw, q.field)
		}
	}
	_, err := e.client.Instances(context.Background(), control.Filter{Limit: -1})
	var fe *driver.FieldError
	if !errors.As(err, &fe) || fe.Path != "limit" {
		t.Fatalf("client, limit -1: %v, want a FieldError on limit", err)
	}
}

func TestClientFollowsPages(t *testing.T) {
	e, all := pagedEnv(t)
	ctx := context.Background()
	list, err := e.client.Instances(ctx, control.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if got := idsOf(list); !slices.Equal(got, all) {
		t.Fatalf("Instances over pages of 3: %v, want %v", got, all)
	}
	list, err = e.client.Instances(ctx, control.Filter{Owner: "tester"})
	if err != nil || len(list) != 5 {
		t.Fatalf("Instances of tester: %d, %v; want 5", len(list), err)
	}
	for _, in := range list {
		if in.Owner != "tester" {
			t.Fatalf("Instances of tester lists %s of %q", in.ID, in.Owner)
		}
	}
	// A limit or an after set by the caller: that page only.
	list, err = e.client.Instances(ctx, control.Filter{Limit: 2})
	if got := idsOf(list); err != nil || !slices.Equal(got, all[:2]) {
		t.Fatalf("Instances, limit 2: %v %v, want %v", got, err, all[:2])
	}
	list, err = e.client.Instances(ctx, control.Filter{After: all[1]})
	if got := idsOf(list); err != nil || !slices.Equal(got, all[2:5]) {
		t.Fatalf("Instances after the 2nd: %v %v, want the default page %v", got, err, all[2:5])
	}
	list, next, err := e.client.InstancesPage(ctx, control.Filter{Limit: 4, After: all[1]})
	if got := idsOf(list); err != nil || !slices.Equal(got, all[2:6]) || next != all[5] {
		t.Fatalf("InstancesPage: %v next %q %v, want %v next %q", got, next, err, all[2:6], all[5])
	}
	list, next, err = e.client.InstancesPage(ctx, control.Filter{Limit: 4, After: next})
	if got := idsOf(list); err != nil || !slices.Equal(got, all[6:]) || next != "" {
		t.Fatalf("the last page: %v next %q %v, want %v and no next", got, next, err, all[6:])
	}
}

func idsOf(list []control.Instance) []string {
	out := make([]string, len(list))
	for i, in := range list {
		out[i] = in.ID
	}
	return out
}
