package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berth-dev/berth/leader"
)

// TestForwardEndsWhenTheLeaderChanges: a request a follower forwarded to a
// leader that does not answer (frozen, cut off) is answered 503 as soon as
// another leader, or none, is seen, saying that it may have been carried
// out; seeing the same leader again cuts nothing short.
func TestForwardEndsWhenTheLeaderChanges(t *testing.T) {
	for _, tc := range []struct {
		name    string
		docker  bool
		changed bool
	}{
		{name: "api-leader-lost", changed: true},
		{name: "api-leader-seen-again"},
		{name: "docker-leader-lost", docker: true, changed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arrived, release := make(chan struct{}), make(chan struct{})
			lead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				close(arrived)
				select {
				case <-release:
					_, _ = io.WriteString(w, "done by the leader")
				case <-r.Context().Done():
				}
			}))
			defer lead.Close()
			defer close(release)

			fd, err := newFrontDoor(leader.Info{Name: "b"}, "", slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			a := leader.Info{Name: "a", Address: lead.URL, Docker: lead.URL}
			fd.seen(a, true)
			var h http.Handler = fd
			path := "/v1/requests"
			if tc.docker {
				h, path = dockerDoorOf(fd), "/containers/create"
			}
			front := httptest.NewServer(h)
			defer front.Close()

			type answer struct {
				code  int
				retry string
				body  string
				err   error
			}
			got := make(chan answer, 1)
			go func() {
				resp, err := http.Post(front.URL+path, "application/json", strings.NewReader("{}"))
				if err != nil {
					got <- answer{err: err}
					return
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				got <- answer{code: resp.StatusCode, retry: resp.Header.Get("Retry-After"), body: string(b), err: err}
			}()
			<-arrived
			if tc.changed {
				fd.seen(leader.Info{}, false)
			} else {
				fd.seen(a, true)
				release <- struct{}{}
			}
			ans := <-got
			if ans.err != nil {
				t.Fatal(ans.err)
			}
			switch {
			case tc.changed && (ans.code != http.StatusServiceUnavailable || ans.retry == "" ||
				!strings.Contains(ans.body, "lost the lead before it answered") || !strings.Contains(ans.body, "may or may not have been carried out")):
				t.Errorf("answer %d (Retry-After %q) %s, want 503 saying the leader lost the lead", ans.code, ans.retry, ans.body)
			case !tc.changed && (ans.code != http.StatusOK || ans.body != "done by the leader"):
				t.Errorf("answer %d %s, want the leader's", ans.code, ans.body)
			}
		})
	}
}
