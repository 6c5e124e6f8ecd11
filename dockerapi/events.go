package dockerapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"

	"github.com/berth-dev/berth/control"
)

// events streams container events: create, start, die (with the exit
// code), stop, destroy, each once per change of the container's state.
// Without since they start from now. With since (docker events --since)
// the changes the store still holds (control.Plane.EventsHeld) made at or
// after since come first, each at the time its record was written, then
// the stream goes on live; until ends it (after the replay, when until is
// already past).
func (s *Server) events(w http.ResponseWriter, r *http.Request) error {
	since, err := unixTime(r, "since")
	if err != nil {
		return err
	}
	untilAt, err := unixTime(r, "until")
	if err != nil {
		return err
	}
	f, err := filters(r, "type", "event", "container", "label")
	if err != nil {
		return err
	}
	for _, t := range f["type"] {
		if t != "container" {
			return unsupported("events of type %q: Berth reports container events only", t)
		}
	}
	release, err := s.acquire(w, r)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := s.streamContext(r)
	defer cancel()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	// msgs carries the messages in order; a message with no Type marks
	// the end of the replay.
	msgs := make(chan events.Message, 256)
	watched := make(chan struct{})
	defer func() { cancel(); <-watched }()
	go func() {
		defer close(watched)
		s.watchEvents(ctx, r, f, since, untilAt, msgs)
		cancel()
	}()
	var until <-chan time.Time
	if !untilAt.IsZero() {
		tm := time.NewTimer(time.Until(untilAt))
		defer tm.Stop()
		until = tm.C
	}
	replaying, ended := !since.IsZero(), false
	enc := json.NewEncoder(w)
	for {
		select {
		case m := <-msgs:
			if m.Type == "" {
				if replaying = false; ended {
					return nil
				}
				continue
			}
			if enc.Encode(m) != nil || rc.Flush() != nil {
				return nil
			}
		case <-until:
			if until, ended = nil, true; !replaying {
				return nil
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// watchEvents sends the messages of r's event stream to msgs until ctx
// ends: from now, or with since from the plane's held changes first (a
// message with no Type after them). Changes made before since only set
// the state a container is shown in; so do those after untilAt.
func (s *Server) watchEvents(ctx context.Context, r *http.Request, f map[string][]string, since, untilAt time.Time, msgs chan<- events.Message) {
	last := map[string]container.ContainerState{}
	// shown holds the containers the stream showed a change of, and when
	// that change was made: a destroy is said only of them.
	shown := map[string]time.Time{}
	live := since.IsZero()
	send := func(m events.Message) bool {
		select {
		case msgs <- m:
			return true
		case <-ctx.Done():
			return false
		}
	}
	fn := func(ev control.Event) {
		if ev.Kind != control.EventInstance || ev.Instance == nil {
			return
		}
		in := *ev.Instance
		prev, seen := shown[in.ID]
		if ev.Deleted && !seen || !ev.Deleted && !authorized(r, in.Owner) {
			// A deleted record names no namespace: only what this
			// stream has shown may be said to be destroyed.
			return
		}
		at := time.Now()
		switch {
		case live:
		case ev.Deleted:
			at = prev // a held delete says not when: no earlier than the change before
		case !in.Updated.IsZero():
			at = in.Updated
		}
		acts := containerActions(last, in, ev.Deleted)
		if at.Before(since) || !untilAt.IsZero() && at.After(untilAt) {
			return // its state is noted, not shown
		}
		if shown[in.ID] = at; ev.Deleted {
			delete(shown, in.ID)
		}
		for _, a := range acts {
			if m := containerEvent(in, a, at); eventMatches(f, m) && !send(m) {
				return
			}
		}
	}
	if since.IsZero() {
		_ = s.plane.Events(ctx, 0, fn)
		return
	}
	caughtUp := func() {
		live = true
		send(events.Message{})
	}
	if err := s.plane.EventsHeld(ctx, caughtUp, fn); err != nil && ctx.Err() == nil {
		s.log.Warn("dockerapi: events since", "error", err)
	}
}

// unixTime reads the query parameter name, a Unix time in seconds with an
// optional fraction, as the docker CLI sends --since and --until; the zero
// time when it is absent.
func unixTime(r *http.Request, name string) (time.Time, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	sec, frac, _ := strings.Cut(v, ".")
	s, err := strconv.ParseInt(sec, 10, 64)
	if err != nil || len(frac) > 9 {
		return time.Time{}, badRequest("%s=%q: want a Unix time (seconds, optionally .nanoseconds)", name, v)
	}
	var ns int64
	if frac != "" {
		for len(frac) < 9 {
			frac += "0"
		}
		if ns, err = strconv.ParseInt(frac, 10, 64); err != nil {
			return time.Time{}, badRequest("%s=%q: want a Unix time (seconds, optionally .nanoseconds)", name, v)
		}
	}
	return time.Unix(s, ns), nil
}
