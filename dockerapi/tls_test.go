package dockerapi_test

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/internal/pkitest"
)

// TestClientCertificates: with client certificates, the docker CLI's
// DOCKER_TLS_VERIFY and DOCKER_CERT_PATH authenticate it as the token its
// certificate's common name names; a client without a certificate is
// refused.
func TestClientCertificates(t *testing.T) {
	e := setup(t)
	dir := t.TempDir()
	ca := pkitest.NewCA("test ca")
	opDir, readDir := filepath.Join(dir, "operator"), filepath.Join(dir, "reader")
	for _, c := range []struct {
		dir string
		ou  string
	}{{opDir, "operator"}, {readDir, "reader"}} {
		// The docker CLI's DOCKER_CERT_PATH layout.
		cert := ca.Client("ci-" + c.ou)
		if err := pkitest.WriteFiles(c.dir, map[string][]byte{"ca.pem": ca.CertPEM, "cert.pem": cert.CertPEM, "key.pem": cert.KeyPEM}); err != nil {
			t.Fatal(err)
		}
	}
	e.newToken(t, "ci-operator", auth.RoleOperator, "team")
	e.newToken(t, "ci-reader", auth.RoleReader, auth.AllNamespaces)
	srv := dockerapi.New(e.plane, dockerapi.Options{Authenticator: e.tokens, ClientCerts: true, Logger: quiet})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tln := tls.NewListener(ln, ca.ServerConfig(ca.Server("127.0.0.1")))
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
