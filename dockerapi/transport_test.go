package dockerapi_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/berth-dev/berth/reconciler"
)

// TestTransportErrorsAre4xx: a create whose body is truncated or arrives
// too slowly is answered 400 and 408, as the REST API answers them, not
// with a 5xx.
func TestTransportErrorsAre4xx(t *testing.T) {
	e := setup(t)
	const body = `{"Image":"busybox","Cmd":["sleep","300"]}`
	head := func(length int) string {
		return fmt.Sprintf("POST /v1.41/containers/create HTTP/1.1\r\nHost: docker\r\nAuthorization: Bearer %s\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", e.token, length)
	}
	for _, c := range []struct {
		name   string
		send   string
		close  bool
		status int
	}{
		{"body shorter than its Content-Length", head(len(body)+20) + body, true, http.StatusBadRequest},
		// Half the body, then nothing: the server's read timeout (2s) cuts it.
		{"body too slow", head(len(body)) + body[:10], false, http.StatusRequestTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("unix", e.sock)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, c.send); err != nil {
				t.Fatal(err)
			}
			if c.close {
				if err := conn.(*net.UnixConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != c.status {
				t.Fatalf("got %d %s, want %d", resp.StatusCode, raw, c.status)
			}
		})
	}
}

// TestStopRightAfterRun: docker stop right after docker run -d (which
// answers once the container is placed, while the back-end still creates
// it) is accepted and answered once the container has stopped.
func TestStopRightAfterRun(t *testing.T) {
	e := setup(t)
	id := strings.TrimSpace(e.must(t, "run", "-d", "--name", "quick", helloImage))
	if in, err := e.plane.Instance(context.Background(), id); err == nil {
		t.Logf("stopping the container while it is %s", in.Phase)
	}
	if out, errs, code := e.docker(t, "stop", id); code != 0 {
		t.Fatalf("docker stop right after run -d: exit %d, %s %s", code, out, errs)
	}
	in, err := e.plane.Instance(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if in.Phase != reconciler.Stopped && in.Phase != reconciler.Exited {
		t.Fatalf("after docker stop the container is %s (want %q), want stopped", in.Phase, in.Want)
	}
	if st := strings.TrimSpace(e.must(t, "inspect", "--format", "{{.State.Status}}", id)); st != "exited" {
		t.Errorf("docker inspect shows %s, want exited", st)
	}
}
