package docker

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

// pki is a throw-away certificate authority with a server certificate for
// 127.0.0.1 and a client certificate, written as PEM files.
type pki struct {
	dir                          string
	ca, serverCert, serverKey    string
	clientCert, clientKey, other string // other: a CA that signed nothing here
	serverTLS                    tls.Certificate
	pool                         *x509.CertPool
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	caKey, caCert, caDER := selfSigned(t, "berth test CA")
	p.ca = p.writePEM(t, "ca.pem", "CERTIFICATE", caDER)
	p.pool = x509.NewCertPool()
	p.pool.AddCert(caCert)
	_, _, otherDER := selfSigned(t, "some other CA")
	p.other = p.writePEM(t, "other-ca.pem", "CERTIFICATE", otherDER)

	issue := func(name string, usage x509.ExtKeyUsage, ips []net.IP) (certPath, keyPath string, pair tls.Certificate) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certPath = p.writePEM(t, name+".pem", "CERTIFICATE", der)
		keyPath = p.writePEM(t, name+"-key.pem", "EC PRIVATE KEY", kder)
		pair, err = tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			t.Fatal(err)
		}
		return certPath, keyPath, pair
	}
	p.serverCert, p.serverKey, p.serverTLS = issue("server", x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	p.clientCert, p.clientKey, _ = issue("client", x509.ExtKeyUsageClientAuth, nil)
	return p
}

func selfSigned(t *testing.T, name string) (*ecdsa.PrivateKey, *x509.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert, der
}

func (p *pki) writePEM(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tlsFront serves TLS on 127.0.0.1, requiring a client certificate signed
// by the test CA (as dockerd --tlsverify does), and passes each connection
// through to the machine's engine. It stops, with every connection, at the
// end of the test.
func tlsFront(t *testing.T, p *pki) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{p.serverTLS},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.pool,
		MinVersion:   tls.VersionTLS12,
	})
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
