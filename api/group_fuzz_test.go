package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzGroup posts random bodies to the groups endpoint: none may cause a
// 5xx or a panic, and every error must be the API's error shape. The seed
// corpus is in testdata/fuzz/FuzzGroup.
func FuzzGroup(f *testing.F) {
	f.Add(`{"id": "g", "services": [{"name": "db", "image": "db"}, {"name": "web", "image": "web", "count": 2, "essential": 1}]}`)
	f.Add(`{"id": "n", "kind": "nodeset", "services": [{"name": "a", "image": "x"}]}`)
	f.Add(`{"id": "p", "priority": 4611686018427387904, "services": [{"image": "x"}]}`)
	f.Add(`{"id": "s", "services": [{"image": "x", "startup_order": -9223372036854775808, "essential": 99}]}`)
	e := newEnv(f, map[string]any{"nodes": 3}, 64<<10)
	f.Fuzz(func(t *testing.T, body string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/groups", strings.NewReader(body))
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("POST /v1/groups %q: status %d: %s", body, rec.Code, rec.Body)
		}
		if rec.Code >= 400 && !strings.Contains(rec.Body.String(), `"error":{"code":`) {
			t.Fatalf("POST /v1/groups %q: status %d without the error shape: %s", body, rec.Code, rec.Body)
		}
	})
}
