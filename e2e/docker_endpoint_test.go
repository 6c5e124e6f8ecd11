package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDockerEndpoint: berth server --docker-listen serves the Docker
// Engine API on a unix socket made 0600, to the docker CLI with the same
// tokens as the REST API, and refuses a token it does not know; an address
// off this host without TLS is refused at start.
func TestDockerEndpoint(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Fatal("this test needs the docker CLI: ", err)
	}
	sockDir, err := os.MkdirTemp("", "bd")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "d.sock")
	dataDir := t.TempDir()
	s := startServerWith(t, "--dev", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--docker-listen", sock)
	defer func() { _ = s.stop(t) }()
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatalf("the socket: %v\n%s", err, s.logs())
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the socket's mode is %v, want 0600", fi.Mode().Perm())
	}
	admin, err := os.ReadFile(filepath.Join(dataDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	docker := func(token string, args ...string) (string, error) {
		cfg := t.TempDir()
		if err := os.WriteFile(filepath.Join(cfg, "config.json"), []byte(`{"HttpHeaders": {"Authorization": "Bearer `+token+`"}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		return dockerCLI([]string{"DOCKER_HOST=unix://" + sock, "DOCKER_CONFIG=" + cfg}, args...)
	}
	if out, err := docker("wrong", "ps"); err == nil || !strings.Contains(out, "unknown, revoked or expired") {
		t.Errorf("docker ps with an unknown token: %v: %s", err, out)
	}
	if out, err := docker(strings.TrimSpace(string(admin)), "version", "--format", "{{.Server.APIVersion}}"); err != nil || strings.TrimSpace(out) != "1.41" {
		t.Errorf("docker version with the admin token: %v: %s", err, out)
	}

	cmd := exec.Command(berthBin, "server", "--dev", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--docker-listen", "0.0.0.0:0")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "reachable from other machines") {
		t.Errorf("--docker-listen 0.0.0.0:0 without TLS: %v: %s", err, out)
	}
}

// TestRunRm: berth run --rm waits until the instance ends, removes it and
// reports an exit code other than 0.
func TestRunRm(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	defer func() { _ = s.stop(t) }()
	if out, stderr, code := berth(t, s, "run", "--rm", "--name", "once", "--", "sh", "-c", "exit 0"); code != 0 {
		t.Fatalf("run --rm: exit %d\n%s%s", code, out, stderr)
	}
	if out := mustBerth(t, s, "ps", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("ps after run --rm lists %q", out)
	}
	_, stderr, code := berth(t, s, "run", "--rm", "--name", "fails", "--", "sh", "-c", "exit 3")
	if code != 1 || !strings.Contains(stderr, "exited with code 3") {
		t.Errorf("run --rm of a command that exits 3: exit %d, %q", code, stderr)
	}
	if out := mustBerth(t, s, "ps", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("ps after a failing run --rm lists %q", out)
	}
}
