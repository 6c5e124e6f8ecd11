package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/berth-dev/berth/driver"
)

// Config says which plugin binary to run and how.
type Config struct {
	// Path is the plugin binary, an absolute path.
	Path string
	// SHA256 is the binary's checksum in hex; a binary that does not
	// match is refused, at open and at every restart.
	SHA256 string
	// Options are the driver's options, decoded by the plugin.
	Options map[string]any
	// Env is what the driver is opened with. Env.DataDir also holds the
	// plugin's socket, its log and its record for reattaching.
	Env driver.Env
	// MinBackoff and MaxBackoff bound the wait before a restart: it doubles
	// from the first to the second while the plugin keeps failing.
	// Defaults 500ms and 30s.
	MinBackoff, MaxBackoff time.Duration
	// PingInterval is how often the host checks that the plugin answers;
	// PingFailures checks in a row without an answer within PingTimeout
	// make it a hung plugin, killed and restarted. Defaults 2s, 3, 5s.
	PingInterval time.Duration
	PingFailures int
	PingTimeout  time.Duration
	// StartTimeout bounds a start up to the handshake. Default 30s.
	StartTimeout time.Duration
}

// Driver is the host side of a plugin: a driver.Driver whose calls go to
// the plugin process. It has every optional interface's methods and, as a
// driver.Forwarder, says which the plugin's driver really has. It starts
// the plugin, reattaches to one a previous server left running, and
// restarts it with back-off when it crashes or hangs; calls made while it
// is down fail with ErrRetryable, and operations it was running end with
// ErrTimeout (they may or may not have happened: the caller looks the
// instance up, as after a restart of the server).
type Driver struct {
	cfg Config
	dir string
	// sockDir holds the plugin's socket: dir, or a short temporary
	// directory when dir's path is too long for a socket's.
	sockDir string
	log     *slog.Logger
	key     string
	done    chan struct{}
	wg      sync.WaitGroup

	// mu guards the fields below. Lock order: a hostOp's mu, then this
	// one; nothing is called on the plugin while it is held.
	mu     sync.Mutex
	cur    *conn // nil while the plugin is down
	gen    uint64
	opened *openReply
	info   *infoReply // what the plugin said of itself at its last start
	closed bool
}

// maxSocketDir is the longest directory a socket is made in: a Unix
// socket's path is at most 107 bytes, and go-plugin adds a name of about 20.
const maxSocketDir = 80

// Open starts (or reattaches to) the plugin and opens its driver with
// cfg.Options. A bad checksum, a binary that is not a plugin or speaks
// another protocol, and options the plugin refuses are errors naming the
// field (sha256, path, options.<name>).
func Open(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 500 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = 2 * time.Second
	}
	if cfg.PingFailures <= 0 {
		cfg.PingFailures = 3
	}
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = 5 * time.Second
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	h := &Driver{cfg: cfg, log: cfg.Env.Logger, done: make(chan struct{})}
	if h.log == nil {
		h.log = slog.Default()
	}
	h.log = h.log.With("plugin", cfg.Path)
	if err := verify(cfg.Path, cfg.SHA256); err != nil {
		return nil, err
	}
	h.dir = cfg.Env.DataDir
	if h.dir == "" {
		dir, err := os.MkdirTemp("", "berth-plugin-")
		if err != nil {
			return nil, err
		}
		h.dir = dir
	} else if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return nil, err
	}
	h.sockDir = h.dir
	if len(h.dir) > maxSocketDir {
		dir, err := os.MkdirTemp("", "berth-plugin-")
		if err != nil {
			return nil, err
		}
		h.sockDir = dir
	}
	opts, err := json.Marshal(cfg.Options)
	if err != nil {
		return nil, &driver.FieldError{Path: "options", Reason: err.Error()}
	}
	sum := sha256.Sum256(opts)
	h.key = hex.EncodeToString(sum[:])
	c, err := h.start(ctx)
	if err != nil {
		if h.sockDir != h.dir {
			_ = os.RemoveAll(h.sockDir)
		}
		if cfg.Env.DataDir == "" {
			_ = os.RemoveAll(h.dir)
		}
		return nil, err
	}
	h.cur = c
	h.wg.Add(1)
	go h.supervise()
	return h, nil
}

// start reattaches to a plugin left running or launches one, and opens its
// driver.
func (h *Driver) start(ctx context.Context) (*conn, error) {
	h.mu.Lock()
	h.gen++
	gen := h.gen
	h.mu.Unlock()
	c, ok := h.reattach(ctx, gen)
	if ok && c.info.Open && c.info.Key != h.key {
		h.log.Info("the plugin left running has other options; starting it anew", "pid", c.pid)
		stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c.stop(stopCtx)
		cancel()
		ok = false
	}
	if !ok {
		var err error
		if c, err = h.launch(ctx, gen); err != nil {
			return nil, err
		}
	}
	var r openReply
	env := h.cfg.Env
	err := c.invoke(ctx, "Open", &openReq{Options: h.cfg.Options, Provider: env.Provider, Cluster: env.Cluster, DataDir: env.DataDir, Key: h.key}, &r, true)
	if err != nil {
		stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.stop(stopCtx)
		var es driver.FieldErrors
		es.AddErr("options", err)
		if len(es) > 0 && driver.ClassOf(err) == driver.ErrInvalid {
			return nil, fmt.Errorf("plugin %s: %w", h.cfg.Path, es)
		}
		return nil, fmt.Errorf("plugin %s: open: %w", h.cfg.Path, err)
	}
	h.mu.Lock()
	h.opened, h.info = &r, c.info
	h.mu.Unlock()
	return c, nil
}

// supervise watches the plugin: a crash or a hang (PingFailures pings
// unanswered) brings a restart after a back-off that doubles while the
// plugin keeps failing.
func (h *Driver) supervise() {
	defer h.wg.Done()
	backoff := h.cfg.MinBackoff
	for {
		h.mu.Lock()
		c := h.cur
		h.mu.Unlock()
		started := time.Now()
		if c != nil && !h.watch(c) {
			return
		}
		h.mu.Lock()
		h.cur = nil
		h.mu.Unlock()
		if c != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c.stop(ctx)
			cancel()
			if time.Since(started) > time.Minute {
				backoff = h.cfg.MinBackoff
			}
		}
		h.log.Warn("plugin down; restarting it", "after", backoff)
		select {
		case <-h.done:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, h.cfg.MaxBackoff)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-h.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		nc, err := h.start(ctx)
		cancel()
		if err != nil {
			h.log.Error("restarting the plugin", "error", err)
			continue
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			nc.stop(sctx)
			scancel()
			return
		}
		h.cur = nc
		h.mu.Unlock()
		h.log.Info("plugin restarted", "pid", nc.pid)
	}
}

// watch returns false when the driver is closed and true when c is down
// (exited, or hung and killed).
func (h *Driver) watch(c *conn) bool {
	t := time.NewTicker(h.cfg.PingInterval)
	defer t.Stop()
	misses := 0
	for {
		select {
		case <-h.done:
			return false
		case <-c.exited:
			h.log.Warn("plugin exited", "pid", c.pid)
			return true
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), h.cfg.PingTimeout)
		err := c.invoke(ctx, "Info", &infoReq{}, &infoReply{}, false)
		cancel()
		if err == nil {
			misses = 0
			continue
		}
		if misses++; misses >= h.cfg.PingFailures {
			h.log.Warn("plugin does not answer; killing it", "pid", c.pid, "error", err)
			c.kill()
			<-c.exited
			return true
		}
	}
}

// conn returns the running plugin, or ErrRetryable while it is down.
func (h *Driver) conn() (*conn, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, driver.Errorf(driver.ErrRetryable, "plugin %s: closed", h.cfg.Path)
	}
	if h.cur == nil {
		return nil, driver.Errorf(driver.ErrRetryable, "plugin %s: down, restarting", h.cfg.Path)
	}
	return h.cur, nil
}

func (h *Driver) call(ctx context.Context, method string, req any, resp answer, change bool) error {
	c, err := h.conn()
	if err != nil {
		return err
	}
	return c.invoke(ctx, method, req, resp, change)
}

// Info is what a running plugin says of itself.
type Info struct {
	Name, Summary, Version string
	Options                []driver.Option
	Capabilities           []string
}

// Info returns what the plugin says of itself, as it said at its last
// start (also while it is down).
func (h *Driver) Info() Info {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out Info
	if i := h.info; i != nil {
		out = Info{Name: i.Name, Summary: i.Summary, Version: i.Version, Options: i.Options}
	}
	if h.opened != nil {
		out.Capabilities = h.opened.Capabilities
	}
	return out
}

// Pid returns the plugin's process id, 0 while it is down.
func (h *Driver) Pid() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == nil {
		return 0
	}
	return h.cur.pid
}

// SharedBackend reports whether the plugin's driver says every server
// reaches its instances (driver.SharedBackend).
func (h *Driver) SharedBackend() bool { return h.Has(driver.CapShared) }

// Has reports whether the plugin's driver has capability c.
func (h *Driver) Has(c string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.opened != nil && slices.Contains(h.opened.Capabilities, c)
}

// Features returns the kinds and features the plugin's driver declares.
func (h *Driver) Features() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.opened == nil {
		return nil
	}
	return slices.Clone(h.opened.Features)
}

func (h *Driver) State(ctx context.Context) (*driver.PlatformState, error) {
	var r stateReply
	if err := h.call(ctx, "State", &emptyReq{}, &r, false); err != nil {
		return nil, err
	}
	return r.State, nil
}

func (h *Driver) Create(ctx context.Context, node string, spec *driver.Spec) (driver.Operation, error) {
	dl, _ := ctx.Deadline()
	return h.startOp(ctx, "Create", &createReq{Node: node, Spec: spec, Deadline: dl})
}

func (h *Driver) Delete(ctx context.Context, id string) (driver.Operation, error) {
	dl, _ := ctx.Deadline()
	return h.startOp(ctx, "Delete", &deleteReq{ID: id, Deadline: dl})
}

func (h *Driver) startOp(ctx context.Context, method string, req any) (driver.Operation, error) {
	c, err := h.conn()
	if err != nil {
		return nil, err
	}
	var r opReply
	if err := c.invoke(ctx, method, req, &r, true); err != nil {
		return nil, err
	}
	o := &hostOp{h: h, c: c, id: r.Op, what: method, ctx: ctx, first: r.First}
	if f := r.First; f != nil && (f.Err != nil || f.Done) {
		o.stop = func() bool { return false }
	} else {
		o.stop = context.AfterFunc(ctx, o.abandon)
	}
	return o, nil
}

// hostOp is an operation running in the plugin.
type hostOp struct {
	h    *Driver
	c    *conn
	id   uint64
	what string
	ctx  context.Context // the operation's own, from Create or Delete
	stop func() bool
	// first is what the plugin's first Advance reported, given back by
	// the first Advance here.
	first *advanceReply

	mu   sync.Mutex // guards the fields below; taken before Driver.mu
	over bool
	p    driver.Progress
	err  error
}

// abandon tells the plugin the operation's context ended.
func (o *hostOp) abandon() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = o.c.invoke(ctx, "Abandon", &advanceReq{Op: o.id}, &emptyReply{}, false)
}

func (o *hostOp) Advance(ctx context.Context) (driver.Progress, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.over {
		return o.p, o.err
	}
	if f := o.first; f != nil {
		o.first = nil
		p, err := driver.Progress{Done: f.Done, Instance: f.Instance, Wait: f.Wait, Queued: f.Queued}, f.error()
		if err != nil || p.Done {
			return o.finish(p, err)
		}
		return p, nil
	}
	if cur, _ := o.h.conn(); cur != o.c {
		return o.finish(driver.Progress{}, driver.Errorf(driver.ErrTimeout, "plugin %s: %s: the plugin restarted during the operation; it may or may not have happened", o.h.cfg.Path, o.what))
	}
	if err := o.ctx.Err(); err != nil {
		return o.finish(driver.Progress{}, fmt.Errorf("%w: plugin %s: %s: %w", driver.ErrTimeout, o.h.cfg.Path, o.what, err))
	}
	var r advanceReply
	err := o.c.invoke(ctx, "Advance", &advanceReq{Op: o.id}, &r, true)
	p := driver.Progress{Done: r.Done, Instance: r.Instance, Wait: r.Wait, Queued: r.Queued}
	if err != nil || p.Done {
		return o.finish(p, err)
	}
	return p, nil
}

func (o *hostOp) finish(p driver.Progress, err error) (driver.Progress, error) {
	o.over, o.p, o.err = true, p, err
	o.stop()
	return p, err
}

func (h *Driver) Get(ctx context.Context, id string) (*driver.Instance, error) {
	var r instanceReply
	if err := h.call(ctx, "Get", &idReq{ID: id}, &r, false); err != nil {
		return nil, err
	}
	return r.Instance, nil
}

func (h *Driver) Find(ctx context.Context, name string) (*driver.Instance, error) {
	var r instanceReply
	if err := h.call(ctx, "Find", &idReq{Name: name}, &r, false); err != nil {
		return nil, err
	}
	return r.Instance, nil
}

func (h *Driver) List(ctx context.Context, tags map[string]string) ([]*driver.Instance, error) {
	var r listReply
	err := h.call(ctx, "List", &listReq{Tags: tags}, &r, false)
	return r.Instances, err
}

// Close closes the plugin's driver and ends the plugin; its instances keep
// running.
func (h *Driver) Close(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	c := h.cur
	h.cur = nil
	h.mu.Unlock()
	close(h.done)
	h.wg.Wait()
	var err error
	if c != nil {
		err = c.invoke(ctx, "Close", &emptyReq{}, &emptyReply{}, true)
		c.stop(ctx)
	}
	_ = os.Remove(filepath.Join(h.dir, recordFile))
	if h.sockDir != h.dir {
		_ = os.RemoveAll(h.sockDir)
	}
	if h.cfg.Env.DataDir == "" {
		_ = os.RemoveAll(h.dir)
	}
	return err
}

// CheckSpec asks the plugin's driver why it could never run spec.
func (h *Driver) CheckSpec(spec *driver.Spec) error {
	h.mu.Lock()
	check := h.opened != nil && h.opened.CheckSpec
	h.mu.Unlock()
	if !check {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.PingTimeout)
	defer cancel()
	err := h.call(ctx, "CheckSpec", &specReq{Spec: spec}, &emptyReply{}, false)
	if driver.ClassOf(err) == driver.ErrInvalid || driver.ClassOf(err) == driver.ErrUnsupported {
		return err
	}
	return nil // a plugin that cannot answer now refuses nothing: create will tell
}

func (h *Driver) Images(ctx context.Context, node string) ([]driver.Image, error) {
	var r imagesReply
	if err := h.call(ctx, "Images", &idReq{Node: node}, &r, false); err != nil {
		return nil, err
	}
	return r.Images, nil
}

func (h *Driver) Resize(ctx context.Context, id string, res driver.Resources) error {
	return h.call(ctx, "Resize", &idReq{ID: id, Res: res}, &emptyReply{}, true)
}

func (h *Driver) Start(ctx context.Context, id string) error {
	return h.call(ctx, "Start", &idReq{ID: id}, &emptyReply{}, true)
}

func (h *Driver) Stop(ctx context.Context, id string, grace time.Duration) error {
	return h.call(ctx, "Stop", &idReq{ID: id, Grace: grace}, &emptyReply{}, true)
}

func (h *Driver) Restart(ctx context.Context, id string, grace time.Duration) error {
	return h.call(ctx, "Restart", &idReq{ID: id, Grace: grace}, &emptyReply{}, true)
}

func (h *Driver) Kill(ctx context.Context, id string, signal string) error {
	return h.call(ctx, "Kill", &idReq{ID: id, Signal: signal}, &emptyReply{}, true)
}

func (h *Driver) Suspend(ctx context.Context, id string) error {
	return h.call(ctx, "Suspend", &idReq{ID: id}, &emptyReply{}, true)
}

func (h *Driver) Resume(ctx context.Context, id string) error {
	return h.call(ctx, "Resume", &idReq{ID: id}, &emptyReply{}, true)
}

func (h *Driver) ResizeTTY(ctx context.Context, id string, size driver.TTYSize) error {
	return h.call(ctx, "ResizeTTY", &idReq{ID: id, Size: size}, &emptyReply{}, true)
}

func (h *Driver) Rename(ctx context.Context, id, name string) error {
	return h.call(ctx, "Rename", &idReq{ID: id, Name: name}, &emptyReply{}, true)
}

func (h *Driver) RemoveVolume(ctx context.Context, node, name string) error {
	return h.call(ctx, "RemoveVolume", &idReq{Node: node, Name: name}, &emptyReply{}, true)
}

func (h *Driver) ConnectNetwork(ctx context.Context, id, network string, aliases []string) error {
	return h.call(ctx, "ConnectNetwork", &idReq{ID: id, Network: network, Aliases: aliases}, &emptyReply{}, true)
}

func (h *Driver) DisconnectNetwork(ctx context.Context, id, network string) error {
	return h.call(ctx, "DisconnectNetwork", &idReq{ID: id, Network: network}, &emptyReply{}, true)
}

func (h *Driver) Usage(ctx context.Context, id string) (*driver.Usage, error) {
	var r usageReply
	if err := h.call(ctx, "Usage", &idReq{ID: id}, &r, false); err != nil {
		return nil, err
	}
	return r.Usage, nil
}

func (h *Driver) Console(ctx context.Context, id string) (string, error) {
	var r textReply
	if err := h.call(ctx, "Console", &idReq{ID: id}, &r, false); err != nil {
		return "", err
	}
	return r.Text, nil
}

// stream opens a stream to the plugin and sends its first message.
func (h *Driver) stream(ctx context.Context, method string, clientStreams bool, first any) (grpc.ClientStream, error) {
	c, err := h.conn()
	if err != nil {
		return nil, err
	}
	desc := &grpc.StreamDesc{StreamName: method, ServerStreams: true, ClientStreams: clientStreams}
	st, err := c.cc.NewStream(ctx, desc, "/"+serviceName+"/"+method, grpc.CallContentSubtype(codecName))
	if err != nil {
		return nil, transportError(ctx, method, err, false)
	}
	if err := st.SendMsg(first); err != nil {
		return nil, transportError(ctx, method, err, false)
	}
	if !clientStreams {
		if err := st.CloseSend(); err != nil {
			return nil, transportError(ctx, method, err, false)
		}
	}
	return st, nil
}

// receive reads a stream's messages into fn until its last one, and
// returns the error that one carries.
func receive(ctx context.Context, method string, st grpc.ClientStream, fn func(*streamMsg) error) error {
	for {
		var m streamMsg
		if err := st.RecvMsg(&m); err != nil {
			if err == io.EOF {
				return driver.Errorf(driver.ErrRetryable, "plugin %s: the stream ended early", method)
			}
			return transportError(ctx, method, err, false)
		}
		if m.End {
			return m.error()
		}
		if err := fn(&m); err != nil {
			return err
		}
	}
}

func (h *Driver) Logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := h.stream(ctx, "Logs", false, &logsReq{ID: id, Opts: opts})
	if err != nil {
		return err
	}
	return receive(ctx, "Logs", st, func(m *streamMsg) error { return writeTo(m, stdout, stderr) })
}

func writeTo(m *streamMsg, stdout, stderr io.Writer) error {
	w := stdout
	if m.Stream == 2 {
		w = stderr
	}
	if w == nil || len(m.Data) == 0 {
		return nil
	}
	_, err := w.Write(m.Data)
	return err
}

func (h *Driver) Watch(ctx context.Context, fn func(driver.Event)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := h.stream(ctx, "Watch", false, &emptyReq{})
	if err != nil {
		return err
	}
	err = receive(ctx, "Watch", st, func(m *streamMsg) error {
		if m.Event != nil {
			fn(*m.Event)
		}
		return nil
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (h *Driver) Preload(ctx context.Context, image string, nodes []string, progress func(driver.PreloadProgress)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := h.stream(ctx, "Preload", false, &preloadReq{Image: image, Nodes: nodes})
	if err != nil {
		return err
	}
	return receive(ctx, "Preload", st, func(m *streamMsg) error {
		if m.Progress != nil && progress != nil {
			progress(*m.Progress)
		}
		return nil
	})
}

func (h *Driver) Attach(ctx context.Context, id string, opts driver.AttachOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := h.stream(ctx, "Attach", true, &attachReq{ID: id, Opts: opts, HasStdin: stdin != nil})
	if err != nil {
		return err
	}
	if stdin != nil {
		go func() {
			buf := make([]byte, 32*1024)
			for {
				n, rerr := stdin.Read(buf)
				if n > 0 {
					if st.SendMsg(&attachReq{Data: buf[:n]}) != nil {
						return
					}
				}
				if rerr != nil {
					_ = st.SendMsg(&attachReq{EOF: true})
					_ = st.CloseSend()
					return
				}
			}
		}()
	} else {
		_ = st.CloseSend()
	}
	err = receive(ctx, "Attach", st, func(m *streamMsg) error { return writeTo(m, stdout, stderr) })
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Every optional interface; Has says which the plugin's driver has.
var (
	_ driver.Driver           = (*Driver)(nil)
	_ driver.Forwarder        = (*Driver)(nil)
	_ driver.FeatureReporter  = (*Driver)(nil)
	_ driver.SpecChecker      = (*Driver)(nil)
	_ driver.ImageLister      = (*Driver)(nil)
	_ driver.Preloader        = (*Driver)(nil)
	_ driver.Resizer          = (*Driver)(nil)
	_ driver.Starter          = (*Driver)(nil)
	_ driver.Stopper          = (*Driver)(nil)
	_ driver.Restarter        = (*Driver)(nil)
	_ driver.Killer           = (*Driver)(nil)
	_ driver.Suspender        = (*Driver)(nil)
	_ driver.LogReader        = (*Driver)(nil)
	_ driver.Attacher         = (*Driver)(nil)
	_ driver.EventWatcher     = (*Driver)(nil)
	_ driver.UsageReporter    = (*Driver)(nil)
	_ driver.ConsoleReader    = (*Driver)(nil)
	_ driver.Renamer          = (*Driver)(nil)
	_ driver.VolumeRemover    = (*Driver)(nil)
	_ driver.NetworkConnector = (*Driver)(nil)
	_ driver.SharedBackend    = (*Driver)(nil)
)

// Path returns the plugin binary's path.
func (h *Driver) Path() string { return h.cfg.Path }

// Describe starts the plugin at path, after checking its checksum, asks it
// what it serves (its driver's name, version and the options it declares)
// and ends it, for a configuration checked before the server starts.
func Describe(ctx context.Context, path, sha256 string) (Info, error) {
	dir, err := os.MkdirTemp("", "berth-plugin-")
	if err != nil {
		return Info{}, err
	}
	defer os.RemoveAll(dir)
	h := &Driver{cfg: Config{Path: path, SHA256: sha256, StartTimeout: 30 * time.Second}, dir: dir, sockDir: dir, log: slog.Default().With("plugin", path)}
	c, err := h.launch(ctx, 0)
	if err != nil {
		return Info{}, err
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	c.stop(stopCtx)
	return Info{Name: c.info.Name, Summary: c.info.Summary, Version: c.info.Version, Options: c.info.Options}, nil
}
