package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// act classifies the error of an action on an existing container. The
// engine answers 409 when the container is in the wrong state for the
// action (killing a stopped one), which is no name conflict: it is
// reported as ErrPermanent with the engine's words.
func (d *Driver) act(e *engine, err error, what string) error {
	if err == nil {
		return nil
	}
	d.noteErr(e, err)
	if cerrdefs.IsConflict(err) {
		return fmt.Errorf("%w: engine %s: %s: %w", driver.ErrPermanent, e.cfg.Name, what, err)
	}
	return classify(err, e, what)
}

// Images lists the tagged images on node.
func (d *Driver) Images(ctx context.Context, node string) ([]driver.Image, error) {
	e, err := d.engine(node)
	if err != nil {
		return nil, err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	res, err := e.cli.ImageList(cctx, client.ImageListOptions{})
	if err != nil {
		d.noteErr(e, err)
		return nil, classify(err, e, "list images")
	}
	var out []driver.Image
	for _, im := range res.Items {
		for _, t := range im.RepoTags {
			if t == "<none>:<none>" {
				continue
			}
			out = append(out, driver.Image{Name: t, ID: im.ID, Size: driver.Bytes(im.Size), Created: time.Unix(im.Created, 0)})
		}
	}
	return out, nil
}

// hasImage reports whether image is present on e.
func (d *Driver) hasImage(ctx context.Context, e *engine, image string) (bool, error) {
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	_, err := e.cli.ImageInspect(cctx, image)
	switch {
	case err == nil:
		return true, nil
	case cerrdefs.IsNotFound(err) && !client.IsErrConnectionFailed(err):
		return false, nil
	}
	d.noteErr(e, err)
	return false, classify(err, e, "inspect image "+image)
}

// Preload makes image present on nodes (every engine when nodes is empty),
// all targets in parallel. For each engine that lacks it, Preload pulls it
// when the pull option is set and otherwise, or when the pull fails (no
// registry reachable), streams it from an engine that has it: save there,
// load here, reporting the bytes copied. It fails with ErrPermanent when no
// engine has the image and it cannot be pulled.
func (d *Driver) Preload(ctx context.Context, image string, nodes []string, progress func(driver.PreloadProgress)) error {
	if image == "" || strings.ContainsAny(image, " \t\n") {
		return &driver.FieldError{Path: "image", Reason: fmt.Sprintf("%q: not an image reference", image)}
	}
	if len(nodes) == 0 {
		nodes = d.nodeNames()
	}
	var targets []*engine
	for _, n := range nodes {
		e, err := d.engine(n)
		if err != nil {
			return err
		}
		targets = append(targets, e)
	}
	var pmu sync.Mutex
	report := func(p driver.PreloadProgress) {
		if progress != nil {
			pmu.Lock()
			progress(p)
			pmu.Unlock()
		}
	}
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, e := range targets {
		wg.Go(func() {
			errs[i] = d.preloadOne(ctx, e, image, report)
			if errs[i] != nil {
				report(driver.PreloadProgress{Node: e.cfg.Name, Image: image, Status: "failed", Err: errs[i].Error()})
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (d *Driver) preloadOne(ctx context.Context, e *engine, image string, report func(driver.PreloadProgress)) error {
	if st, reason, _ := e.snapshot(); st == driver.NodeOffline {
		return driver.Errorf(driver.ErrRetryable, "preload %s: engine %s is offline (%s)", image, e.cfg.Name, reason)
	}
	ok, err := d.hasImage(ctx, e, image)
	if err != nil {
		return err
	}
	if ok {
		report(driver.PreloadProgress{Node: e.cfg.Name, Image: image, Status: "present"})
		return nil
	}
	var pullErr error
	if d.opts.Pull {
		report(driver.PreloadProgress{Node: e.cfg.Name, Image: image, Status: "pulling"})
		if pullErr = d.pull(ctx, e, image); pullErr == nil {
			report(driver.PreloadProgress{Node: e.cfg.Name, Image: image, Status: "done"})
			return nil
		}
		if ctx.Err() != nil {
			return pullErr
		}
	}
	var src *engine
	for _, o := range d.engines {
		if o == e || !o.online() {
			continue
		}
		if ok, err := d.hasImage(ctx, o, image); err == nil && ok {
			src = o
			break
		}
	}
	if src == nil {
		msg := fmt.Sprintf("image %q is on no online engine", image)
		if pullErr != nil {
			msg += " and the pull failed: " + pullErr.Error()
		}
		return driver.Errorf(driver.ErrPermanent, "preload on engine %s: %s", e.cfg.Name, msg)
	}
	if err := d.copyImage(ctx, src, e, image, report); err != nil {
		return err
	}
	report(driver.PreloadProgress{Node: e.cfg.Name, Image: image, Status: "done"})
	return nil
}

// pull pulls image on e and waits for the pull to finish.
func (d *Driver) pull(ctx context.Context, e *engine, image string) error {
	resp, err := e.cli.ImagePull(ctx, image, client.ImagePullOptions{})
	if err != nil {
		d.noteErr(e, err)
		return classify(err, e, "pull "+image)
	}
	defer resp.Close()
	if err := resp.Wait(ctx); err != nil {
		return classify(err, e, "pull "+image)
	}
	return nil
}

// copyImage streams image from src to dst (save → load) without holding it
// in memory or on disk, reporting progress as bytes flow.
func (d *Driver) copyImage(ctx context.Context, src, dst *engine, image string, report func(driver.PreloadProgress)) error {
	var total int64
	if ii, err := src.cli.ImageInspect(ctx, image); err == nil {
		total = ii.Size
	}
	report(driver.PreloadProgress{Node: dst.cfg.Name, Image: image, Status: "copying from " + src.cfg.Name, Total: total})
	saved, err := src.cli.ImageSave(ctx, []string{image})
	if err != nil {
		d.noteErr(src, err)
		return classify(err, src, "save "+image)
	}
	defer saved.Close()
	cr := &countingReader{r: saved, every: 4 << 20, tick: func(n int64) {
		report(driver.PreloadProgress{Node: dst.cfg.Name, Image: image, Status: "copying from " + src.cfg.Name, Current: n, Total: total})
	}}
	loaded, err := dst.cli.ImageLoad(ctx, cr, client.ImageLoadWithQuiet(true))
	if err != nil {
		d.noteErr(dst, err)
		return classify(err, dst, "load "+image)
	}
	defer loaded.Close()
	dec := json.NewDecoder(loaded)
	for {
		var msg struct {
			Error       string `json:"error"`
			ErrorDetail *struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); err == io.EOF {
			break
		} else if err != nil {
			return classify(err, dst, "load "+image)
		}
		if msg.Error != "" {
			return driver.Errorf(driver.ErrPermanent, "engine %s: load %s: %s", dst.cfg.Name, image, msg.Error)
		}
	}
	ok, err := d.hasImage(ctx, dst, image)
	if err != nil {
		return err
	}
	if !ok {
		return driver.Errorf(driver.ErrPermanent, "engine %s: load %s from %s finished but the image is not there", dst.cfg.Name, image, src.cfg.Name)
	}
	report(driver.PreloadProgress{Node: dst.cfg.Name, Image: image, Status: "copied from " + src.cfg.Name, Current: cr.n, Total: total})
	return nil
}

type countingReader struct {
	r     io.Reader
	n     int64
	next  int64
	every int64
	tick  func(n int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n >= c.next {
		c.tick(c.n)
		c.next = c.n + c.every
	}
	return n, err
}

// Resize changes the cpu and memory limits of a running container (docker
// update). Zero fields are left as they are; disk, GPUs and other
// resources are ErrUnsupported.
func (d *Driver) Resize(ctx context.Context, id string, r driver.Resources) error {
	if r.Disk != 0 || r.GPUs != 0 || len(r.Other) > 0 {
		return driver.Errorf(driver.ErrUnsupported, "docker: only cpus and memory can be resized")
	}
	if err := driver.ValidateResources("", r); err != nil {
		return err
	}
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	res := &container.Resources{NanoCPUs: int64(r.CPU) * 1_000_000}
	if r.Memory > 0 {
		res.Memory, res.MemorySwap = int64(r.Memory), int64(r.Memory)
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	_, err = e.cli.ContainerUpdate(cctx, cid, client.ContainerUpdateOptions{Resources: res})
	e.mu.Lock()
	delete(e.limits, cid)
	e.mu.Unlock()
	return d.act(e, err, "resize container "+cid)
}

// Start starts a stopped or exited container.
func (d *Driver) Start(ctx context.Context, id string) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	_, err = e.cli.ContainerStart(cctx, cid, client.ContainerStartOptions{})
	return d.act(e, err, "start container "+cid)
}

// graceCtx bounds a stop or restart by call_timeout plus grace under ctx and
// returns grace in whole seconds, rounded up, as the engine takes it.
func (d *Driver) graceCtx(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc, int) {
	secs := int((grace + time.Second - 1) / time.Second)
	cctx, cancel := context.WithTimeout(ctx, d.opts.CallTimeout+grace)
	return cctx, cancel, secs
}

// Stop sends SIGTERM and, after grace, SIGKILL. Stopping a stopped
// container is not an error.
func (d *Driver) Stop(ctx context.Context, id string, grace time.Duration) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	cctx, cancel, secs := d.graceCtx(ctx, grace)
	defer cancel()
	_, err = e.cli.ContainerStop(cctx, cid, client.ContainerStopOptions{Timeout: &secs})
	return d.act(e, err, "stop container "+cid)
}

// Restart stops the container as Stop does and starts it again.
func (d *Driver) Restart(ctx context.Context, id string, grace time.Duration) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	cctx, cancel, secs := d.graceCtx(ctx, grace)
	defer cancel()
	_, err = e.cli.ContainerRestart(cctx, cid, client.ContainerRestartOptions{Timeout: &secs})
	return d.act(e, err, "restart container "+cid)
}

// Rename renames the container id on its engine (the engine's
// ContainerRename, which also renames it in the DNS of its networks).
func (d *Driver) Rename(ctx context.Context, id, name string) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	_, err = e.cli.ContainerRename(cctx, cid, client.ContainerRenameOptions{NewName: name})
	return d.callErr(ctx, e, err, "rename container "+cid+" to "+name)
}

var _ driver.Renamer = (*Driver)(nil)

// Kill sends signal ("TERM", "SIGKILL", "9", read by driver.ParseSignal)
// to the container's main process. A container that is not running gives
// ErrPermanent.
func (d *Driver) Kill(ctx context.Context, id string, signal string) error {
	name, _, err := driver.ParseSignal(signal)
	if err != nil {
		return fmt.Errorf("docker: kill: %w", err)
	}
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	_, err = e.cli.ContainerKill(cctx, cid, client.ContainerKillOptions{Signal: name})
	if cerrdefs.IsInvalidArgument(err) {
		return &driver.FieldError{Path: "signal", Reason: fmt.Sprintf("%q: %v", signal, err)}
	}
	return d.act(e, err, "kill container "+cid+" with "+name)
}

// Suspend pauses every process of the container (docker pause). A paused
// container is left as it is; one that is not running gives ErrPermanent.
func (d *Driver) Suspend(ctx context.Context, id string) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	_, err = e.cli.ContainerPause(cctx, cid, client.ContainerPauseOptions{})
	if cerrdefs.IsConflict(err) {
		// The engine refuses to pause a paused container as it refuses a
		// stopped one; only the first is success.
		ci, ierr := e.cli.ContainerInspect(cctx, cid, client.ContainerInspectOptions{})
		if ierr == nil && ci.Container.State != nil && ci.Container.State.Paused {
			return nil
		}
	}
	return d.act(e, err, "pause container "+cid)
}

// Resume unpauses a suspended container; one that is not paused gives
// ErrNotSuspended.
func (d *Driver) Resume(ctx context.Context, id string) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	ci, err := e.cli.ContainerInspect(cctx, cid, client.ContainerInspectOptions{})
	if err != nil {
		d.noteErr(e, err)
		return classify(err, e, "inspect container "+cid)
	}
	if ci.Container.State == nil || !ci.Container.State.Paused {
		return driver.Errorf(driver.ErrNotSuspended, "engine %s: container %s is not paused", e.cfg.Name, cid)
	}
	_, err = e.cli.ContainerUnpause(cctx, cid, client.ContainerUnpauseOptions{})
	if cerrdefs.IsConflict(err) {
		return fmt.Errorf("%w: engine %s: container %s: %w", driver.ErrNotSuspended, e.cfg.Name, cid, err)
	}
	return d.act(e, err, "unpause container "+cid)
}

// Logs copies the container's output, stdout and stderr to their own
// writers (the engine multiplexes them; stdcopy separates them). Tail keeps
// the last lines of each stream: the engine's own tail counts both streams
// together, so Logs reads the whole log and keeps the tail itself, then,
// with Follow, streams what comes after the last line it read.
func (d *Driver) Logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	if opts.Tail < 0 {
		return &driver.FieldError{Path: "tail", Reason: fmt.Sprintf("%d: must not be negative", opts.Tail)}
	}
	if !opts.Stdout && !opts.Stderr {
		opts.Stdout, opts.Stderr = true, true
	}
	if stdout == nil || !opts.Stdout {
		stdout = io.Discard
	}
	if stderr == nil || !opts.Stderr {
		stderr = io.Discard
	}
	read := func(lo client.ContainerLogsOptions, out, errOut io.Writer) error {
		lo.ShowStdout, lo.ShowStderr = opts.Stdout, opts.Stderr
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if !lo.Follow {
			cctx, cancel = d.callCtx(ctx)
		}
		defer cancel()
		rc, err := e.cli.ContainerLogs(cctx, cid, lo)
		if err != nil {
			d.noteErr(e, err)
			return classify(err, e, "logs of container "+cid)
		}
		defer rc.Close()
		if _, err := stdcopy.StdCopy(out, errOut, rc); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return classify(err, e, "read logs of container "+cid)
		}
		return nil
	}
	if opts.Tail == 0 {
		return read(client.ContainerLogsOptions{Follow: opts.Follow, Timestamps: opts.Timestamps}, stdout, stderr)
	}
	tailOut, tailErr := &lineTail{keep: opts.Tail, keepTS: opts.Timestamps}, &lineTail{keep: opts.Tail, keepTS: opts.Timestamps}
	if err := read(client.ContainerLogsOptions{Timestamps: true}, tailOut, tailErr); err != nil {
		return err
	}
	last := max(tailOut.lastTS, tailErr.lastTS)
	if err := tailOut.flush(stdout); err != nil {
		return err
	}
	if err := tailErr.flush(stderr); err != nil {
		return err
	}
	if !opts.Follow {
		return nil
	}
	lo := client.ContainerLogsOptions{Follow: true, Timestamps: true}
	if last != "" {
		if t, err := time.Parse(time.RFC3339Nano, last); err == nil {
			lo.Since = strconv.FormatFloat(float64(t.UnixNano())/1e9, 'f', 9, 64)
		}
	}
	return read(lo, &after{w: stdout, ts: last, keepTS: opts.Timestamps}, &after{w: stderr, ts: last, keepTS: opts.Timestamps})
}

// splitTS splits a log line the engine prefixed with its RFC 3339 time.
func splitTS(line string) (ts, rest string) {
	ts, rest, ok := strings.Cut(line, " ")
	if !ok {
		return "", line
	}
	return ts, rest
}

// lineTail keeps the last keep lines written to it, without their time
// stamps unless keepTS, and remembers the latest time stamp.
type lineTail struct {
	keep    int
	keepTS  bool
	partial string
	lines   []string
	lastTS  string
}

func (l *lineTail) Write(p []byte) (int, error) {
	l.partial += string(p)
	for {
		i := strings.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		ts, rest := splitTS(l.partial[:i+1])
		l.partial = l.partial[i+1:]
		l.lastTS = max(l.lastTS, ts)
		if l.keepTS {
			rest = ts + " " + rest
		}
		l.lines = append(l.lines, rest)
		if len(l.lines) > l.keep {
			l.lines = l.lines[1:]
		}
	}
}

func (l *lineTail) flush(w io.Writer) error {
	for _, line := range l.lines {
		if _, err := io.WriteString(w, line); err != nil {
			return err
		}
	}
	return nil
}

// after passes on the lines stamped later than ts, without their stamps.
type after struct {
	w       io.Writer
	keepTS  bool // write the time stamps
	ts      string
	partial string
}

func (a *after) Write(p []byte) (int, error) {
	a.partial += string(p)
	for {
		i := strings.IndexByte(a.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		ts, rest := splitTS(a.partial[:i+1])
		a.partial = a.partial[i+1:]
		if ts > a.ts || ts == "" {
			if a.keepTS && ts != "" {
				rest = ts + " " + rest
			}
			if _, err := io.WriteString(a.w, rest); err != nil {
				return 0, err
			}
		}
	}
}

// Usage measures the container's memory in use (without the page cache)
// and its cpu, averaged since the last Usage of it (within
// usageWindowMax), else over usageWindow. Each reading is one of the
// engine's one-shot samples: a two-sample reading would subscribe the
// container to the engine's stats collector, and a reading of hundreds of
// containers would cost the engine twice as much.
func (d *Driver) Usage(ctx context.Context, id string) (*driver.Usage, error) {
	e, cid, err := d.resolve(id)
	if err != nil {
		return nil, err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	read := func() (*container.StatsResponse, cpuReading, error) {
		s, err := oneStats(cctx, e.cli, cid)
		if err != nil {
			d.noteErr(e, err)
			return nil, cpuReading{}, classify(err, e, "stats of container "+cid)
		}
		r := cpuReading{total: s.CPUStats.CPUUsage.TotalUsage, at: s.Read}
		if r.at.IsZero() {
			r.at = time.Now()
		}
		return s, r, nil
	}
	s, now, err := read()
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	before, ok := e.cpuSeen[cid]
	e.cpuSeen[cid] = now
	e.mu.Unlock()
	if el := now.at.Sub(before.at); !ok || el < usageWindow/10 || el > usageWindowMax || now.total < before.total {
		// No reading to average from (or one too close, too old, or of
		// an earlier run of the container): read again after a while.
		t := time.NewTimer(usageWindow)
		select {
		case <-t.C:
		case <-cctx.Done():
			t.Stop()
			return nil, classify(cctx.Err(), e, "stats of container "+cid)
		}
		before = now
		if s, now, err = read(); err != nil {
			return nil, err
		}
		e.mu.Lock()
		e.cpuSeen[cid] = now
		e.mu.Unlock()
	}
	u := &driver.Usage{Time: now.at, Memory: memoryInUse(s)}
	if el := now.at.Sub(before.at); el > 0 && now.total >= before.total {
		u.CPU = driver.CPUs(float64(now.total-before.total) / float64(el.Nanoseconds()))
	}
	return u, nil
}

// usageWindow is how long Usage waits between its two readings of a
// container it has no recent reading of; a reading older than
// usageWindowMax is not averaged from.
const (
	usageWindow    = time.Second
	usageWindowMax = 10 * time.Minute
)

// cpuReading is a container's cpu time (ns) as the engine read it at at.
type cpuReading struct {
	total uint64
	at    time.Time
}

// Watch reports the life events of Berth's containers on every engine (start,
// die, oom, stop, pause, unpause, health, destroy) and engine status
// changes, calling fn from one goroutine at a time, until ctx ends. A broken
// event stream is reopened with backoff from where it broke.
func (d *Driver) Watch(ctx context.Context, fn func(driver.Event)) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return driver.Errorf(driver.ErrPermanent, "watch: the driver is closed")
	}
	sub := d.nextSub
	d.nextSub++
	nodeEvents := make(chan driver.Event, 64)
	d.subs[sub] = nodeEvents
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		if ch, ok := d.subs[sub]; ok {
			close(ch)
			delete(d.subs, sub)
		}
		d.mu.Unlock()
	}()

	var fmu sync.Mutex
	emit := func(ev driver.Event) {
		fmu.Lock()
		defer fmu.Unlock()
		if ctx.Err() == nil {
			fn(ev)
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, e := range d.engines {
		wg.Go(func() { d.watchEngine(wctx, e, emit) })
	}
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-nodeEvents:
			if !ok {
				return driver.Errorf(driver.ErrPermanent, "watch: the driver was closed")
			}
			emit(ev)
		}
	}
}

func (d *Driver) watchEngine(ctx context.Context, e *engine, emit func(driver.Event)) {
	backoff := d.opts.BackoffMin
	since := strconv.FormatInt(time.Now().Unix(), 10)
	for ctx.Err() == nil {
		f := make(client.Filters).Add("type", string(events.ContainerEventType)).Add("label", driver.TagManaged+"=true")
		res := e.cli.Events(ctx, client.EventsListOptions{Since: since, Filters: f})
		healthy := false
	stream:
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-res.Messages:
				healthy = true
				if m.TimeNano > 0 {
					since = strconv.FormatFloat(float64(m.TimeNano)/1e9, 'f', 9, 64)
				}
				if ev, ok := toEvent(e, m); ok {
					emit(ev)
				}
			case err := <-res.Err:
				if ctx.Err() != nil {
					return
				}
				d.noteErr(e, err)
				break stream
			}
		}
		if healthy {
			backoff = d.opts.BackoffMin
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, d.opts.BackoffMax)
	}
}

// toEvent maps an engine event onto Berth's, or reports false for events
// Berth does not track (attach, exec, copy...).
func toEvent(e *engine, m events.Message) (driver.Event, bool) {
	ev := driver.Event{Instance: instanceID(e, m.Actor.ID), Node: e.cfg.Name, Time: time.Unix(0, m.TimeNano)}
	if m.TimeNano == 0 {
		ev.Time = time.Unix(m.Time, 0)
	}
	_, ev.Tags = splitLabels(m.Actor.Attributes) // attributes hold the labels
	action := string(m.Action)
	switch {
	case m.Action == events.ActionStart || m.Action == events.ActionRestart:
		ev.Type, ev.State = driver.EventStart, driver.StateRunning
	case m.Action == events.ActionDie:
		ev.Type, ev.State = driver.EventDie, driver.StateExited
		ev.Message = "exit code " + m.Actor.Attributes["exitCode"]
	case m.Action == events.ActionOOM:
		ev.Type, ev.Message = driver.EventOOM, "out of memory"
	case m.Action == events.ActionStop:
		ev.Type, ev.State = driver.EventStop, driver.StateStopped
	case m.Action == events.ActionPause:
		ev.Type, ev.State = driver.EventSuspend, driver.StateSuspended
	case m.Action == events.ActionUnPause:
		ev.Type, ev.State = driver.EventResume, driver.StateRunning
	case m.Action == events.ActionDestroy:
		ev.Type = driver.EventDelete
	case strings.HasPrefix(action, "health_status"):
		ev.Type = driver.EventHealth
		ev.Message = strings.TrimSpace(strings.TrimPrefix(action, "health_status:"))
	default:
		return driver.Event{}, false
	}
	return ev, true
}

// SharedBackend: the engines are named by address, and every server with
// the same options reaches the same containers.
func (d *Driver) SharedBackend() bool { return true }

// Interface guards.
var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.ImageLister   = (*Driver)(nil)
	_ driver.Preloader     = (*Driver)(nil)
	_ driver.Resizer       = (*Driver)(nil)
	_ driver.Starter       = (*Driver)(nil)
	_ driver.Stopper       = (*Driver)(nil)
	_ driver.Restarter     = (*Driver)(nil)
	_ driver.Killer        = (*Driver)(nil)
	_ driver.Suspender     = (*Driver)(nil)
	_ driver.LogReader     = (*Driver)(nil)
	_ driver.EventWatcher  = (*Driver)(nil)
	_ driver.UsageReporter = (*Driver)(nil)
	_ driver.SharedBackend = (*Driver)(nil)
)
