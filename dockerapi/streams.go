package dockerapi

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
)

// Stream ids of the multiplexed stream framing.
const (
	streamStdout = 1
	streamStderr = 2
)

// muxWriter writes the Engine API's multiplexed stream framing: each write
// is one frame, an 8-byte header (stream id, three zero bytes, the length
// big endian) and the data. It is safe for concurrent use.
type muxWriter struct {
	mu    sync.Mutex
	w     io.Writer
	flush func() error
}

type muxStream struct {
	m  *muxWriter
	id byte
}

func (s muxStream) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var hdr [8]byte
	hdr[0] = s.id
	binary.BigEndian.PutUint32(hdr[4:], uint32(len(p)))
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if _, err := s.m.w.Write(hdr[:]); err != nil {
		return 0, err
	}
	if _, err := s.m.w.Write(p); err != nil {
		return 0, err
	}
	if s.m.flush != nil {
		if err := s.m.flush(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// wait answers when the container reaches the condition: not-running (the
// default), next-exit or removed. The status line is sent at once, as the
// Engine does, so that a client may start the container after it.
func (s *Server) wait(w http.ResponseWriter, r *http.Request) error {
	cond := r.URL.Query().Get("condition")
	switch cond {
	case "", "not-running", "next-exit", "removed":
	default:
		return badRequest("condition %q: want not-running, next-exit or removed", cond)
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
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
	_ = http.NewResponseController(w).Flush()

	seenLive := c.created != nil || !ended(c.in)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var last control.Instance
	for {
		s.mu.Lock()
		_, stillCreated := s.created[c.id]
		s.mu.Unlock()
		if !stillCreated {
			in, err := s.plane.Instance(ctx, c.id)
			switch {
			case errors.Is(err, driver.ErrNotFound):
				in, err = last, nil
				in.Phase = reconciler.Deleted
			case err != nil:
				return json.NewEncoder(w).Encode(container.WaitResponse{StatusCode: -1, Error: &container.WaitExitError{Message: err.Error()}})
			}
			if in.Phase != reconciler.Deleted || last.ID == "" {
				last = in
			} else {
				last.Phase = reconciler.Deleted
			}
			in = last
			done := false
			switch cond {
			case "removed":
				done = in.Phase == reconciler.Deleted
			case "next-exit":
				done = ended(in) && seenLive
			default:
				done = ended(in) || in.Phase == reconciler.Pending
			}
			if !ended(in) {
				seenLive = true
			}
			if done && cond != "removed" && !hasExit(in) {
				in = s.settle(ctx, c.id)
			}
			if done {
				resp := container.WaitResponse{StatusCode: int64(exitCode(in))}
				if cond == "removed" && (in.Observed == nil || in.Observed.ExitCode == nil) {
					// Last seen running: it ended and was removed
					// between two looks. --rm kept its exit code.
					if code, ok := s.removedExit(c.id); ok {
						resp.StatusCode = int64(code)
					}
				}
				if in.Phase == reconciler.Failed {
					resp.StatusCode = 125
					resp.Error = &container.WaitExitError{Message: in.Message}
				}
				return json.NewEncoder(w).Encode(resp)
			}
		} else if cond == "" || cond == "not-running" {
			return json.NewEncoder(w).Encode(container.WaitResponse{})
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// attach connects to a container over a hijacked connection, as the
// Engine API does: the raw stream for a container with a terminal, the
// multiplexed framing otherwise. A container made with stdin or a terminal
// (docker run -i, -t), and any started one whose provider can attach, is
// attached through its provider, with input when asked for and the
// container has it open; a container made here and not started yet has
// its output from its start (docker run attaches, then starts). A plain
// container of a provider that cannot attach has its output followed from
// its start through its logs.
func (s *Server) attach(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	withStdin, _ := strconv.ParseBool(q.Get("stdin"))
	stdout, _ := strconv.ParseBool(q.Get("stdout"))
	stderr, _ := strconv.ParseBool(q.Get("stderr"))
	logs, _ := strconv.ParseBool(q.Get("logs"))
	if v := q.Get("detachKeys"); v != "" {
		return unsupported("--detach-keys: Berth detaches with the back-end's keys")
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	spec := c.in.Spec
	if c.created != nil {
		spec = &c.created.req.Spec
	}
	if spec == nil {
		spec = &driver.Spec{}
	}
	// As the Engine, input to a container without it is dropped.
	withStdin = withStdin && spec.Stdin
	viaProvider := spec.Stdin || spec.TTY
	if c.created == nil && !viaProvider {
		can, err := s.plane.CanAttach(c.id)
		if err != nil {
			return err
		}
		if !can && !logs {
			return unsupported("docker attach to a started container of a provider that cannot attach: follow the output with docker logs -f")
		}
		viaProvider = can
	}
	release, err := s.acquire(w, r)
	if err != nil {
		return err
	}
	defer release()
	// Counted before the container can start (docker run attaches first),
	// so that --rm waits for the output to be read.
	s.mu.Lock()
	s.attached[c.id]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.attached[c.id]--; s.attached[c.id] <= 0 {
			delete(s.attached, c.id)
			delete(s.sizes, c.id)
		}
		s.mu.Unlock()
	}()
	conn, in, err := takeOver(w, r)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := s.until(context.Background())
	defer cancel()
	stdin, closeIn := readInput(in, withStdin, cancel)
	defer closeIn()
	if !s.waitBackend(ctx, c.id) {
		return nil
	}
	out, errw := outputs(conn, spec.TTY, stdout, stderr)
	if viaProvider {
		if spec.TTY {
			s.applySize(ctx, c.id)
		}
		err = s.plane.Attach(ctx, c.id, driver.AttachOptions{Replay: c.created != nil || logs}, stdin, out, errw)
	} else {
		err = s.plane.Logs(ctx, c.id, driver.LogOptions{Stdout: stdout, Stderr: stderr, Follow: true}, out, errw)
	}
	if err != nil && ctx.Err() == nil {
		s.log.Warn("dockerapi: attach", "container", c.id, "error", err)
	}
	return nil
}

// takeOver answers r with the headers of a raw stream (101 when the
// client asked for an upgrade, as the docker CLI does) and takes its
// connection over, for attach and exec start. The caller closes the
// connection; what the client sends is read from the returned reader.
func takeOver(w http.ResponseWriter, r *http.Request) (net.Conn, io.Reader, error) {
	upgrade := r.Header.Get("Upgrade") != ""
	if cw, ok := w.(*committedWriter); ok {
		cw.hijacked, cw.code = true, http.StatusOK
		if upgrade {
			cw.code = http.StatusSwitchingProtocols
		}
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	if upgrade {
		_, _ = brw.WriteString("HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
	} else {
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n")
	}
	if err := brw.Flush(); err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, brw.Reader, nil
}

// readInput reads what the client sends on a taken-over connection, in,
// until it goes. With withStdin it is the returned reader, which the
// client's half-close (EOF) ends; without, it is dropped (as the Engine
// drops input to a container that takes none), and the reader is nil. A
// read error means the client went away: cancel is called. The caller
// calls the returned func when done.
func readInput(in io.Reader, withStdin bool, cancel func()) (io.Reader, func()) {
	pr, pw := io.Pipe()
	go func() {
		dst := io.Writer(io.Discard)
		if withStdin {
			dst = pw
		}
		_, err := io.Copy(dst, in)
		if err != nil {
			cancel()
		}
		pw.CloseWithError(err)
	}()
	done := func() { pr.Close() }
	if !withStdin {
		return nil, done
	}
	return pr, done
}

// outputs returns the writers of a stream's stdout and stderr over conn:
// one raw stream with a terminal, the multiplexed framing without;
// io.Discard for a stream not asked for.
func outputs(conn io.Writer, tty, stdout, stderr bool) (io.Writer, io.Writer) {
	var out, errw io.Writer = io.Discard, io.Discard
	if tty {
		if stdout || stderr {
			out, errw = conn, conn
		}
		return out, errw
	}
	mw := &muxWriter{w: conn}
	if stdout {
		out = muxStream{mw, streamStdout}
	}
	if stderr {
		errw = muxStream{mw, streamStderr}
	}
	return out, errw
}

// waitBackend waits until container id's back-end resource exists, and
// reports whether it does (false: it failed, is being deleted, or ctx
// ended first).
func (s *Server) waitBackend(ctx context.Context, id string) bool {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		_, stillCreated := s.created[id]
		s.mu.Unlock()
		if !stillCreated {
			in, err := s.plane.Instance(ctx, id)
			if err != nil || in.Phase == reconciler.Failed || in.Phase == reconciler.Deleted || in.Phase == reconciler.Deleting {
				return false
			}
			if in.BackendID != "" && in.Phase != reconciler.Creating && in.Phase != reconciler.Scheduled {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// resize sets the size of a container's terminal (the docker CLI sends it
// after start and on every change of its window). A container not running
// yet keeps the size until its attach applies it.
func (s *Server) resize(w http.ResponseWriter, r *http.Request) error {
	size, err := sizeParams(r)
	if err != nil {
		return err
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	spec := c.in.Spec
	if c.created != nil {
		spec = &c.created.req.Spec
	}
	if spec == nil || !spec.TTY {
		return &httpError{http.StatusConflict, "container " + c.id + " has no terminal (run it with -t)"}
	}
	if size.Rows == 0 || size.Cols == 0 {
		// The CLI sends 0x0 when it cannot read its own window.
		w.WriteHeader(http.StatusOK)
		return nil
	}
	// Kept first, then applied when the container runs: either this
	// request sees it running, or its attach, which looks later, sees the
	// size.
	s.mu.Lock()
	if _, ok := s.sizes[c.id]; ok || len(s.sizes) < s.maxNew {
		s.sizes[c.id] = size
	}
	s.mu.Unlock()
	if c.created == nil {
		in, err := s.plane.Instance(r.Context(), c.id)
		if err != nil {
			return err
		}
		if in.BackendID != "" && in.Phase != reconciler.Creating && in.Phase != reconciler.Scheduled && !ended(in) {
			if err := s.plane.ResizeTTY(r.Context(), c.id, size); err != nil {
				return err
			}
		}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// sizeParams reads the size of a resize: h rows and w columns.
func sizeParams(r *http.Request) (driver.TTYSize, error) {
	q := r.URL.Query()
	var size driver.TTYSize
	for _, p := range []struct {
		name string
		v    *uint16
	}{{"h", &size.Rows}, {"w", &size.Cols}} {
		n, err := strconv.ParseUint(q.Get(p.name), 10, 16)
		if err != nil {
			return size, badRequest("%s=%q: want a number of characters up to 65535", p.name, q.Get(p.name))
		}
		*p.v = uint16(n)
	}
	return size, nil
}

// applySize gives the container id the terminal size its client asked for
// before it ran, if any.
func (s *Server) applySize(ctx context.Context, id string) {
	s.mu.Lock()
	size, ok := s.sizes[id]
	s.mu.Unlock()
	if !ok {
		return
	}
	if err := s.plane.ResizeTTY(ctx, id, size); err != nil && ctx.Err() == nil {
		s.log.Warn("dockerapi: resize", "container", id, "error", err)
	}
}

// logs streams a container's output in the multiplexed framing.
func (s *Server) logs(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	follow, _ := strconv.ParseBool(q.Get("follow"))
	opts := driver.LogOptions{Follow: follow}
	opts.Stdout, _ = strconv.ParseBool(q.Get("stdout"))
	opts.Stderr, _ = strconv.ParseBool(q.Get("stderr"))
	if !opts.Stdout && !opts.Stderr {
		return badRequest("Bad parameters: you must choose at least one stream")
	}
	opts.Timestamps, _ = strconv.ParseBool(q.Get("timestamps"))
	for _, p := range []string{"since", "until"} {
		if v := q.Get(p); v != "" && v != "0" {
			return unsupported("logs --%s: Berth reads logs by line count only (--tail)", p)
		}
	}
	none := false
	if v := q.Get("tail"); v != "" && v != "all" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return badRequest("tail=%q: want a number or all", v)
		}
		if n == 0 {
			if follow {
				return unsupported("logs --tail 0 --follow: Berth's back-ends cannot skip what was written before")
			}
			none = true
		}
		opts.Tail = n
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if s.follower() && (c.in.BackendID == "" || !s.plane.ReadsBackend(c.id)) {
		// Not started in the follower's copy (the leader may know
		// better), or on a back-end only the leader reads.
		return errForward
	}
	if c.created == nil && c.in.BackendID == "" && !none {
		return &httpError{http.StatusConflict, "container " + c.id + " has not started yet: it has no output"}
	}
	release, err := s.acquire(w, r)
	if err != nil {
		return err
	}
	defer release()
	w.Header().Set("Content-Type", "application/vnd.docker.raw-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	if none || c.created != nil {
		return nil
	}
	ctx, cancel := s.streamContext(r)
	defer cancel()
	mw := &muxWriter{w: w, flush: rc.Flush}
	err = s.plane.Logs(ctx, c.id, opts, muxStream{mw, streamStdout}, muxStream{mw, streamStderr})
	if err != nil && ctx.Err() == nil {
		_, _ = muxStream{mw, streamStderr}.Write([]byte("berth: " + err.Error() + "\n"))
	}
	return nil
}

// stats answers one measurement (stream=false) or one a second.
func (s *Server) stats(w http.ResponseWriter, r *http.Request) error {
	stream := true
	if v := r.URL.Query().Get("stream"); v != "" {
		stream, _ = strconv.ParseBool(v)
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if s.follower() && !s.plane.ReadsBackend(c.id) {
		return errForward
	}
	measure := func(ctx context.Context) (container.StatsResponse, error) {
		in, err := s.plane.Instance(ctx, c.id)
		if err != nil {
			return container.StatsResponse{}, err
		}
		out := container.StatsResponse{ID: in.ID, Name: "/" + in.Name, OSType: "linux", Read: time.Now()}
		if in.Phase != reconciler.Running && in.Phase != reconciler.Held && in.Phase != reconciler.Suspended {
			return out, nil
		}
		u, err := s.plane.Usage(ctx, c.id)
		if err != nil {
			return out, err
		}
		out.Read = u.Time
		// A one-second window on one cpu: the CLI's percentage, cpu delta
		// over system delta times online cpus, is then the cpus used.
		out.PreRead = u.Time.Add(-time.Second)
		out.CPUStats = container.CPUStats{CPUUsage: container.CPUUsage{TotalUsage: uint64(u.CPU) * 1_000_000}, SystemUsage: 1_000_000_000, OnlineCPUs: 1}
		out.MemoryStats = container.MemoryStats{Usage: uint64(u.Memory)}
		if in.Spec != nil && in.Spec.Memory > 0 {
			out.MemoryStats.Limit = uint64(in.Spec.Memory)
		}
		return out, nil
	}
	if c.created != nil {
		return writeJSON(w, http.StatusOK, container.StatsResponse{ID: c.id, OSType: "linux", Read: time.Now()})
	}
	if !stream {
		st, err := measure(r.Context())
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, st)
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
	enc := json.NewEncoder(w)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		st, err := measure(ctx)
		if err != nil {
			return nil
		}
		if enc.Encode(st) != nil || rc.Flush() != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// containerActions returns the Engine's actions for the change of
// container in (deleted: its record is gone), given the state the stream
// showed it in last, which it updates.
func containerActions(last map[string]container.ContainerState, in control.Instance, deleted bool) []events.Action {
	state := dockerState(in)
	if deleted || in.Phase == reconciler.Deleted {
		state = "destroyed"
	}
	prev, seen := last[in.ID]
	if seen && prev == state {
		return nil
	}
	last[in.ID] = state
	switch state {
	case container.StateCreated:
		if !seen {
			return []events.Action{events.ActionCreate}
		}
	case container.StateRunning:
		if seen && prev == container.StatePaused {
			return []events.Action{events.ActionUnPause}
		}
		if !seen {
			return []events.Action{events.ActionCreate, events.ActionStart}
		}
		return []events.Action{events.ActionStart}
	case container.StatePaused:
		if seen && prev == container.StateRunning {
			return []events.Action{events.ActionPause}
		}
	case container.StateExited, container.StateDead:
		if seen && (prev == container.StateRunning || prev == container.StatePaused) {
			if in.Phase == reconciler.Stopped {
				return []events.Action{events.ActionDie, events.ActionStop}
			}
			return []events.Action{events.ActionDie}
		}
	case "destroyed":
		delete(last, in.ID)
		return []events.Action{events.ActionDestroy}
	}
	return nil
}

// containerEvent returns the Engine's message of action a of container in
// at now.
func containerEvent(in control.Instance, a events.Action, now time.Time) events.Message {
	attrs := map[string]string{"name": in.Name}
	if in.Spec != nil {
		attrs["image"] = in.Spec.Image
		for k, v := range in.Spec.Labels {
			attrs[k] = v
		}
	}
	if in.Node != "" {
		attrs["node"] = reconciler.NodeID(in.Provider, in.Node)
	}
	if a == events.ActionDie {
		attrs["exitCode"] = strconv.Itoa(exitCode(in))
	}
	return events.Message{Type: events.ContainerEventType, Action: a, Actor: events.Actor{ID: in.ID, Attributes: attrs}, Scope: "local", Time: now.Unix(), TimeNano: now.UnixNano()}
}

func eventMatches(f map[string][]string, m events.Message) bool {
	ok := matchAny(f["event"], func(v string) bool { return v == string(m.Action) }) &&
		matchAny(f["container"], func(v string) bool { return v == m.Actor.ID || v == m.Actor.Attributes["name"] })
	for _, l := range f["label"] {
		k, v, hasV := strings.Cut(l, "=")
		got, has := m.Actor.Attributes[k]
		if !has || (hasV && got != v) {
			return false
		}
	}
	return ok
}
