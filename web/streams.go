package web

import (
	"context"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
)

// heartbeat is how often an idle event stream sends a comment, so that
// proxies keep it open and a gone browser is noticed.
const heartbeat = 20 * time.Second

// logTail is how many lines of earlier output a log stream starts with.
const logTail = 500

// maxLogFrame bounds the data of one log event.
const maxLogFrame = 16 << 10

// sse writes server-sent events to one response. It is safe for
// concurrent use.
type sse struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	cancel context.CancelFunc
	mu     chan struct{} // a one-slot lock that never blocks a closed stream for ever
	err    error
}

// recheck is how often an open stream checks that its caller's token
// is still good; a revoked or expired token ends it.
const recheck = 30 * time.Second

// openStream takes a stream slot and starts an event stream; release
// ends it. The stream ends with the request, when the server closes its
// streams, or when the caller's token stops being accepted.
func (s *Server) openStream(w http.ResponseWriter, r *http.Request) (ctx context.Context, out *sse, release func(), err error) {
	select {
	case s.streams <- struct{}{}:
	default:
		return nil, nil, nil, errBusy
	}
	ctx, cancel := context.WithCancel(r.Context())
	go func() {
		t := time.NewTicker(recheck)
		defer t.Stop()
		for {
			select {
			case <-s.closing:
				cancel()
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := s.authenticate(r.WithContext(ctx)); err != nil {
					cancel()
					return
				}
			}
		}
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	out = &sse{w: w, rc: http.NewResponseController(w), cancel: cancel, mu: make(chan struct{}, 1)}
	_ = out.rc.Flush()
	return ctx, out, func() { cancel(); <-s.streams }, nil
}

// send writes one event; after a write error it cancels the stream.
func (e *sse) send(event string, v any) error {
	b, err := driver.MarshalOutput(v)
	if err != nil {
		return err
	}
	e.mu <- struct{}{}
	defer func() { <-e.mu }()
	if e.err != nil {
		return e.err
	}
	if _, e.err = fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", event, b); e.err == nil {
		e.err = e.rc.Flush()
	}
	if e.err != nil {
		e.cancel()
	}
	return e.err
}

func (e *sse) comment() error {
	e.mu <- struct{}{}
	defer func() { <-e.mu }()
	if e.err != nil {
		return e.err
	}
	if _, e.err = fmt.Fprint(e.w, ": keep-alive\n\n"); e.err == nil {
		e.err = e.rc.Flush()
	}
	if e.err != nil {
		e.cancel()
	}
	return e.err
}

// liveChange is what the pages' script is told of a change: enough to
// decide whether to refresh, nothing secret.
type liveChange struct {
	Kind  string `json:"kind"`
	ID    string `json:"id,omitempty"`
	Phase string `json:"phase,omitempty"`
}

// events streams the changes the caller may see: instances of its
// namespaces (one instance with ?instance=ID) and, without it, nodes; with
// ?usage=1, also the end of every round of the usage loop (new points of
// the hour-of-use charts).
func (s *Server) events(w http.ResponseWriter, r *http.Request, c *caller) error {
	q := r.URL.Query()
	for k := range q {
		if k != "instance" && k != "usage" {
			return &httpError{http.StatusBadRequest, "unknown query parameter " + fmt.Sprintf("%q", k) + "; known: instance, usage"}
		}
	}
	var usage <-chan struct{} // nil: never
	switch v := q.Get("usage"); v {
	case "":
	case "1":
		usage = s.plane.UsageMeasured()
	default:
		return &httpError{http.StatusBadRequest, fmt.Sprintf("usage %q: want 1, or leave it out", v)}
	}
	only := q.Get("instance")
	if only != "" {
		if _, err := s.visibleInstance(r, c, only, auth.Read); err != nil {
			return err
		}
	}
	ch, unsubscribe := s.hub.subscribe()
	defer unsubscribe()
	ctx, out, release, err := s.openStream(w, r)
	if err != nil {
		return err
	}
	defer release()
	if err := out.send("hello", liveChange{Kind: "hello"}); err != nil {
		return nil
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if out.comment() != nil {
				return nil
			}
		case <-usage:
			usage = s.plane.UsageMeasured()
			if out.send("change", liveChange{Kind: "usage"}) != nil {
				return nil
			}
		case ev, ok := <-ch:
			if !ok {
				return nil // fell behind: the browser reconnects and renders afresh
			}
			var lc liveChange
			switch {
			case ev.Kind == control.EventInstance && ev.Instance != nil:
				if only != "" && ev.Instance.ID != only || c.Authorize(auth.Read, ev.Instance.Owner) != nil {
					continue
				}
				lc = liveChange{Kind: "instance", ID: ev.Instance.ID, Phase: string(ev.Instance.Phase)}
			case ev.Kind == control.EventNode && only == "":
				lc = liveChange{Kind: "node"}
			default:
				continue
			}
			if out.send("change", lc) != nil {
				return nil
			}
		}
	}
}

// logFrame is one log event: a chunk of one stream's output.
type logFrame struct {
	Stream string `json:"stream"`
	Data   string `json:"data"`
}

// logWriter sends what it is given as log events, in chunks of at most
// maxLogFrame bytes cut at rune boundaries.
type logWriter struct {
	out  *sse
	name string
}

func (l logWriter) Write(p []byte) (int, error) {
	for rest := p; len(rest) > 0; {
		n := min(len(rest), maxLogFrame)
		for n < len(rest) && n > 0 && !utf8.RuneStart(rest[n]) {
			n--
		}
		if n == 0 {
			n = min(len(rest), maxLogFrame)
		}
		if err := l.out.send("log", logFrame{Stream: l.name, Data: string(rest[:n])}); err != nil {
			return 0, err
		}
		rest = rest[n:]
	}
	return len(p), nil
}

// logs streams an instance's output: the last logTail lines, then what
// follows, until the instance ends or the browser goes. The end is an
// "end" event, so that the script does not reconnect.
func (s *Server) logs(w http.ResponseWriter, r *http.Request, c *caller) error {
	in, err := s.visibleInstance(r, c, r.PathValue("ref"), auth.Read)
	if err != nil {
		return err
	}
	ctx, out, release, err := s.openStream(w, r)
	if err != nil {
		return err
	}
	defer release()
	err = s.plane.Logs(ctx, in.ID, driver.LogOptions{Stdout: true, Stderr: true, Tail: logTail, Follow: true},
		logWriter{out, "stdout"}, logWriter{out, "stderr"})
	end := map[string]string{}
	if err != nil && ctx.Err() == nil {
		_, end["error"] = statusOf(err)
	}
	_ = out.send("end", end)
	return nil
}
