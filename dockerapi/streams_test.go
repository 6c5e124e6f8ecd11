package dockerapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
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
	ack, err := e.plane.Submit(context.Background(), scheduler.Request{Spec: driver.Spec{Name: "late", Image: helloImage}}, "team")
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, `"name":"late"`) {
		t.Fatalf("the events stream after the write deadline: %q, %v", line, err)
	}
	// Its launch ends before the test does: a create still in the engine
	// when the plane stops could make its container after the cleanup
	// looked.
	e.waitPhase(t, ack.Instances[0].Instance.ID, reconciler.Running)
	http.DefaultClient.CloseIdleConnections()
}

// TestTokenStreamCap: one token may hold TokenStreams streams open; the
// next is refused with 429 and the Engine API's error shape.
func TestTokenStreamCap(t *testing.T) {
	e := setup(t)
	srv := dockerapi.New(e.plane, dockerapi.Options{Authenticator: e.tokens, TokenStreams: 2, Logger: quiet})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() { defer close(served); _ = hs.Serve(ln) }()
	defer func() { srv.Close(); _ = hs.Close(); <-served }()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	open := func() *http.Response {
		req, _ := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/events", nil)
		req.Header.Set("Authorization", "Bearer "+e.token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for range 2 {
		resp := open()
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream: %s", resp.Status)
		}
	}
	resp := open()
	defer resp.Body.Close()
	var body struct{ Message string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body.Message, "streams open") {
		t.Errorf("a third stream of one token: %s %q", resp.Status, body.Message)
	}
}
