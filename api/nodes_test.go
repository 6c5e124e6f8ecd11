package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
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
