package api_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/store/memory"
)

// TestTransportErrorsAre4xx sends bodies the server cannot read for the
// client's fault over a raw connection: each is answered with a 4xx in
// the error shape, never a 5xx.
func TestTransportErrorsAre4xx(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), nil, api.Options{})
	// The API's handler behind a server with a short read timeout, so
	// that a slow body is cut soon.
	hs := httptest.NewUnstartedServer(e.API)
	hs.Config.ReadTimeout = time.Second
	hs.Start()
	t.Cleanup(hs.Close)

	const body = `{"kind":"process","command":["sleep","300"]}`
	head := func(framing string) string {
		return "POST /v1/requests HTTP/1.1\r\nHost: " + hs.Listener.Addr().String() + "\r\n" +
			"Authorization: Bearer " + e.Token + "\r\nContent-Type: application/json\r\n" + framing + "\r\n"
	}
	cases := []struct {
		name string
		// send writes the request; close ends the client's side after it.
		send   string
		close  bool
		status int
		code   string
	}{
		{"body shorter than its Content-Length", head(fmt.Sprintf("Content-Length: %d\r\n", len(body)+20)) + body, true,
			http.StatusBadRequest, api.CodeBadBody},
		{"malformed chunked encoding", head("Transfer-Encoding: chunked\r\n") + "zz\r\n" + body + "\r\n0\r\n\r\n", false,
			http.StatusBadRequest, api.CodeBadBody},
		{"chunk longer than announced", head("Transfer-Encoding: chunked\r\n") + "4\r\n" + body + "\r\n0\r\n\r\n", false,
			http.StatusBadRequest, api.CodeBadBody},
		// Half the body, then nothing: the read timeout cuts it.
		{"body too slow", head(fmt.Sprintf("Content-Length: %d\r\n", len(body))) + body[:10], false,
			http.StatusRequestTimeout, api.CodeRequestTimeout},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", hs.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, c.send); err != nil {
				t.Fatal(err)
			}
			if c.close {
				if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var eb errorBody
			if err := json.Unmarshal(raw, &eb); err != nil {
				t.Fatalf("%d with a body that is not the error shape: %q", resp.StatusCode, raw)
			}
			if resp.StatusCode != c.status || eb.Error.Code != c.code {
				t.Fatalf("got %d %s (%s), want %d %s", resp.StatusCode, eb.Error.Code, eb.Error.Message, c.status, c.code)
			}
		})
	}
	// Nothing was submitted.
	if ins, err := e.Plane.Instances(t.Context(), control.Filter{All: true}); err != nil || len(ins) != 0 {
		t.Fatalf("instances after bad bodies: %d, %v", len(ins), err)
	}
}
