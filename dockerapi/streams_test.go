package dockerapi_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// TestStreamsOutliveWriteTimeout: a stream (events here) lifts the
// server's write deadline, which bounds every other answer.
func TestStreamsOutliveWriteTimeout(t *testing.T) {
	e := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: e.server, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 200 * time.Millisecond}
	served := make(chan struct{})
	go func() { defer close(served); _ = hs.Serve(ln) }()
	defer func() { _ = hs.Close(); <-served }()
	req, _ := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/v1.41/events", nil)
	req.Header.Set("Authorization", "Bearer "+e.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	time.Sleep(time.Second) // past the write deadline
	if _, err := e.plane.Submit(context.Background(), scheduler.Request{Spec: driver.Spec{Name: "late", Image: helloImage}}, "team"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, `"name":"late"`) {
		t.Fatalf("the events stream after the write deadline: %q, %v", line, err)
	}
	http.DefaultClient.CloseIdleConnections()
}
