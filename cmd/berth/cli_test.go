package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// testServer serves the API over a sim back-end with two nodes and a memory
// store and returns its address.
func testServer(t *testing.T) string {
	t.Helper()
	return apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 2}, api.Options{}).HTTP.URL
}

// berth runs the CLI against addr and returns its exit code, stdout and
// stderr.
func berth(t *testing.T, addr string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"--addr", addr}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestListAndChangeVerbs(t *testing.T) {
	addr := testServer(t)
	ctx := context.Background()
	for _, o := range []struct{ owner, id string }{{"alice", "a1"}, {"alice", "a2"}, {"bob", "b1"}} {
		cl, err := client.New(addr, client.WithOwner(o.owner))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x"}, ID: o.id}); err != nil {
			t.Fatal(err)
		}
	}

	code, out, errOut := berth(t, addr, "ps", "--owner", "alice", "--json")
	if code != 0 {
		t.Fatalf("ps --owner alice --json: exit %d: %s", code, errOut)
	}
	var list []control.Instance
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ps --json: %v: %q", err, out)
	}
	for _, in := range list {
		if in.Owner != "alice" {
			t.Errorf("ps --owner alice lists %s of %q", in.ID, in.Owner)
		}
	}
	if len(list) != 2 {
		t.Errorf("ps --owner alice: %d instances, want 2", len(list))
	}
	if code, out, _ := berth(t, addr, "ps", "--owner", "nobody", "--json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("ps of an owner with nothing: exit %d %q, want []", code, out)
	}

	code, out, _ = berth(t, addr, "nodes")
	if code != 0 || !strings.HasPrefix(out, "PROVIDER") || strings.Count(out, "\n") != 3 {
		t.Errorf("nodes: exit %d, want a header and two rows:\n%s", code, out)
	}

	code, _, errOut = berth(t, addr, "inspect", "--json", list[0].ID)
	if code != exitUsage {
		t.Errorf("inspect --json: exit %d (%s), want usage error: inspect always prints JSON", code, errOut)
	}

	// One good and one unknown reference: the good one is done and printed,
	// the unknown one reported, and the exit code is not found's.
	code, out, errOut = berth(t, addr, "rm", "b1", "no-such-instance")
	if code != 3 || strings.TrimSpace(out) != "b1" || !strings.Contains(errOut, "no-such-instance") {
		t.Errorf("rm b1 no-such-instance: exit %d, stdout %q, stderr %q; want 3, b1, the unknown one named", code, out, errOut)
	}
}
