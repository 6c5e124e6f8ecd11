package docker

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// quietOptions are testOptions whose health loops never probe on their own
// (the test probes), so the test decides every health check.
func quietOptions(addrs ...string) *Options {
	o := testOptions(addrs...)
	o.PollInterval, o.BackoffMin, o.BackoffMax = time.Hour, time.Hour, time.Hour
	return o
}

// TestRecoveryNeedsChecks: an engine that went offline is online again only
// after recoverChecks good probes in a row; one that answers once between
// failures stays offline.
func TestRecoveryNeedsChecks(t *testing.T) {
	leakCheck(t)
	d := openTest(t, quietOptions(DefaultHost))
	e := d.engines[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if !e.online() {
		t.Fatal("the machine's engine is not online after Open: its first good probe is enough")
	}
	d.markOffline(e, "went away")
	for i := 1; i < recoverChecks; i++ {
		if !d.probe(ctx, e) {
			t.Fatalf("probe %d: the engine did not answer", i)
		}
		if st, reason, _ := e.snapshot(); st != driver.NodeOffline || reason == "" {
			t.Fatalf("after %d good probes of %d: %s (%q), want offline with a reason", i, recoverChecks, st, reason)
		}
	}
	// A failure resets the count.
	d.markOffline(e, "went away again")
	for i := 1; i < recoverChecks; i++ {
		d.probe(ctx, e)
	}
	if e.online() {
		t.Fatalf("online after %d good probes following a failure, want %d", recoverChecks-1, recoverChecks)
	}
	d.probe(ctx, e)
	if st, reason, _ := e.snapshot(); st != driver.NodeOnline || reason != "" {
		t.Fatalf("after %d good probes: %s (%q), want online", recoverChecks, st, reason)
	}
}

// TestServerErrorByEvidence: a real 500 from the engine is ErrPermanent
// while the engine keeps answering, and ErrTimeout (never ErrPermanent)
// when the engine it came from does not answer a new connection.
func TestServerErrorByEvidence(t *testing.T) {
	leakCheck(t)
	gone := "unix://" + filepath.Join(t.TempDir(), "gone.sock")
	d := openTest(t, quietOptions(DefaultHost, gone))
	run := randomID()
	t.Cleanup(func() { removeByLabel(t, mainCli, "berth.test.run", run) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A start that fails inside the engine: its host port is taken.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port, _ := network.PortFrom(8080, network.TCP)
	res, err := mainCli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: helloImage, Labels: map[string]string{"berth.test.run": run}, ExposedPorts: network.PortSet{port: {}}},
		HostConfig: &container.HostConfig{PortBindings: network.PortMap{port: {{HostPort: strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, startErr := mainCli.ContainerStart(ctx, res.ID, client.ContainerStartOptions{})
	if !serverError(startErr) {
		t.Fatalf("start with a taken port: %v, want a 500 from the engine", startErr)
	}

	if err := d.callErr(ctx, d.engines[0], startErr, "start"); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("500 from an engine that keeps answering: %v, want ErrPermanent", err)
	}
	// The same answer attributed to an engine that is not there: the
	// engine is going away, the outcome of the call is unknown.
	e2 := d.engines[1]
	d.setStatus(e2, driver.NodeOnline, "", nil) // as if it had been online until now
	err = d.callErr(ctx, e2, startErr, "start")
	if !errors.Is(err, driver.ErrTimeout) || errors.Is(err, driver.ErrPermanent) {
		t.Errorf("500 from an engine that does not answer: %v, want ErrTimeout only", err)
	}
	if e2.online() {
		t.Error("the engine that failed the ping is still online")
	}
	// Offline already: no ping needed, same verdict.
	if err := d.callErr(ctx, e2, startErr, "start"); !errors.Is(err, driver.ErrTimeout) {
		t.Errorf("500 from an offline engine: %v, want ErrTimeout", err)
	}
}

// TestSettled: the cleanup's outcome settles a failed operation's error.
func TestSettled(t *testing.T) {
	cut := driver.Errorf(driver.ErrTimeout, "start: cut off")
	refused := driver.Errorf(driver.ErrRetryable, "start: engine unreachable")
	wrong := driver.Errorf(driver.ErrPermanent, "start: bad spec")
	cleanupFailed := driver.Errorf(driver.ErrRetryable, "remove: engine unreachable")
	for _, c := range []struct {
		failure, cleanup, want error
	}{
		{cut, nil, driver.ErrRetryable},             // removed: nothing took effect
		{cut, cleanupFailed, driver.ErrTimeout},     // may be left
		{refused, nil, driver.ErrRetryable},         // nothing left
		{refused, cleanupFailed, driver.ErrTimeout}, // the container may be left
		{wrong, nil, driver.ErrPermanent},
		{wrong, cleanupFailed, driver.ErrPermanent},
	} {
		got := settled(c.failure, c.cleanup)
		if driver.ClassOf(got) != c.want {
			t.Errorf("settled(%v, %v) = %v, want %v", c.failure, c.cleanup, got, c.want)
		}
		for _, k := range driver.Classes {
			if k != c.want && errors.Is(got, k) {
				t.Errorf("settled(%v, %v) = %v is also %v", c.failure, c.cleanup, got, k)
			}
		}
	}
}

// TestStateDoesNotWaitForAStuckEngine: an engine that accepts connections
// but stops answering, while its health check has not yet noticed, does not
// hold up State: State answers before the caller's deadline with the
// engine's last complete reading.
func TestStateDoesNotWaitForAStuckEngine(t *testing.T) {
	leakCheck(t)
	sock := filepath.Join(t.TempDir(), "proxy.sock")
	p := startProxy(t, sock, strings.TrimPrefix(DefaultHost, "unix://"))
	o := quietOptions(DefaultHost, "unix://"+sock)
	o.CallTimeout = time.Minute // longer than the caller waits below
	d := openTest(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := d.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := nodeNamed(t, st, "e2")
	if before.Status != driver.NodeOnline || len(before.Images) == 0 {
		t.Fatalf("e2 through the proxy: %+v, want online with images", before)
	}

	p.freeze()
	sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
	defer scancel()
	st, err = d.State(sctx)
	if err != nil {
		t.Fatalf("State with a stuck engine: %v", err)
	}
	after := nodeNamed(t, st, "e2")
	if len(after.Images) != len(before.Images) || after.Capacity.CPU != before.Capacity.CPU {
		t.Errorf("stuck e2: %+v, want its last reading %+v", after, before)
	}
	if n := nodeNamed(t, st, "e1"); n.Status != driver.NodeOnline {
		t.Errorf("e1: %s while e2 is stuck", n.Status)
	}
	p.close()
}

// proxy forwards a unix socket to another one until frozen; then it keeps
// accepting connections but passes nothing on, as an engine that hangs.
type proxy struct {
	ln     net.Listener
	mu     sync.Mutex
	frozen bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, sock, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			frozen := p.frozen
			p.mu.Unlock()
			if frozen {
				continue // accepted, never answered
			}
			up, err := net.Dial("unix", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, up)
			p.mu.Unlock()
			p.wg.Go(func() { p.pipe(up, c) })
			p.wg.Go(func() { p.pipe(c, up) })
		}
	})
	t.Cleanup(p.close)
	return p
}

// pipe copies src to dst until either closes or the proxy freezes.
func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		frozen := p.frozen
		p.mu.Unlock()
		if frozen {
			// Swallow everything from now on.
			_, _ = io.Copy(io.Discard, src)
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
