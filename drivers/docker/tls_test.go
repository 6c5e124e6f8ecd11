package docker

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/internal/pkitest"
)

// pki is a throw-away certificate authority with a server certificate
// for 127.0.0.1 and a client certificate, the files as PEM.
type pki struct {
	ca, clientCert, clientKey string
	other                     string      // a CA that signed nothing here
	server                    *tls.Config // requires a client certificate the CA signed
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca, other := pkitest.NewCA("berth test CA"), pkitest.NewCA("some other CA")
	client := ca.Client("client")
	dir := t.TempDir()
	if err := pkitest.WriteFiles(dir, map[string][]byte{
		"ca.pem": ca.CertPEM, "other-ca.pem": other.CertPEM,
		"client.pem": client.CertPEM, "client-key.pem": client.KeyPEM,
	}); err != nil {
		t.Fatal(err)
	}
	return &pki{
		ca: filepath.Join(dir, "ca.pem"), other: filepath.Join(dir, "other-ca.pem"),
		clientCert: filepath.Join(dir, "client.pem"), clientKey: filepath.Join(dir, "client-key.pem"),
		server: ca.ServerConfig(ca.Server("127.0.0.1")),
	}
}

// tlsFront serves TLS on 127.0.0.1, requiring a client certificate signed
// by the test CA (as dockerd --tlsverify does), and passes each connection
// through to the machine's engine. It stops, with every connection, at the
// end of the test.
func tlsFront(t *testing.T, p *pki) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", p.server)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				if err := c.(*tls.Conn).Handshake(); err != nil {
					return
				}
				up, err := net.Dial("unix", strings.TrimPrefix(DefaultHost, "unix://"))
				if err != nil {
					return
				}
				defer up.Close()
				track(c, true)
				track(up, true)
				defer track(c, false)
				defer track(up, false)
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
				<-done
				c.Close()
				up.Close()
				<-done
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "tcp://" + ln.Addr().String()
}

// TestTLS reaches the machine's engine through a TLS front that demands a
// client certificate: with the right CA and certificate the engine is an
// online node that runs containers; with a CA that did not sign the
// server's certificate, or without a client certificate, it is offline and
// says why.
func TestTLS(t *testing.T) {
	leakCheck(t)
	p := newPKI(t)
	addr := tlsFront(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	o := testOptions()
	o.Engines = []EngineConfig{
		{Name: "good", Address: addr, TLS: &TLSConfig{CA: p.ca, Cert: p.clientCert, Key: p.clientKey}},
		{Name: "wrong-ca", Address: addr, TLS: &TLSConfig{CA: p.other, Cert: p.clientCert, Key: p.clientKey}},
		{Name: "no-client-cert", Address: addr, TLS: &TLSConfig{CA: p.ca}},
	}
	d := openTest(t, o)
	st, err := d.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := nodeNamed(t, st, "good"); n.Status != driver.NodeOnline || n.Capacity.CPU <= 0 || n.Address != "127.0.0.1" {
		t.Errorf("good: status %s (%s), capacity %+v, address %q", n.Status, n.Reason, n.Capacity, n.Address)
	}
	for _, name := range []string{"wrong-ca", "no-client-cert"} {
		if n := nodeNamed(t, st, name); n.Status != driver.NodeOffline || n.Reason == "" {
			t.Errorf("%s: status %s reason %q, want offline with a reason", name, n.Status, n.Reason)
		} else {
			t.Logf("%s: offline: %s", name, n.Reason)
		}
	}
	spec := helloSpec()
	spec.Tags = map[string]string{"berth.test.run": randomID()}
	inst := create(t, d, "good", spec)
	if inst.State != driver.StateRunning || !strings.HasPrefix(inst.ID, "good/") {
		t.Errorf("created over TLS: %+v", inst)
	}
	if _, err := d.Create(ctx, "wrong-ca", spec); !errors.Is(err, driver.ErrRetryable) {
		t.Errorf("Create on the engine whose certificate is not trusted: %v, want ErrRetryable", err)
	}
	// A call that fails in the handshake certainly did not happen.
	for _, name := range []string{"wrong-ca", "no-client-cert"} {
		if _, err := d.Get(ctx, name+"/"+strings.Repeat("0", 64)); !errors.Is(err, driver.ErrRetryable) {
			t.Errorf("Get through %s: %v, want ErrRetryable", name, err)
		}
	}
}
