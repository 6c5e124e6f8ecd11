package pkitest_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/pkitest"
)

// TestCertificates: a server certificate verifies for each of its hosts
// and no other, a client certificate for client authentication, both with
// the key usages libvirtd requires, and each PEM key matches its
// certificate.
func TestCertificates(t *testing.T) {
	ca := pkitest.NewCA("test CA")
	if b, _ := pem.Decode(ca.CertPEM); b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("CA PEM: %q", ca.CertPEM)
	}
	caCert := parse(t, ca.CertPEM)
	if !caCert.IsCA || caCert.KeyUsage&x509.KeyUsageCertSign == 0 || caCert.KeyUsage&x509.KeyUsageCRLSign == 0 || caCert.Subject.CommonName != "test CA" {
		t.Errorf("CA certificate: CA %v, key usage %b, subject %s", caCert.IsCA, caCert.KeyUsage, caCert.Subject)
	}
	srv, cli := ca.Server("127.0.0.1", "localhost", "::1"), ca.Client("someone")
	for _, c := range []struct {
		name  string
		cert  *pkitest.Cert
		usage x509.ExtKeyUsage
		hosts []string
	}{
		{"server", srv, x509.ExtKeyUsageServerAuth, []string{"127.0.0.1", "localhost", "::1"}},
		{"client", cli, x509.ExtKeyUsageClientAuth, nil},
	} {
		pair, err := tls.X509KeyPair(c.cert.CertPEM, c.cert.KeyPEM)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if b, _ := pem.Decode(c.cert.KeyPEM); b == nil || b.Type != "PRIVATE KEY" {
			t.Errorf("%s key PEM is not PKCS #8", c.name)
		}
		cert := pair.Leaf
		want := x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		if cert.IsCA || !cert.BasicConstraintsValid || cert.KeyUsage != want {
			t.Errorf("%s: CA %v (constraints %v), key usage %b, want %b", c.name, cert.IsCA, cert.BasicConstraintsValid, cert.KeyUsage, want)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
			t.Errorf("%s does not verify for its purpose: %v", c.name, err)
		}
		for _, h := range c.hosts {
			if err := cert.VerifyHostname(h); err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		}
		if !c.cert.TLSCertificate().Leaf.Equal(cert) {
			t.Errorf("%s: TLSCertificate is another certificate than CertPEM", c.name)
		}
	}
	if err := parse(t, srv.CertPEM).VerifyHostname("127.0.0.2"); err == nil {
		t.Error("the server certificate verifies for a host it was not issued for")
	}
	if _, err := parse(t, cli.CertPEM).Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("the client certificate verifies for server authentication")
	}
	if got := parse(t, srv.CertPEM).Subject.CommonName; got != "127.0.0.1" {
		t.Errorf("server common name %q, want the first host", got)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Server without a host did not panic")
			}
		}()
		ca.Server()
	}()
}

// TestServerConfig: a server configured by ServerConfig completes a
// handshake with a client that presents a certificate of its CA, and
// refuses one without a certificate and one whose certificate a CA of the
// same name but another key signed.
func TestServerConfig(t *testing.T) {
	ca := pkitest.NewCA("test CA")
	forged := pkitest.NewCA("test CA")
	cfg := ca.ServerConfig(ca.Server("127.0.0.1"))
	for _, c := range []struct {
		name   string
		client *pkitest.Cert
		ok     bool
	}{
		{"a client of the CA", ca.Client("someone"), true},
		{"no client certificate", nil, false},
		{"a client of a CA of the same name", forged.Client("someone"), false},
	} {
		clientCfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
		if c.client != nil {
			clientCfg.Certificates = []tls.Certificate{c.client.TLSCertificate()}
		}
		if err := handshake(t, cfg, clientCfg); (err == nil) != c.ok {
			t.Errorf("%s: handshake %v, want success %v", c.name, err, c.ok)
		}
	}
	// A client that trusts another CA refuses the server.
	if err := handshake(t, cfg, &tls.Config{RootCAs: forged.Pool(), ServerName: "127.0.0.1",
		Certificates: []tls.Certificate{ca.Client("someone").TLSCertificate()}}); err == nil {
		t.Error("a client trusting a CA of the same name but another key accepted the server")
	}
}

// handshake runs a TLS handshake between server and client over a pipe and
// returns the server's error, else the client's.
func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	// The reads and writes after the handshakes end with the pipe.
	stop := context.AfterFunc(ctx, func() { a.Close(); b.Close() })
	defer stop()
	srvErr := make(chan error, 1)
	go func() {
		c := tls.Server(a, server)
		err := c.HandshakeContext(ctx)
		if err == nil {
			// TLS 1.3: the client's certificate reaches the server after
			// the client's handshake ends; reading makes the server's
			// verdict reach the client.
			_, err = c.Write([]byte{1})
		}
		a.Close()
		srvErr <- err
	}()
	c := tls.Client(b, client)
	cliErr := c.HandshakeContext(ctx)
	if cliErr == nil {
		_, cliErr = c.Read(make([]byte, 1))
	}
	b.Close()
	if err := <-srvErr; err != nil {
		return err
	}
	return cliErr
}

// TestWriteFiles: the files are written readable by their owner alone,
// into a directory made owner-only; a name that is a path is refused.
func TestWriteFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new")
	if err := pkitest.WriteFiles(dir, map[string][]byte{"a.pem": []byte("a"), "b.pem": []byte("b")}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("dir: %v %v, want mode 0700", fi.Mode(), err)
	}
	for name, want := range map[string]string{"a.pem": "a", "b.pem": "b"} {
		p := filepath.Join(dir, name)
		b, err := os.ReadFile(p)
		fi, serr := os.Stat(p)
		if err != nil || serr != nil || string(b) != want || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %q %v %v, want %q mode 0600", name, b, err, serr, want)
		}
	}
	for _, bad := range []string{"", ".", "..", "../x.pem", "sub/x.pem"} {
		if err := pkitest.WriteFiles(dir, map[string][]byte{bad: nil}); err == nil {
			t.Errorf("WriteFiles took the name %q", bad)
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "x.pem")); err == nil {
		t.Error("a file was written outside dir")
	}
}

func parse(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatalf("no PEM block in %q", certPEM)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
