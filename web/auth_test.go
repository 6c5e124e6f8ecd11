package web_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/web"
)

// TestLockedWithoutAuthenticator: with no authenticator every page
// refuses, bearer or not, and the sign-in page says why.
func TestLockedWithoutAuthenticator(t *testing.T) {
	plane := simPlane(t, 1)
	s, err := web.New(plane, web.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/ui/", "/ui/instances", "/ui/pending", "/ui/whatif", "/ui/events"} {
		wantBody(t, get(s, p, "admin-secret"), http.StatusServiceUnavailable, "no token authentication")
	}
	wantBody(t, get(s, "/ui/signin", ""), http.StatusServiceUnavailable, "locked")
	w := post(s, "/ui/signin", url.Values{"token": {"admin-secret"}}, nil)
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("sign-in on a locked dashboard: status %d", w.Code)
	}
}

// post serves a form post with cookies.
func post(s http.Handler, path string, form url.Values, cookies []*http.Cookie, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	for _, c := range cookies {
		r.AddCookie(c)
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// signIn signs in with tok and returns the session cookie and the CSRF
// token of the session's forms.
func signIn(t *testing.T, s http.Handler, tok string) (*http.Cookie, string) {
	t.Helper()
	w := get(s, "/ui/signin", "")
	m := csrfRE.FindStringSubmatch(w.Body.String())
	if m == nil {
		t.Fatalf("the sign-in form has no CSRF token:\n%s", w.Body.String())
	}
	pre := w.Result().Cookies()
	w = post(s, "/ui/signin", url.Values{"csrf": {m[1]}, "token": {tok}, "next": {"/ui/instances"}}, pre)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/ui/instances" {
		t.Fatalf("sign-in: status %d, location %q", w.Code, w.Header().Get("Location"))
	}
	var ses *http.Cookie
	for _, c := range w.Result().Cookies() {
		if c.Name == "berth_session" {
			ses = c
		}
	}
	if ses == nil || !ses.HttpOnly || ses.SameSite != http.SameSiteStrictMode || ses.Path != "/ui/" {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path /ui/", ses)
	}
	r := httptest.NewRequest(http.MethodGet, "/ui/", nil)
	r.AddCookie(ses)
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, r)
	m = csrfRE.FindStringSubmatch(rec.Body.String())
	if rec.Code != http.StatusOK || m == nil {
		t.Fatalf("signed in, the overview answers %d without a CSRF token in its forms", rec.Code)
	}
	return ses, m[1]
}

// TestSignInSessionsAndCSRF walks the sign-in, the session and the
// checks on form posts.
func TestSignInSessionsAndCSRF(t *testing.T) {
	plane := simPlane(t, 1)
	submit(t, plane, "team-a", "a", 1, nil)
	submit(t, plane, "team-b", "b", 1, nil)
	s := newWeb(t, plane, nil)

	// Not signed in: a browser goes to the sign-in page, a script gets 401.
	w := get(s, "/ui/instances", "")
	if w.Code != http.StatusSeeOther || !strings.HasPrefix(w.Header().Get("Location"), "/ui/signin?next=") {
		t.Errorf("no session: status %d, location %q", w.Code, w.Header().Get("Location"))
	}
	wantBody(t, get(s, "/ui/instances", "wrong"), http.StatusUnauthorized)

	// A sign-in without the form's CSRF token, or with a wrong token.
	wantBody(t, post(s, "/ui/signin", url.Values{"token": {"admin-secret"}}, nil), http.StatusForbidden, "CSRF")
	pre := get(s, "/ui/signin", "")
	m := csrfRE.FindStringSubmatch(pre.Body.String())
	wantBody(t, post(s, "/ui/signin", url.Values{"csrf": {m[1]}, "token": {"nope"}}, pre.Result().Cookies()), http.StatusUnauthorized, "not accepted")

	// Secure cookies where TLS is on.
	sec := newWeb(t, plane, func(o *web.Options) { o.SecureCookies = true })
	w = get(sec, "/ui/signin", "")
	if c := w.Result().Cookies(); len(c) != 1 || !c[0].Secure {
		t.Errorf("sign-in cookie with SecureCookies: %+v", c)
	}

	ses, csrf := signIn(t, s, "operator-secret")
	// Stop without the CSRF token, with a wrong one, and cross-origin.
	wantBody(t, post(s, "/ui/instances/a/stop", url.Values{}, []*http.Cookie{ses}), http.StatusForbidden, "CSRF")
	wantBody(t, post(s, "/ui/instances/a/stop", url.Values{"csrf": {"x" + csrf}}, []*http.Cookie{ses}), http.StatusForbidden, "CSRF")
	wantBody(t, post(s, "/ui/instances/a/stop", url.Values{"csrf": {csrf}}, []*http.Cookie{ses}, "Sec-Fetch-Site", "cross-site"), http.StatusForbidden, "cross-origin")
	// Another namespace's instance does not exist for this token.
	wantBody(t, post(s, "/ui/instances/b/stop", url.Values{"csrf": {csrf}}, []*http.Cookie{ses}), http.StatusNotFound)
	wantBody(t, get(s, "/ui/instances/b", "operator-secret"), http.StatusNotFound)
	wantBody(t, get(s, "/ui/instances?namespace=team-b", "operator-secret"), http.StatusForbidden)
	// With the token: accepted (the plane is not running: the stop is
	// refused or accepted by the plane, never by the dashboard's checks).
	w = post(s, "/ui/instances/a/delete", url.Values{"csrf": {csrf}}, []*http.Cookie{ses})
	if w.Code != http.StatusSeeOther {
		t.Errorf("delete with the CSRF token: status %d:\n%s", w.Code, cut(w.Body.String()))
	}

	// Readers see but do not act, bearer or session.
	wantBody(t, get(s, "/ui/instances/a", "reader-secret"), http.StatusOK)
	if strings.Contains(get(s, "/ui/instances/a", "reader-secret").Body.String(), "act-stop") {
		t.Error("a reader is shown the stop button")
	}
	wantBody(t, post(s, "/ui/instances/a/stop", url.Values{}, nil, "Authorization", "Bearer reader-secret"), http.StatusForbidden, "may not")
	rses, rcsrf := signIn(t, s, "reader-secret")
	wantBody(t, post(s, "/ui/instances/a/stop", url.Values{"csrf": {rcsrf}}, []*http.Cookie{rses}), http.StatusForbidden, "may not")
	wantBody(t, post(s, "/ui/whatif", url.Values{"csrf": {rcsrf}, "source": {"w2"}, "nodes": {"10"}}, []*http.Cookie{rses}), http.StatusForbidden)

	// Signing out ends the session.
	w = post(s, "/ui/signout", url.Values{"csrf": {csrf}}, []*http.Cookie{ses})
	if w.Code != http.StatusSeeOther {
		t.Fatalf("sign-out: status %d", w.Code)
	}
	r := httptest.NewRequest(http.MethodGet, "/ui/", nil)
	r.AddCookie(ses)
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, r)
	if rec.Code != http.StatusSeeOther {
		t.Errorf("after sign-out the session still works: status %d", rec.Code)
	}
}

// TestWhatIfBounds: the simulator refuses what is too large, and runs
// what is not.
func TestWhatIfBounds(t *testing.T) {
	plane := simPlane(t, 1)
	s := newWeb(t, plane, func(o *web.Options) { o.Sim = web.SimLimits{MaxNodes: 500, MaxInstances: 5000} })
	postAs := func(form url.Values) *httptest.ResponseRecorder {
		return post(s, "/ui/whatif", form, nil, "Authorization", "Bearer operator-secret")
	}
	wantBody(t, postAs(url.Values{"source": {"w2"}, "nodes": {"501"}}), http.StatusUnprocessableEntity, "nodes", "want 1 to 500")
	wantBody(t, postAs(url.Values{"source": {"w1"}, "nodes": {"100"}}), http.StatusUnprocessableEntity, "more than 5000 instances")
	wantBody(t, postAs(url.Values{"source": {"file"}, "workload": {`{"nodes": [{"count": 10, "cpus": 4, "memory": "8Gi"}], "requests": [{"image": "x", "cpus": "many"}]}`}}),
		http.StatusUnprocessableEntity, "cpus")
	wantBody(t, postAs(url.Values{"source": {"file"}, "workload": {`{"nodez": []}`}}), http.StatusUnprocessableEntity, "nodez")
	body := wantBody(t, postAs(url.Values{"source": {"file"}, "nodes": {"40"}, "strategy": {"binpack", "spread"},
		"workload": {`{"nodes": [{"count": 10, "cpus": 4, "memory": "8Gi"}], "requests": [{"image": "x", "cpus": 0.5, "memory": "256Mi", "repeat": 100}]}`}}),
		http.StatusOK, "<svg", "placements/s", "binpack", "spread")
	// 100 instances of half a cpu on nodes of 4: at least 13 nodes.
	if !regexp.MustCompile(`<td>40</td><td>100</td><td>100</td><td>0</td>`).MatchString(body) {
		t.Errorf("results do not show 40 nodes, 100 asked, 100 placed, 0 unplaced:\n%s", cut(body[strings.Index(body, "Results"):]))
	}
	if !strings.Contains(body, "<td>13</td>") {
		t.Errorf("results do not show the lower bound of 13 nodes")
	}
}

// TestFailedSignInsAreBounded: after a burst of wrong tokens, sign-ins
// are refused for a while.
func TestFailedSignInsAreBounded(t *testing.T) {
	s := newWeb(t, simPlane(t, 1), nil)
	pre := get(s, "/ui/signin", "")
	m := csrfRE.FindStringSubmatch(pre.Body.String())
	codes := map[int]int{}
	for range web.SignInBurst + 5 {
		codes[post(s, "/ui/signin", url.Values{"csrf": {m[1]}, "token": {"guess"}}, pre.Result().Cookies()).Code]++
	}
	if codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("%d wrong tokens in a row: statuses %v, want some 429", web.SignInBurst+5, codes)
	}
}

// TestFormBodiesCutAre4xx: a dashboard form whose body arrives too slowly
// is 408, one shorter than its Content-Length 400: never a 5xx, as the
// API answers such bodies.
func TestFormBodiesCutAre4xx(t *testing.T) {
	plane := simPlane(t, 1)
	hs := httptest.NewUnstartedServer(newWeb(t, plane, nil))
	hs.Config.ReadTimeout = time.Second
	hs.Start()
	t.Cleanup(hs.Close)
	const form = "csrf=x&grace=10s"
	for _, c := range []struct {
		name   string
		send   string
		close  bool
		status int
	}{
		{"too slow", form[:5], false, http.StatusRequestTimeout},
		{"truncated", form, true, http.StatusBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", hs.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			req := "POST /ui/instances/a/stop HTTP/1.1\r\nHost: " + hs.Listener.Addr().String() + "\r\n" +
				"Authorization: Bearer operator-secret\r\nContent-Type: application/x-www-form-urlencoded\r\n" +
				fmt.Sprintf("Content-Length: %d\r\n\r\n", len(form)+20) + c.send
			if _, err := io.WriteString(conn, req); err != nil {
				t.Fatal(err)
			}
			if c.close {
				if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Fatalf("got %d, want %d", resp.StatusCode, c.status)
			}
		})
	}
}
