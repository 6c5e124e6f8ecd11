package ssh

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/berth-dev/berth/driver"
)

// errKeyRefused marks a host whose key was not accepted.
var errKeyRefused = errors.New("host key refused")

// errNotSent marks a command that never reached the host.
var errNotSent = errors.New("the command was not sent")

// host is one machine and its one connection, which every call shares.
type host struct {
	d     *Driver
	cfg   Host
	name  string
	slots chan struct{} // one per channel open at once (max_channels)
	// turns holds one token per create or delete in flight on the host,
	// max_channels of them: an operation waits its turn once, then runs
	// to its end, its commands rarely waiting for a channel, rather than
	// every waiting operation's first command going before any's second.
	turns chan struct{}

	// Lock order (see Driver): createMu, installMu, dialMu, mu.
	createMu  sync.Mutex // held by a create counting against max_instances
	installMu sync.Mutex // held while installing the supervisor
	dialMu    sync.Mutex // held while dialling

	mu        sync.Mutex    // guards what follows
	client    *gossh.Client // nil while the host is not connected
	reason    string        // why it is offline
	facts     facts
	installed string // the supervisor's path on the host once it is there
	// limits is "ok" when the instances' cpu and memory limits can be
	// held (by the cgroups the supervisor makes, or by systemd), else why
	// not; known once installed.
	limits string
	// supervisor is how the instances made from now on are supervised:
	// SupervisionSystemd or SupervisionProcess; known once installed.
	supervisor string
}

// facts are what a host says of itself when it is connected.
type facts struct {
	cpus   int64
	memory int64
	disk   int64
	kernel string
	arch   string
}

// hostKeyCallback checks a host's key: against the pinned key when the
// host has one, else against known_hosts (adding an unknown host there
// when trust_on_first_use is set). A refusal names the host.
func (d *Driver) hostKeyCallback(h Host) (gossh.HostKeyCallback, []string, error) {
	name := h.name()
	if h.HostKey != "" {
		pinned, _, _, _, err := gossh.ParseAuthorizedKey([]byte(h.HostKey))
		if err != nil {
			return nil, nil, err
		}
		cb := func(_ string, _ net.Addr, key gossh.PublicKey) error {
			if bytes.Equal(key.Marshal(), pinned.Marshal()) {
				return nil
			}
			return fmt.Errorf("%w: host %s (%s) offered host key %s, not its pinned key %s", errKeyRefused, name, h.addr(), gossh.FingerprintSHA256(key), gossh.FingerprintSHA256(pinned))
		}
		return cb, algorithms([]gossh.PublicKey{pinned}), nil
	}
	d.khMu.Lock()
	check, err := knownhosts.New(d.knownHosts)
	d.khMu.Unlock()
	if err != nil {
		return nil, nil, fmt.Errorf("known_hosts %s: %w", d.knownHosts, err)
	}
	cb := func(hostname string, remote net.Addr, key gossh.PublicKey) error {
		err := check(hostname, remote, key)
		var ke *knownhosts.KeyError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ke) && len(ke.Want) > 0:
			return fmt.Errorf("%w: host %s (%s) offered host key %s, which differs from the one %s holds for it (if the host was reinstalled, replace its line there)",
				errKeyRefused, name, h.addr(), gossh.FingerprintSHA256(key), d.knownHosts)
		case errors.As(err, &ke) && d.opts.TrustFirstUse:
			d.khMu.Lock()
			defer d.khMu.Unlock()
			f, ferr := os.OpenFile(d.knownHosts, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
			if ferr != nil {
				return fmt.Errorf("host %s: trust on first use: %w", name, ferr)
			}
			defer f.Close()
			_, ferr = fmt.Fprintln(f, knownhosts.Line([]string{knownhosts.Normalize(h.addr())}, key))
			d.log.Warn("ssh: trusting a host's key on first use", "host", name, "key", gossh.FingerprintSHA256(key))
			return ferr
		case errors.As(err, &ke):
			return fmt.Errorf("%w: host %s (%s) offered host key %s, and %s has no key for it (add its key there, or pin host_key)",
				errKeyRefused, name, h.addr(), gossh.FingerprintSHA256(key), d.knownHosts)
		}
		return fmt.Errorf("host %s: host key: %w", name, err)
	}
	// The known keys' algorithms come first: ask the database about a key
	// it cannot hold, and it answers with the keys it has.
	_, probe, _ := ed25519.GenerateKey(rand.Reader)
	var known []gossh.PublicKey
	if signer, err := gossh.NewSignerFromKey(probe); err == nil {
		var ke *knownhosts.KeyError
		if err := check(h.addr(), &net.TCPAddr{}, signer.PublicKey()); errors.As(err, &ke) {
			for _, k := range ke.Want {
				known = append(known, k.Key)
			}
		}
	}
	return cb, algorithms(known), nil
}

// algorithms returns the host-key algorithms of keys, each once, in order;
// nil (the library's defaults) when there is none.
func algorithms(keys []gossh.PublicKey) []string {
	var out []string
	add := func(a ...string) {
		for _, s := range a {
			if !contains(out, s) {
				out = append(out, s)
			}
		}
	}
	for _, k := range keys {
		if k.Type() == gossh.KeyAlgoRSA {
			add(gossh.KeyAlgoRSASHA512, gossh.KeyAlgoRSASHA256, gossh.KeyAlgoRSA)
		} else {
			add(k.Type())
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// connect returns the host's connection, dialling it when there is none.
func (h *host) connect(ctx context.Context) (*gossh.Client, error) {
	h.mu.Lock()
	c := h.client
	h.mu.Unlock()
	if c != nil {
		return c, nil
	}
	h.dialMu.Lock()
	defer h.dialMu.Unlock()
	h.mu.Lock()
	c = h.client
	h.mu.Unlock()
	if c != nil {
		return c, nil
	}
	c, f, err := h.dial(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.reason = err.Error()
		return nil, err
	}
	if h.d.closed.Load() {
		c.Close()
		return nil, driver.Errorf(driver.ErrPermanent, "ssh driver is closed")
	}
	h.client, h.facts, h.reason = c, f, ""
	return c, nil
}

// dial connects, checks the host's key, logs in and reads the host's facts.
func (h *host) dial(ctx context.Context) (*gossh.Client, facts, error) {
	ctx, cancel := context.WithTimeout(ctx, h.d.opts.DialTimeout)
	defer cancel()
	check, algos, err := h.d.hostKeyCallback(h.cfg)
	if err != nil {
		return nil, facts{}, driver.Errorf(driver.ErrPermanent, "host %s: %v", h.name, err)
	}
	auth, closeAuth, err := h.d.auth()
	if err != nil {
		return nil, facts{}, err
	}
	defer closeAuth()
	var nd net.Dialer
	raw, err := nd.DialContext(ctx, "tcp", h.cfg.addr())
	if err != nil {
		return nil, facts{}, driver.Errorf(driver.ErrRetryable, "host %s: %v", h.name, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		raw.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	conn, chans, reqs, err := gossh.NewClientConn(raw, h.cfg.addr(), &gossh.ClientConfig{
		User:              h.cfg.user(),
		Auth:              auth,
		HostKeyCallback:   check,
		HostKeyAlgorithms: algos,
		Timeout:           h.d.opts.DialTimeout,
	})
	if !stop() || err != nil {
		raw.Close()
		if err == nil {
			err = ctx.Err()
		}
		if errors.Is(err, errKeyRefused) {
			// A key that is wrong stays wrong until someone acts.
			return nil, facts{}, fmt.Errorf("%w: %w", driver.ErrPermanent, err)
		}
		return nil, facts{}, driver.Errorf(driver.ErrRetryable, "host %s: ssh: %v", h.name, err)
	}
	raw.SetDeadline(time.Time{})
	c := gossh.NewClient(conn, chans, reqs)
	f, err := readFacts(ctx, c, h.d.opts.Root)
	if err != nil {
		c.Close()
		return nil, facts{}, driver.Errorf(driver.ErrRetryable, "host %s: reading cpus, memory and disk: %v", h.name, err)
	}
	return c, f, nil
}

// auth returns the ways to log in: the key file, then the agent's keys.
func (d *Driver) auth() ([]gossh.AuthMethod, func(), error) {
	var methods []gossh.AuthMethod
	if d.signer != nil {
		methods = append(methods, gossh.PublicKeys(d.signer))
	}
	closeAuth := func() {}
	if d.opts.Agent {
		sock := os.Getenv("SSH_AUTH_SOCK")
		if sock == "" {
			return nil, nil, driver.Errorf(driver.ErrPermanent, "agent: $SSH_AUTH_SOCK is not set")
		}
		conn, err := net.Dial("unix", sock)
		if err != nil {
			return nil, nil, driver.Errorf(driver.ErrRetryable, "agent: %v", err)
		}
		methods = append(methods, gossh.PublicKeysCallback(agent.NewClient(conn).Signers))
		closeAuth = func() { conn.Close() }
	}
	return methods, closeAuth, nil
}

// readFacts reads cpus, memory and disk from /proc and df.
func readFacts(ctx context.Context, c *gossh.Client, root string) (facts, error) {
	var out, errOut bytes.Buffer
	script := "getconf _NPROCESSORS_ONLN; grep '^MemTotal:' /proc/meminfo; mkdir -p " + quote(root) + " && df -Pk " + quote(root) + " | tail -n 1; uname -r; uname -m"
	if _, err := runOn(ctx, c, script, nil, &out, &errOut); err != nil {
		return facts{}, err
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 {
		return facts{}, fmt.Errorf("unexpected answer %q (stderr %q)", out.String(), errOut.String())
	}
	var f facts
	f.cpus, _ = strconv.ParseInt(strings.TrimSpace(lines[0]), 10, 64)
	if m := strings.Fields(lines[1]); len(m) >= 2 {
		kb, _ := strconv.ParseInt(m[1], 10, 64)
		f.memory = kb * 1024
	}
	if m := strings.Fields(lines[2]); len(m) >= 2 {
		kb, _ := strconv.ParseInt(m[1], 10, 64)
		f.disk = kb * 1024
	}
	f.kernel, f.arch = strings.TrimSpace(lines[3]), strings.TrimSpace(lines[4])
	if f.cpus <= 0 || f.memory <= 0 {
		return facts{}, fmt.Errorf("unexpected answer %q", out.String())
	}
	return f, nil
}

// quote quotes s for a POSIX shell.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// runOn runs cmd in a session of c and returns its exit code; an error
// when the session could not run it or ctx ended. When ctx ends the
// session is closed, which ends the command's input and output. What
// stdin (if not nil) gives is copied to the command's input, which stays
// open when stdin ends.
func runOn(ctx context.Context, c *gossh.Client, cmd string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	s, err := c.NewSession()
	if err != nil {
		return -1, fmt.Errorf("%w: %w", errNotSent, err)
	}
	defer s.Close()
	s.Stdout, s.Stderr = stdout, stderr
	// The command's input is a pipe that ctx's end closes: a command that
	// runs until told (a log follow) ends when its input does.
	in, err := s.StdinPipe()
	if err != nil {
		return -1, fmt.Errorf("%w: %w", errNotSent, err)
	}
	if err := s.Start(cmd); err != nil {
		return -1, fmt.Errorf("%w: %w", errNotSent, err)
	}
	if stdin != nil {
		go io.Copy(in, stdin)
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		in.Close()
		s.Close()
		<-done
		return -1, ctx.Err()
	}
	var ee *gossh.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee):
		return ee.ExitStatus(), nil
	}
	return -1, err
}

// run runs cmd on the host, taking one of its channel slots, and returns
// the command's exit code. An error means the command may not have run:
// ErrRetryable when the host could not be reached, ErrTimeout when ctx
// ended. A connection that failed is dropped, to be dialled again.
func (h *host) run(ctx context.Context, cmd string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	case <-ctx.Done():
		return -1, driver.Errorf(driver.ErrRetryable, "host %s: no free channel before the call's end: %v", h.name, ctx.Err())
	}
	h.mu.Lock()
	c, reason := h.client, h.reason
	h.mu.Unlock()
	if c == nil {
		// Only the probe dials a host that went away.
		return -1, driver.Errorf(driver.ErrRetryable, "host %s is offline: %s", h.name, reason)
	}
	var code int
	var err error
	for try := 1; ; try++ {
		code, err = runOn(ctx, c, cmd, stdin, stdout, stderr)
		if !refusedOpen(err) || !openAgain(ctx, try) {
			break
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return -1, fmt.Errorf("%w: host %s: %w", driver.ErrTimeout, h.name, ctx.Err())
		}
		var refused *gossh.OpenChannelError
		if !errors.As(err, &refused) {
			h.drop(c, err)
		}
		if errors.Is(err, errNotSent) {
			return -1, fmt.Errorf("%w: host %s: %w", driver.ErrRetryable, h.name, err)
		}
		return -1, fmt.Errorf("%w: host %s: %w", driver.ErrTimeout, h.name, err)
	}
	return code, nil
}

// openRetries bounds the tries again of a channel the host refused to
// open. sshd counts a closed session against its MaxSessions until its
// next pass over its channels: a channel opened right after another
// closed may be refused while fewer than max_channels are open.
const openRetries = 5

// refusedOpen reports whether err is the host refusing to open a channel.
func refusedOpen(err error) bool {
	var refused *gossh.OpenChannelError
	return errors.As(err, &refused)
}

// openAgain waits before the next open of a channel the host refused,
// a little longer after each try, and reports whether to try again: not
// after openRetries, nor once ctx ended.
func openAgain(ctx context.Context, try int) bool {
	if try > openRetries {
		return false
	}
	select {
	case <-time.After(time.Duration(try) * 10 * time.Millisecond):
		return true
	case <-ctx.Done():
		return false
	}
}

// drop closes c, the host's connection, after err showed it broken.
func (h *host) drop(c *gossh.Client, err error) {
	h.mu.Lock()
	if h.client == c {
		h.client = nil
		h.installed, h.limits = "", ""
		h.reason = err.Error()
	}
	h.mu.Unlock()
	c.Close()
}

// probe checks the host's connection with a keepalive, or dials it.
func (h *host) probe(ctx context.Context) {
	h.mu.Lock()
	c := h.client
	h.mu.Unlock()
	if c == nil {
		if _, err := h.connect(ctx); err != nil {
			h.d.log.Debug("ssh: host unreachable", "host", h.name, "err", err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(ctx, h.d.opts.DialTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := c.SendRequest("keepalive@openssh.com", true, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			h.drop(c, err)
		}
	case <-ctx.Done():
		h.drop(c, fmt.Errorf("no answer to a keepalive within %s", h.d.opts.DialTimeout))
		<-done
	}
}

// online returns the host's connection state and facts.
func (h *host) online() (bool, string, facts) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.client != nil, h.reason, h.facts
}

func (h *host) close() {
	h.mu.Lock()
	c := h.client
	h.client = nil
	h.mu.Unlock()
	if c != nil {
		c.Close()
	}
}
