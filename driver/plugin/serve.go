package plugin

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berth-dev/berth/driver"
)

// Serve serves the driver def as a plugin binary and returns when the host
// ends it. A plugin's main is:
//
//	func main() { plugin.Serve(mydriver.Definition, "1.2.0") }
//
// The host opens the driver with def's options, decoded and validated by
// def in the plugin, and reaches every optional capability the opened
// driver implements. What the driver writes to stdout or stderr never
// disturbs the protocol. version is shown by `berth drivers`.
func Serve(def driver.Definition, version string) {
	// The host may go away (a server killed and restarted) while the
	// plugin lives on: writing to its closed pipes must fail, not kill.
	signal.Ignore(syscall.SIGPIPE)
	logOut := os.Stderr // go-plugin swaps os.Stderr for its stdio stream
	s := newServer(def, version, slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelInfo})))
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         goplugin.PluginSet{pluginName: &grpcPlugin{srv: s}},
		GRPCServer:      goplugin.DefaultGRPCServer,
		Logger:          hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Warn, Output: logOut}),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.close(ctx)
}

// grpcPlugin is the go-plugin plugin: the service on the plugin side, the
// connection on the host side.
type grpcPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	srv *server
}

func (p *grpcPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	s.RegisterService(&serviceDesc, p.srv)
	return nil
}

func (p *grpcPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, cc *grpc.ClientConn) (any, error) {
	return cc, nil
}

// server is the plugin side: it opens the driver once and keeps the
// operations in flight by number.
type server struct {
	def     driver.Definition
	version string
	log     *slog.Logger

	// openMu serialises opening the driver; it is taken before mu.
	openMu sync.Mutex
	mu     sync.Mutex // guards the fields below
	d      driver.Driver
	key    string
	ops    map[uint64]*serverOp
	next   uint64
}

type serverOp struct {
	op     driver.Operation
	cancel context.CancelFunc
}

func newServer(def driver.Definition, version string, log *slog.Logger) *server {
	return &server{def: def, version: version, log: log, ops: map[uint64]*serverOp{}}
}

func (s *server) driver() (driver.Driver, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.d == nil {
		return nil, driver.Errorf(driver.ErrRetryable, "plugin %q: the driver is not open", s.def.Name)
	}
	return s.d, nil
}

func (s *server) close(ctx context.Context) {
	s.mu.Lock()
	d := s.d
	s.d = nil
	for id, o := range s.ops {
		o.cancel()
		delete(s.ops, id)
	}
	s.mu.Unlock()
	if d != nil {
		if err := d.Close(ctx); err != nil {
			s.log.Error("closing the driver", "error", err)
		}
	}
}

func (s *server) info(context.Context, *infoReq) (*infoReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &infoReply{Name: s.def.Name, Summary: s.def.Summary, Version: s.version, Options: s.def.Options(),
		Protocol: Protocol, Open: s.d != nil, Key: s.key}, nil
}

func (s *server) open(ctx context.Context, req *openReq) (*openReply, error) {
	// Opening may take a while (a back-end to reach): it holds openMu, not
	// mu, so that the host's health checks are answered meanwhile.
	s.openMu.Lock()
	defer s.openMu.Unlock()
	s.mu.Lock()
	d, key := s.d, s.key
	s.mu.Unlock()
	switch {
	case d == nil:
		var err error
		d, err = s.def.Open(ctx, req.Options, driver.Env{Provider: req.Provider, Cluster: req.Cluster, DataDir: req.DataDir, Logger: s.log})
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.d, s.key = d, req.Key
		s.mu.Unlock()
	case req.Key != key:
		return nil, driver.Errorf(driver.ErrInvalid, "plugin %q is open with other options; restart it", s.def.Name)
	default:
		// A host reattaches: the one that started the operations in
		// flight is gone, and nobody can advance them. They are
		// abandoned, as a create whose context ends.
		s.mu.Lock()
		for id, o := range s.ops {
			o.cancel()
			delete(s.ops, id)
		}
		s.mu.Unlock()
	}
	_, check := d.(driver.SpecChecker)
	return &openReply{Capabilities: driver.Capabilities(d), Features: driver.Features(d), CheckSpec: check}, nil
}

func (s *server) closeDriver(ctx context.Context, _ *emptyReq) (*emptyReply, error) {
	s.close(ctx)
	return &emptyReply{}, nil
}

func (s *server) state(ctx context.Context, _ *emptyReq) (*stateReply, error) {
	d, err := s.driver()
	if err != nil {
		return nil, err
	}
	st, err := d.State(ctx)
	return &stateReply{State: st}, err
}

// opContext is the context an operation runs under: the host's deadline,
// and an end when the host abandons it.
func opContext(deadline time.Time) (context.Context, context.CancelFunc) {
	if deadline.IsZero() {
		return context.WithCancel(context.Background())
	}
	return context.WithDeadline(context.Background(), deadline)
}

// keep makes the operation's first step and keeps the operation, unless
// that step ended it.
func (s *server) keep(ctx context.Context, op driver.Operation, cancel context.CancelFunc) *opReply {
	p, err := op.Advance(ctx)
	first := &advanceReply{Done: p.Done, Instance: p.Instance, Wait: p.Wait, Queued: p.Queued}
	first.setErr(err)
	if err != nil || p.Done {
		cancel()
		return &opReply{First: first}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.ops[s.next] = &serverOp{op: op, cancel: cancel}
	return &opReply{Op: s.next, First: first}
}

func (s *server) create(ctx context.Context, req *createReq) (*opReply, error) {
	d, err := s.driver()
	if err != nil {
		return nil, err
	}
	if req.Spec == nil {
		return nil, &driver.FieldError{Path: "spec", Reason: "required"}
	}
	octx, cancel := opContext(req.Deadline)
	op, err := d.Create(octx, req.Node, req.Spec)
	if err != nil {
		cancel()
		return nil, err
	}
	return s.keep(ctx, op, cancel), nil
}

func (s *server) delete(ctx context.Context, req *deleteReq) (*opReply, error) {
	d, err := s.driver()
	if err != nil {
		return nil, err
	}
	octx, cancel := opContext(req.Deadline)
	op, err := d.Delete(octx, req.ID)
	if err != nil {
		cancel()
		return nil, err
	}
	return s.keep(ctx, op, cancel), nil
}

func (s *server) advance(ctx context.Context, req *advanceReq) (*advanceReply, error) {
	s.mu.Lock()
	o := s.ops[req.Op]
	s.mu.Unlock()
	if o == nil {
		return nil, driver.Errorf(driver.ErrTimeout, "plugin %q: operation %d is unknown here (the plugin restarted?); it may or may not have happened", s.def.Name, req.Op)
	}
	p, err := o.op.Advance(ctx)
	if err != nil || p.Done {
		s.forget(req.Op)
	}
	return &advanceReply{Done: p.Done, Instance: p.Instance, Wait: p.Wait, Queued: p.Queued}, err
}

func (s *server) forget(id uint64) {
	s.mu.Lock()
	o := s.ops[id]
	delete(s.ops, id)
	s.mu.Unlock()
	if o != nil {
		o.cancel()
	}
}

func (s *server) abandon(_ context.Context, req *advanceReq) (*emptyReply, error) {
	s.forget(req.Op)
	return &emptyReply{}, nil
}

func (s *server) get(ctx context.Context, req *idReq) (*instanceReply, error) {
	d, err := s.driver()
	if err != nil {
		return nil, err
	}
	inst, err := d.Get(ctx, req.ID)
	return &instanceReply{Instance: inst}, err
}

func (s *server) find(ctx context.Context, req *idReq) (*instanceReply, error) {
	d, err := s.driver()
	if err != nil {
		return nil, err
	}
	inst, err := d.Find(ctx, req.Name)
	return &instanceReply{Instance: inst}, err
}

func (s *server) list(ctx context.Context, req *listReq) (*listReply, error) {
	d, err := s.driver()
	if err != nil {
		return nil, err
	}
	list, err := d.List(ctx, req.Tags)
	return &listReply{Instances: list}, err
}

// capability returns the opened driver as the optional interface T, or
// ErrUnsupported.
func capability[T any](s *server, c string) (T, error) {
	var zero T
	d, err := s.driver()
	if err != nil {
		return zero, err
	}
	t, ok := driver.As[T](d, c)
	if !ok {
		return zero, driver.Errorf(driver.ErrUnsupported, "plugin %q: the driver has no %s", s.def.Name, c)
	}
	return t, nil
}

func (s *server) checkSpec(_ context.Context, req *specReq) (*emptyReply, error) {
	d, err := s.driver()
	if err != nil {
		return nil, err
	}
	if c, ok := d.(driver.SpecChecker); ok && req.Spec != nil {
		return &emptyReply{}, c.CheckSpec(req.Spec)
	}
	return &emptyReply{}, nil
}

func (s *server) images(ctx context.Context, req *idReq) (*imagesReply, error) {
	il, err := capability[driver.ImageLister](s, driver.CapImages)
	if err != nil {
		return nil, err
	}
	imgs, err := il.Images(ctx, req.Node)
	return &imagesReply{Images: imgs}, err
}

// call1 runs a call of capability T that answers only an error.
func call1[T any](c string, fn func(ctx context.Context, t T, req *idReq) error) func(*server, context.Context, *idReq) (*emptyReply, error) {
	return func(s *server, ctx context.Context, req *idReq) (*emptyReply, error) {
		t, err := capability[T](s, c)
		if err != nil {
			return nil, err
		}
		return &emptyReply{}, fn(ctx, t, req)
	}
}

func (s *server) usage(ctx context.Context, req *idReq) (*usageReply, error) {
	u, err := capability[driver.UsageReporter](s, driver.CapUsage)
	if err != nil {
		return nil, err
	}
	use, err := u.Usage(ctx, req.ID)
	return &usageReply{Usage: use}, err
}

func (s *server) console(ctx context.Context, req *idReq) (*textReply, error) {
	c, err := capability[driver.ConsoleReader](s, driver.CapConsole)
	if err != nil {
		return nil, err
	}
	text, err := c.Console(ctx, req.ID)
	return &textReply{Text: text}, err
}

// sender sends stream messages from several goroutines, one at a time.
type sender struct {
	mu     sync.Mutex
	stream grpc.ServerStream
}

func (w *sender) send(m *streamMsg) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stream.SendMsg(m)
}

// streamWriter writes one output stream as messages.
type streamWriter struct {
	s      *sender
	stream int
}

func (w streamWriter) Write(p []byte) (int, error) {
	if err := w.s.send(&streamMsg{Stream: w.stream, Data: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// end sends the last message of a stream, with err.
func (w *sender) end(err error) error {
	m := &streamMsg{End: true}
	m.setErr(err)
	return w.send(m)
}

func (s *server) logs(stream grpc.ServerStream) error {
	var req logsReq
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	out := &sender{stream: stream}
	lr, err := capability[driver.LogReader](s, driver.CapLogs)
	if err == nil {
		err = lr.Logs(stream.Context(), req.ID, req.Opts, streamWriter{out, 1}, streamWriter{out, 2})
	}
	return out.end(err)
}

func (s *server) watch(stream grpc.ServerStream) error {
	var req emptyReq
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	out := &sender{stream: stream}
	w, err := capability[driver.EventWatcher](s, driver.CapEvents)
	if err == nil {
		err = w.Watch(stream.Context(), func(e driver.Event) { _ = out.send(&streamMsg{Event: &e}) })
	}
	return out.end(err)
}

func (s *server) preload(stream grpc.ServerStream) error {
	var req preloadReq
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	out := &sender{stream: stream}
	p, err := capability[driver.Preloader](s, driver.CapPreload)
	if err == nil {
		err = p.Preload(stream.Context(), req.Image, req.Nodes, func(pp driver.PreloadProgress) { _ = out.send(&streamMsg{Progress: &pp}) })
	}
	return out.end(err)
}

func (s *server) attach(stream grpc.ServerStream) error {
	var req attachReq
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	out := &sender{stream: stream}
	a, err := capability[driver.Attacher](s, driver.CapAttach)
	if err != nil {
		return out.end(err)
	}
	var stdin io.Reader
	if req.HasStdin {
		pr, pw := io.Pipe()
		defer pr.Close()
		stdin = pr
		go func() {
			for {
				var m attachReq
				if err := stream.RecvMsg(&m); err != nil {
					pw.CloseWithError(err)
					return
				}
				if len(m.Data) > 0 {
					if _, err := pw.Write(m.Data); err != nil {
						return
					}
				}
				if m.EOF {
					pw.Close()
					return
				}
			}
		}()
	}
	err = a.Attach(stream.Context(), req.ID, req.Opts, stdin, streamWriter{out, 1}, streamWriter{out, 2})
	return out.end(err)
}

// The service, method by method.
func unary[Req, Resp any, PR interface {
	*Resp
	answer
}](name string, fn func(*server, context.Context, *Req) (*Resp, error)) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		req := new(Req)
		if err := dec(req); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, r any) (any, error) {
			resp, err := fn(srv.(*server), ctx, r.(*Req))
			if resp == nil {
				resp = new(Resp)
			}
			PR(resp).setErr(err)
			return resp, nil
		}
		if icpt == nil {
			return h(ctx, req)
		}
		return icpt(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + serviceName + "/" + name}, h)
	}}
}

func streamDesc(name string, clientStreams bool, fn func(*server, grpc.ServerStream) error) grpc.StreamDesc {
	return grpc.StreamDesc{StreamName: name, ServerStreams: true, ClientStreams: clientStreams,
		Handler: func(srv any, stream grpc.ServerStream) error { return fn(srv.(*server), stream) }}
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		unary("Info", (*server).info),
		unary("Open", (*server).open),
		unary("Close", (*server).closeDriver),
		unary("State", (*server).state),
		unary("Create", (*server).create),
		unary("Delete", (*server).delete),
		unary("Advance", (*server).advance),
		unary("Abandon", (*server).abandon),
		unary("Get", (*server).get),
		unary("Find", (*server).find),
		unary("List", (*server).list),
		unary("CheckSpec", (*server).checkSpec),
		unary("Images", (*server).images),
		unary("Usage", (*server).usage),
		unary("Console", (*server).console),
		unary("Resize", call1(driver.CapResize, func(ctx context.Context, t driver.Resizer, r *idReq) error { return t.Resize(ctx, r.ID, r.Res) })),
		unary("Start", call1(driver.CapStart, func(ctx context.Context, t driver.Starter, r *idReq) error { return t.Start(ctx, r.ID) })),
		unary("Stop", call1(driver.CapStop, func(ctx context.Context, t driver.Stopper, r *idReq) error { return t.Stop(ctx, r.ID, r.Grace) })),
		unary("Restart", call1(driver.CapRestart, func(ctx context.Context, t driver.Restarter, r *idReq) error { return t.Restart(ctx, r.ID, r.Grace) })),
		unary("Kill", call1(driver.CapKill, func(ctx context.Context, t driver.Killer, r *idReq) error { return t.Kill(ctx, r.ID, r.Signal) })),
		unary("Suspend", call1(driver.CapSuspend, func(ctx context.Context, t driver.Suspender, r *idReq) error { return t.Suspend(ctx, r.ID) })),
		unary("Resume", call1(driver.CapSuspend, func(ctx context.Context, t driver.Suspender, r *idReq) error { return t.Resume(ctx, r.ID) })),
		unary("ResizeTTY", call1(driver.CapAttach, func(ctx context.Context, t driver.Attacher, r *idReq) error { return t.ResizeTTY(ctx, r.ID, r.Size) })),
		unary("Rename", call1(driver.CapRename, func(ctx context.Context, t driver.Renamer, r *idReq) error { return t.Rename(ctx, r.ID, r.Name) })),
		unary("RemoveVolume", call1(driver.CapVolumeRemove, func(ctx context.Context, t driver.VolumeRemover, r *idReq) error {
			return t.RemoveVolume(ctx, r.Node, r.Name)
		})),
		unary("ConnectNetwork", call1(driver.CapNetworkConnect, func(ctx context.Context, t driver.NetworkConnector, r *idReq) error {
			return t.ConnectNetwork(ctx, r.ID, r.Network, r.Aliases)
		})),
		unary("DisconnectNetwork", call1(driver.CapNetworkConnect, func(ctx context.Context, t driver.NetworkConnector, r *idReq) error {
			return t.DisconnectNetwork(ctx, r.ID, r.Network)
		})),
	},
	Streams: []grpc.StreamDesc{
		streamDesc("Logs", false, (*server).logs),
		streamDesc("Watch", false, (*server).watch),
		streamDesc("Preload", false, (*server).preload),
		streamDesc("Attach", true, (*server).attach),
	},
}
