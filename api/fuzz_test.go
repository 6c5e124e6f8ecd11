package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzSubmit posts random bodies to the submit and plan endpoints: none may
// cause a 5xx or a panic, and every error must be the API's error shape.
// The seed corpus is in testdata/fuzz/FuzzSubmit.
func FuzzSubmit(f *testing.F) {
	f.Add(`{"image": "crosbymichael/redis", "cpus": "0.2", "memory": 512, "type": "service"}`)
	f.Add(`{"kind": "process", "command": ["true"], "count": 2, "constraints": ["node==sim-1"]}`)
	f.Add(`{"image": "x", "ports": [{"container_port": 80, "host_port": -1}]}`)
	f.Add(`{"kind": "process", "command": ["sleep", "300"], "priority": 4611686018427387904}`)
	f.Add(`{"image": "x", "cpus": "9223372036854775807m", "memory": "8Ei", "gpus": 9223372036854775807, "max_per_node": -1}`)
	e := newEnv(f, map[string]any{"nodes": 3}, 64<<10)
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/plan", "/v1/requests"} {
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
			rec := httptest.NewRecorder()
			e.h.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("POST %s %q: status %d: %s", path, body, rec.Code, rec.Body)
			}
			if rec.Code >= 400 && !strings.Contains(rec.Body.String(), `"error":{"code":`) {
				t.Fatalf("POST %s %q: status %d without the error shape: %s", path, body, rec.Code, rec.Body)
			}
		}
	})
}
