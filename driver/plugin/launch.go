package plugin

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"google.golang.org/grpc"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/internal/procfs"
)

// Checksum returns the SHA-256 of the file at path, in hex.
func Checksum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// verify refuses a binary whose checksum is not want, naming the field.
func verify(path, want string) error {
	got, err := Checksum(path)
	if err != nil {
		return &driver.FieldError{Path: "path", Reason: fmt.Sprintf("plugin %s: %v", path, err)}
	}
	if !strings.EqualFold(got, want) {
		return &driver.FieldError{Path: "sha256", Reason: fmt.Sprintf("plugin %s has SHA-256 %s, not the %s configured: refused", path, got, want)}
	}
	return nil
}

// conn is one running plugin process and the connection to it.
type conn struct {
	gen    uint64
	pid    int
	cc     *grpc.ClientConn
	client *goplugin.Client
	// exited is closed once the process is gone.
	exited chan struct{}
	info   *infoReply
}

// kill ends the process at once (a hung or replaced plugin).
func (c *conn) kill() { _ = syscall.Kill(c.pid, syscall.SIGKILL) }

// stop closes the connection and ends the process: politely, then by
// force, and waits until it is gone (or ctx ends).
func (c *conn) stop(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.client.Kill() // go-plugin's shutdown, then a kill after 2s; it waits for the exit
	}()
	select {
	case <-done:
	case <-ctx.Done(): // a hung plugin does not answer the shutdown
		c.kill()
		<-done
	}
}

// attached is go-plugin's view of a process Berth started or reattached
// to: Berth waits for it and kills it.
type attached struct {
	pid    int
	exited chan struct{}
}

func (a *attached) Wait(ctx context.Context) error {
	select {
	case <-a.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (a *attached) Kill(context.Context) error { return syscall.Kill(a.pid, syscall.SIGKILL) }
func (a *attached) ID() string                 { return strconv.Itoa(a.pid) }
func (a *attached) PluginToHost(n, addr string) (string, string, error) {
	return n, addr, nil
}
func (a *attached) HostToPlugin(n, addr string) (string, string, error) {
	return n, addr, nil
}

// record is what the host keeps on disk about a running plugin, to
// reattach to it after a restart of the server.
type record struct {
	Pid     int    `json:"pid"`
	Network string `json:"network"`
	Addr    string `json:"addr"`
	Path    string `json:"path"`
	SHA256  string `json:"sha256"`
}

const recordFile = "plugin.json"

// lineLog writes what it is given to a logger, line by line, each line
// cut at 4 KiB.
type lineLog struct {
	mu   sync.Mutex
	log  *slog.Logger
	msg  string
	part []byte
}

func (w *lineLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part = append(w.part, p...)
	for {
		i := strings.IndexByte(string(w.part), '\n')
		if i < 0 {
			if len(w.part) > 4096 {
				w.log.Info(w.msg, "line", string(w.part[:4096]))
				w.part = w.part[:0]
			}
			return len(p), nil
		}
		line := w.part[:min(i, 4096)]
		w.log.Info(w.msg, "line", string(line))
		w.part = w.part[i+1:]
	}
}

// launch starts the plugin binary and reads its handshake, skipping
// whatever else it writes to stdout first.
func (h *Driver) launch(ctx context.Context, gen uint64) (*conn, error) {
	if err := verify(h.cfg.Path, h.cfg.SHA256); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(h.dir, "plugin.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(h.cfg.Path)
	cmd.Dir = h.dir
	cmd.Env = []string{
		Handshake.MagicCookieKey + "=" + Handshake.MagicCookieValue,
		"PLUGIN_PROTOCOL_VERSIONS=" + strconv.Itoa(Protocol),
		"PLUGIN_UNIX_SOCKET_DIR=" + h.sockDir,
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"TMPDIR=" + os.TempDir(),
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	// Its own process group: a signal to the server's group does not
	// reach it, and it outlives a server killed at once, to be reattached.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("plugin %s: %w", h.cfg.Path, err)
	}
	exited := make(chan struct{})
	lines := make(chan string)
	noise := &lineLog{log: h.log, msg: "plugin stdout"}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 4096), 64*1024)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			if !sent && isHandshake(line) {
				sent = true
				lines <- line
				continue
			}
			_, _ = noise.Write([]byte(line + "\n"))
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(exited)
	}()
	fail := func(err error) (*conn, error) {
		_ = cmd.Process.Kill()
		<-exited
		return nil, err
	}
	timer := time.NewTimer(h.cfg.StartTimeout)
	defer timer.Stop()
	var line string
	select {
	case line = <-lines:
	case <-exited:
		tail, _ := os.ReadFile(filepath.Join(h.dir, "plugin.log"))
		return nil, &driver.FieldError{Path: "path", Reason: fmt.Sprintf("plugin %s: exited before its handshake (%s): it is not a Berth driver plugin, or speaks another handshake: %s",
			h.cfg.Path, cmd.ProcessState, lastLine(tail))}
	case <-timer.C:
		return fail(driver.Errorf(driver.ErrTimeout, "plugin %s: no handshake within %s", h.cfg.Path, h.cfg.StartTimeout))
	case <-ctx.Done():
		return fail(fmt.Errorf("%w: plugin %s: %w", driver.ErrTimeout, h.cfg.Path, ctx.Err()))
	}
	rec, err := parseHandshake(line)
	if err != nil {
		return fail(&driver.FieldError{Path: "path", Reason: fmt.Sprintf("plugin %s: %v", h.cfg.Path, err)})
	}
	rec.Pid, rec.Path, rec.SHA256 = cmd.Process.Pid, h.cfg.Path, h.cfg.SHA256
	c, err := h.connect(ctx, gen, rec, exited)
	if err != nil {
		return fail(err)
	}
	return c, nil
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}

// isHandshake reports whether line looks like go-plugin's handshake line:
// core version|protocol version|network|address|protocol[|...].
func isHandshake(line string) bool {
	parts := strings.Split(line, "|")
	if len(parts) < 5 {
		return false
	}
	_, err1 := strconv.Atoi(parts[0])
	_, err2 := strconv.Atoi(parts[1])
	return err1 == nil && err2 == nil && (parts[2] == "unix" || parts[2] == "tcp")
}

func parseHandshake(line string) (record, error) {
	parts := strings.Split(line, "|")
	if parts[0] != strconv.Itoa(goplugin.CoreProtocolVersion) {
		return record{}, fmt.Errorf("go-plugin core protocol %s, want %d", parts[0], goplugin.CoreProtocolVersion)
	}
	if parts[1] != strconv.Itoa(Protocol) {
		return record{}, fmt.Errorf("speaks plugin protocol %s; this Berth speaks %d: refused", parts[1], Protocol)
	}
	if parts[4] != string(goplugin.ProtocolGRPC) {
		return record{}, fmt.Errorf("serves %s, not grpc: refused", parts[4])
	}
	return record{Network: parts[2], Addr: parts[3]}, nil
}

// connect dials a plugin that listens at rec and asks what it is.
func (h *Driver) connect(ctx context.Context, gen uint64, rec record, exited chan struct{}) (*conn, error) {
	var addr net.Addr
	var err error
	switch rec.Network {
	case "unix":
		addr, err = net.ResolveUnixAddr("unix", rec.Addr)
	default:
		addr, err = net.ResolveTCPAddr("tcp", rec.Addr)
	}
	if err != nil {
		return nil, err
	}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig: Handshake,
		Plugins:         goplugin.PluginSet{pluginName: &grpcPlugin{}},
		Reattach: &goplugin.ReattachConfig{Protocol: goplugin.ProtocolGRPC, ProtocolVersion: Protocol, Addr: addr, Pid: rec.Pid,
			ReattachFunc: func() (runner.AttachedRunner, error) { return &attached{pid: rec.Pid, exited: exited}, nil }},
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		SyncStdout:       &lineLog{log: h.log, msg: "plugin stdout"},
		SyncStderr:       &lineLog{log: h.log, msg: "plugin stderr"},
	})
	rpc, err := client.Client()
	if err != nil {
		client.Kill()
		return nil, driver.Errorf(driver.ErrRetryable, "plugin %s: connect: %v", h.cfg.Path, err)
	}
	raw, err := rpc.Dispense(pluginName)
	if err != nil {
		client.Kill()
		return nil, driver.Errorf(driver.ErrInvalid, "plugin %s: %v", h.cfg.Path, err)
	}
	c := &conn{gen: gen, pid: rec.Pid, cc: raw.(*grpc.ClientConn), client: client, exited: exited}
	var info infoReply
	if err := c.invoke(ctx, "Info", &infoReq{}, &info, false); err != nil {
		client.Kill()
		return nil, err
	}
	if info.Protocol != Protocol {
		client.Kill()
		return nil, driver.Errorf(driver.ErrInvalid, "plugin %s speaks plugin protocol %d; this Berth speaks %d: refused", h.cfg.Path, info.Protocol, Protocol)
	}
	c.info = &info
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(h.dir, recordFile), b, 0o600); err != nil {
		client.Kill()
		return nil, err
	}
	return c, nil
}

// reattach connects to the plugin a previous server left running, if its
// record names a live process running the configured binary.
func (h *Driver) reattach(ctx context.Context, gen uint64) (*conn, bool) {
	b, err := os.ReadFile(filepath.Join(h.dir, recordFile))
	if err != nil {
		return nil, false
	}
	var rec record
	if json.Unmarshal(b, &rec) != nil || rec.Pid <= 0 || rec.Path == "" {
		return nil, false
	}
	// Only a process running the recorded binary (or a binary since
	// replaced at that path) is the plugin: a pid may have been reused.
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", rec.Pid))
	if err != nil || (exe != rec.Path && exe != rec.Path+" (deleted)") {
		return nil, false
	}
	if rec.Path != h.cfg.Path || !strings.EqualFold(rec.SHA256, h.cfg.SHA256) || exe != h.cfg.Path {
		h.log.Info("the plugin left running is another binary now; ending it", "pid", rec.Pid, "was", rec.Path)
		_ = syscall.Kill(rec.Pid, syscall.SIGKILL)
		return nil, false
	}
	exited := make(chan struct{})
	stop := make(chan struct{})
	go func() { // not a child: watch that it lives
		defer close(exited)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			if syscall.Kill(rec.Pid, 0) != nil {
				return
			}
			if !procfs.Running(rec.Pid) {
				return
			}
			select {
			case <-t.C:
			case <-stop:
				return
			}
		}
	}()
	c, err := h.connect(ctx, gen, rec, exited)
	if err != nil {
		h.log.Warn("cannot reattach to the plugin; killing it and starting it anew", "pid", rec.Pid, "error", err)
		_ = syscall.Kill(rec.Pid, syscall.SIGKILL)
		close(stop)
		<-exited
		return nil, false
	}
	h.log.Info("reattached to the plugin", "pid", rec.Pid)
	return c, true
}

// maxAnswer bounds one answer of the plugin: a listing of a few hundred
// thousand instances.
const maxAnswer = 512 << 20

// invoke makes one unary call. A call that did not reach the plugin is
// ErrRetryable; one whose answer was lost is ErrTimeout for a change (it
// may have happened) and ErrRetryable for a read.
func (c *conn) invoke(ctx context.Context, method string, req any, resp answer, change bool) error {
	err := c.cc.Invoke(ctx, "/"+serviceName+"/"+method, req, resp, grpc.CallContentSubtype(codecName), grpc.MaxCallRecvMsgSize(maxAnswer))
	if err != nil {
		return transportError(ctx, method, err, change)
	}
	return resp.error()
}

func transportError(ctx context.Context, method string, err error, change bool) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: plugin %s: %w", driver.ErrTimeout, method, ctx.Err())
	}
	if change {
		return fmt.Errorf("%w: plugin %s: the plugin did not answer, the change may or may not have happened: %v", driver.ErrTimeout, method, err)
	}
	return fmt.Errorf("%w: plugin %s: %v", driver.ErrRetryable, method, err)
}
