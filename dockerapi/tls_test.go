package dockerapi_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/dockerapi"
)

// TestClientCertificates: with client certificates, the docker CLI's
// DOCKER_TLS_VERIFY and DOCKER_CERT_PATH authenticate it as the token its
// certificate's common name names; a client without a certificate is
// refused.
func TestClientCertificates(t *testing.T) {
	e := setup(t)
	dir := t.TempDir()
	ca, caKey := newCert(t, nil, nil, pkix.Name{CommonName: "test ca"}, true)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	srvCert, srvKey := newCert(t, ca, caKey, pkix.Name{CommonName: "127.0.0.1"}, false)
	opDir, readDir := filepath.Join(dir, "operator"), filepath.Join(dir, "reader")
	for _, c := range []struct {
		dir string
		ou  string
	}{{opDir, "operator"}, {readDir, "reader"}} {
		if err := os.Mkdir(c.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		cert, key := newCert(t, ca, caKey, pkix.Name{CommonName: "ci-" + c.ou}, false)
		writePEM(t, filepath.Join(c.dir, "ca.pem"), "CERTIFICATE", ca.Raw)
		writePEM(t, filepath.Join(c.dir, "cert.pem"), "CERTIFICATE", cert.Raw)
		kb, _ := x509.MarshalECPrivateKey(key)
		writePEM(t, filepath.Join(c.dir, "key.pem"), "EC PRIVATE KEY", kb)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	e.newToken(t, "ci-operator", auth.RoleOperator, "team")
	e.newToken(t, "ci-reader", auth.RoleReader, auth.AllNamespaces)
	srv := dockerapi.New(e.plane, dockerapi.Options{Authenticator: e.tokens, ClientCerts: true, Logger: quiet})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tln := tls.NewListener(ln, &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{srvCert.Raw}, PrivateKey: srvKey}},
		ClientCAs:    pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})
	// The client without a certificate speaks plain HTTP: its handshake
	// errors are expected, not logged.
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	served := make(chan struct{})
	go func() { defer close(served); _ = hs.Serve(tln) }()
	defer func() {
		srv.Close()
		_ = hs.Shutdown(context.Background())
		<-served
	}()
	docker := func(certDir string, args ...string) (string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "docker", args...)
		cmd.Env = append(cleanEnv(), "DOCKER_HOST=tcp://"+ln.Addr().String(), "DOCKER_CONFIG="+e.dockerConfig(t, ""))
		if certDir != "" {
			cmd.Env = append(cmd.Env, "DOCKER_TLS_VERIFY=1", "DOCKER_CERT_PATH="+certDir)
		}
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	if out, code := docker(opDir, "run", "--rm", helloImage, "echo", "over tls"); code != 0 || out != "over tls\n" {
		t.Errorf("docker run with an operator's certificate: exit %d, %q", code, out)
	}
	if out, code := docker(readDir, "ps"); code != 0 {
		t.Errorf("docker ps with a reader's certificate: exit %d, %q", code, out)
	}
	if out, code := docker(readDir, "run", "-d", helloImage); code == 0 || !strings.Contains(out, "needs the operate permission") {
		t.Errorf("docker run with a reader's certificate: exit %d, %q", code, out)
	}
	if out, code := docker("", "ps"); code == 0 {
		t.Errorf("docker ps without a certificate: exit %d, %q", code, out)
	}
}

func newCert(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, name pkix.Name, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: name, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, BasicConstraintsValid: true, IsCA: isCA,
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
