package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// TestNodesShowMeasuredUse: GET /v1/nodes shows each node's overcommit
// policy and, once the usage loop has measured its instances, their
// measured use, memory as a whole number of bytes.
func TestNodesShowMeasuredUse(t *testing.T) {
	e := apitest.StartWith(t, memory.New(memory.Options{}), map[string]any{"nodes": 1}, api.Options{}, func(c *control.Config) {
		c.UsageInterval = 20 * time.Millisecond
		c.Overcommit = map[string]scheduler.Overcommit{"sim": {Policy: scheduler.PolicyUsage, Ratio: 2, Headroom: 0.1}}
	})
	ctx := context.Background()
	if _, err := e.Client(t, "").Submit(ctx, scheduler.Request{ID: "app", Spec: driver.Spec{Image: "x", Resources: driver.Resources{CPU: driver.CPUs(1), Memory: 512 * driver.MiB}}}); err != nil {
		t.Fatal(err)
	}
	type node struct {
		Overcommit string          `json:"overcommit"`
		Measured   json.RawMessage `json:"measured"`
	}
	var got []node
	// The deadline only guards against a hung test.
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest("GET", e.HTTP.URL+"/v1/nodes", nil)
		req.Header.Set("Authorization", "Bearer "+e.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		resp.Body.Close()
		if err := json.Unmarshal(buf.Bytes(), &got); err != nil || len(got) != 1 {
			t.Fatalf("nodes %s: %v", buf.String(), err)
		}
		if len(got[0].Measured) > 0 && bytes.Contains(got[0].Measured, []byte(`"sampled":1`)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node was never measured: %s", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got[0].Overcommit != "usage, ratio 2, headroom 0.1" {
		t.Errorf("overcommit %q", got[0].Overcommit)
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(got[0].Measured))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	mem, ok := m["memory_bytes"].(json.Number)
	if _, err := mem.Int64(); !ok || err != nil {
		t.Errorf("memory_bytes %v is not a whole number: %s", m["memory_bytes"], got[0].Measured)
	}
	for _, k := range []string{"cpus", "instances", "sampled", "time"} {
		if _, ok := m[k]; !ok {
			t.Errorf("measured lacks %s: %s", k, got[0].Measured)
		}
	}
}

// TestAnswersWriteSizesAsBytes: every answer writes a size as an integer
// number of bytes: an instance that asks for 1537 KiB (not a whole number of
// MiB, which a request or a stored record writes "1573888B") and the nodes'
// capacities and reservations.
func TestAnswersWriteSizesAsBytes(t *testing.T) {
	e := apitest.StartWith(t, memory.New(memory.Options{}), map[string]any{"nodes": 1}, api.Options{}, nil)
	ctx := context.Background()
	if _, err := e.Client(t, "").Submit(ctx, scheduler.Request{ID: "app", Spec: driver.Spec{Image: "x", Resources: driver.Resources{CPU: driver.CPUs(1), Memory: 1537 * driver.KiB}}}); err != nil {
		t.Fatal(err)
	}
	get := func(path string) []byte {
		req, _ := http.NewRequest("GET", e.HTTP.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+e.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s %s", path, resp.Status, buf.String())
		}
		return buf.Bytes()
	}
	inst := get("/v1/instances/app")
	if !bytes.Contains(inst, []byte(`"memory":1573888`)) || bytes.Contains(inst, []byte(`1573888B`)) {
		t.Errorf("GET /v1/instances/app: memory is not the integer 1573888: %s", inst)
	}
	var nodes []any
	dec := json.NewDecoder(bytes.NewReader(get("/v1/nodes")))
	dec.UseNumber()
	if err := dec.Decode(&nodes); err != nil || len(nodes) != 1 {
		t.Fatalf("GET /v1/nodes: %v %v", nodes, err)
	}
	seen := 0
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				walk(k, x)
			}
		case []any:
			for _, x := range v {
				walk(key, x)
			}
		default:
			if key == "memory" || key == "disk" {
				seen++
				if n, ok := v.(json.Number); !ok || strings.ContainsAny(n.String(), ".eE") {
					t.Errorf("GET /v1/nodes: %s = %v, want an integer of bytes", key, v)
				}
			}
		}
	}
	walk("", nodes)
	if seen == 0 {
		t.Errorf("GET /v1/nodes: no memory or disk: %v", nodes)
	}
}
