package dockerapi_test

import (
	"strings"
	"testing"
)

// TestRunRmEcho: docker run --rm IMAGE echo hello prints hello, exits 0 and
// leaves nothing behind.
func TestRunRmEcho(t *testing.T) {
	e := setup(t)
	out, errs, code := e.docker(t, "run", "--rm", helloImage, "echo", "hello")
	if code != 0 || out != "hello\n" {
		t.Fatalf("docker run --rm: exit %d, stdout %q, stderr %q; want exit 0 and hello", code, out, errs)
	}
	if out := e.must(t, "ps", "-a", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("docker ps -a after run --rm lists %q, want nothing", out)
	}
}
