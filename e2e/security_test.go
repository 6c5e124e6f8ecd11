package e2e

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/pkitest"
)

// TestInsecureListenerWarns: --insecure starts a server off loopback
// without TLS, and says so loudly. (Without it the start is refused: see
// TestServerRejectsBadConfig.)
func TestInsecureListenerWarns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServerWith(t, "--dev", "--data-dir", dir, "--listen", "0.0.0.0:0", "--insecure")
	s.dataDir = dir
	if !strings.Contains(s.logs(), "INSECURE") {
		t.Errorf("--insecure on an open listener logged no warning:\n%s", s.logs())
	}
}

// TestSlowBodyIsCutOff: a client that sends its body a byte at a time is
// disconnected once the read timeout has passed, instead of holding a
// connection for ever.
func TestSlowBodyIsCutOff(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "berth.yaml")
	body := "listen: 127.0.0.1:0\ndata_dir: " + filepath.Join(dir, "data") + "\ntimeouts: {read: 1s}\n" +
		"providers:\n  - {name: sim, driver: sim, options: {nodes: 1}}\n"
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServerWith(t, "--config", cfg)
	s.dataDir = filepath.Join(dir, "data")
	conn, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	head := "POST /v1/requests HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + s.token(t) +
		"\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
	if _, err := conn.Write([]byte(head)); err != nil {
		t.Fatal(err)
	}
	// Trickle a byte every 100 ms; the server must hang up well before the
	// million bytes would arrive (a day at this pace). The generous limit
	// only guards against a hung test.
	cut := false
	for range 600 {
		if _, err := conn.Write([]byte(" ")); err != nil {
			cut = true
			break
		}
		_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		buf := make([]byte, 512)
		if n, err := conn.Read(buf); n > 0 || (err != nil && !isTimeout(err)) {
			cut = true
			break
		}
	}
	if !cut {
		t.Fatal("the server still reads a body trickled for a minute, with a read timeout of 1s")
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestTLSWithCurl: a real curl talks to a TLS server: without a token it is
// refused, with the bearer token or with a client certificate naming a
// token it is served; a certificate from another CA is not accepted.
func TestTLSWithCurl(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is needed (apt-get install curl)")
	}
	dir := t.TempDir()
	ca, other := pkitest.NewCA("berth test CA"), pkitest.NewCA("another CA")
	srv := ca.Server("127.0.0.1")
	// The client certificate's common name names the bootstrap token.
	cli, bad := ca.Client("bootstrap"), other.Client("bootstrap")
	if err := pkitest.WriteFiles(dir, map[string][]byte{
		"ca.pem":     ca.CertPEM,
		"server.pem": srv.CertPEM, "server-key.pem": srv.KeyPEM,
		"client.pem": cli.CertPEM, "client-key.pem": cli.KeyPEM,
		"bad.pem": bad.CertPEM, "bad-key.pem": bad.KeyPEM,
	}); err != nil {
		t.Fatal(err)
	}

	data := filepath.Join(dir, "data")
	s := startServerWith(t, "--dev", "--data-dir", data, "--listen", "127.0.0.1:0",
		"--tls-cert", filepath.Join(dir, "server.pem"), "--tls-key", filepath.Join(dir, "server-key.pem"),
		"--tls-client-ca", filepath.Join(dir, "ca.pem"))
	s.dataDir = data
	curl := func(args ...string) (string, string) {
		t.Helper()
		base := []string{"-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", filepath.Join(dir, "ca.pem")}
		cmd := exec.Command("curl", append(append(base, args...), "https://"+s.addr+"/v1/instances")...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, _ := cmd.Output()
		return string(out), stderr.String()
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no token", nil, "401"},
		{"bearer token", []string{"-H", "Authorization: Bearer " + s.token(t)}, "200"},
		{"client certificate", []string{"--cert", filepath.Join(dir, "client.pem"), "--key", filepath.Join(dir, "client-key.pem")}, "200"},
	}
	for _, c := range cases {
		if code, stderr := curl(c.args...); code != c.want {
			t.Errorf("curl with %s: %q (%s), want %s", c.name, code, stderr, c.want)
		}
	}
	// A certificate from another CA fails the handshake (or is not taken
	// as anyone): never 200.
	if code, _ := curl("--cert", filepath.Join(dir, "bad.pem"), "--key", filepath.Join(dir, "bad-key.pem")); code == "200" {
		t.Errorf("a client certificate from another CA was accepted")
	}
	// Plain HTTP to the TLS port is not served.
	if out, err := exec.Command("curl", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}", "http://"+s.addr+"/v1/health").Output(); err == nil && string(out) == "200" {
		t.Errorf("plain HTTP answered on the TLS listener")
	}
}

// TestRunAsUser: a process asked to run as uid 65534 runs as 65534 (it
// prints its own ids), a spec naming root is refused at submit on a
// provider that does not allow root, and a server that is not root refuses
// a user it cannot become, at submit, naming the field.
func TestRunAsUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("this test starts processes as other users: run it as root (CI does)")
	}
	s := startServer(t, t.TempDir())
	mustBerth(t, s, "run", "--name", "nobody", "--user", "65534", "--group", "65534", "--", "sh", "-c", "echo uid=$(id -u) gid=$(id -g); sleep 300")
	waitFor(t, "the process to say who it is", func() bool {
		out, _, _ := berth(t, s, "logs", "nobody")
		return strings.Contains(out, "uid=")
	})
	if out, _, _ := berth(t, s, "logs", "nobody"); !strings.Contains(out, "uid=65534 gid=65534") {
		t.Fatalf("a process asked to run as 65534 says %q", out)
	}
	mustBerth(t, s, "rm", "nobody")

	// A server that is not root: the same binary started as uid 65534,
	// from a directory it can reach (t.TempDir's parent is private).
	dir, err := os.MkdirTemp("", "berth-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, data} {
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "berth.yaml")
	if err := os.WriteFile(cfg, []byte("listen: 127.0.0.1:0\ndata_dir: "+data+"\nproviders:\n  - {name: local, driver: local}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The test binary's directory must be reachable by uid 65534.
	bin := filepath.Join(dir, "berth")
	copyProgram(t, berthBin, bin)
	u := startServerAs(t, 65534, bin, "--config", cfg)
	u.dataDir = data
	for _, c := range []struct{ user, field string }{{"0", "user"}, {"root", "user"}, {"1000", "user"}} {
		_, stderr, code := berth(t, u, "run", "--user", c.user, "--", "true")
		if code != 6 || !strings.Contains(stderr, "user") {
			t.Errorf("--user %s on a server running as 65534: exit %d %q, want 6 (unsupported) naming user", c.user, code, stderr)
		}
	}
	if _, stderr, code := berth(t, u, "run", "--", "true"); code != 0 {
		t.Errorf("a process as the server's own user: exit %d %s", code, stderr)
	}
}

// copyProgram copies the program from to to, executable by anyone.
// Another process writes the copy (coreutils' install): a file this
// process held open for writing would be inherited by a child another
// test forks meanwhile, until that child execs, and starting the copy
// then fails with "text file busy" (ETXTBSY, golang/go#22315).
func copyProgram(t *testing.T, from, to string) {
	t.Helper()
	if out, err := exec.Command("install", "-m", "0755", from, to).CombinedOutput(); err != nil {
		t.Fatalf("install %s %s: %v: %s", from, to, err, out)
	}
}

// TestRunWaits: berth run waits until its instances run, and exits
// non-zero when one fails instead; -d returns at once; --count 0 is a usage
// error; what no provider can run is refused.
func TestRunWaits(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	if _, stderr, code := berth(t, s, "run", "--name", "fails", "--", "/nonexistent/program"); code == 0 || !strings.Contains(stderr, "failed") {
		t.Errorf("run of a program that does not exist: exit %d %q, want non-zero saying it failed", code, stderr)
	}
	if _, stderr, code := berth(t, s, "run", "-d", "--name", "fails-detached", "--", "/nonexistent/program"); code != 0 {
		t.Errorf("run -d: exit %d %s, want 0 (it does not wait)", code, stderr)
	}
	if _, stderr, code := berth(t, s, "run", "--name", "ok", "--", "true"); code != 0 {
		t.Errorf("run of true: exit %d %s", code, stderr)
	}
	if _, _, code := berth(t, s, "run", "--count", "0", "--", "true"); code != 2 {
		t.Errorf("--count 0: exit %d, want 2", code)
	}
	if _, stderr, code := berth(t, s, "run", "--name", "ctr", "busybox"); code != 6 || !strings.Contains(stderr, "kind") {
		t.Errorf("a container on --dev (local only): exit %d %q, want 6 naming kind", code, stderr)
	}
}
