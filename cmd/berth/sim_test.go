package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// simWorkload writes a small workload with a constraint: 10 ssd nodes of
// 4 cpus take all 60 requests of 0.5 cpu.
func simWorkload(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ssd.json")
	err := os.WriteFile(path, []byte(`{"name": "ssd",
		"nodes": [{"count": 10, "name_prefix": "ssd", "cpus": 4, "memory": "8Gi", "labels": {"disk": "ssd"}},
		          {"count": 10, "name_prefix": "hdd", "cpus": 4, "memory": "8Gi", "labels": {"disk": "hdd"}}],
		"requests": [{"image": "web", "cpus": 0.5, "memory": 256, "constraints": ["disk==ssd"], "repeat": 60}]}`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSimFullJSON(t *testing.T) {
	file := simWorkload(t)
	for _, args := range [][]string{
		{"sim", "--workload", file, "--full", "--json"},
		{"sim", "--workload", file, "--path", "full", "--store", "bolt", "--json"},
	} {
		t.Setenv("TMPDIR", t.TempDir())
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		var res struct {
			Path         string `json:"path"`
			Store        string `json:"store"`
			Placed       int    `json:"placed"`
			Running      *int   `json:"running"`
			DoubleBooked *int   `json:"double_booked"`
			Misplaced    *int   `json:"misplaced"`
			NodesUsed    int    `json:"nodes_used"`
		}
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("%v: %v in %s", args, err, out.String())
		}
		if res.Path != "full" || res.Placed != 60 || res.Running == nil || *res.Running != 60 || res.DoubleBooked == nil || *res.DoubleBooked != 0 ||
			res.Misplaced == nil || *res.Misplaced != 0 || res.NodesUsed != 10 {
			t.Fatalf("%v: %s", args, out.String())
		}
		if want := args[len(args)-2]; want == "bolt" && res.Store != "bolt" {
			t.Fatalf("%v: store %q", args, res.Store)
		}
	}
}

func TestSimFullSummary(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"sim", "--workload", simWorkload(t), "--full"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"full control plane (memory store)", "running    60, failed 0", "0 double-booked nodes", "0 misplaced"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

func TestSimFullUsage(t *testing.T) {
	for _, args := range [][]string{
		{"sim", "--workload", "w2", "--full", "--schedulers", "2"},
		{"sim", "--workload", "w2", "--full", "--seed", "1"},
		{"sim", "--workload", "w2", "--full", "--sample", "3"},
		{"sim", "--workload", "w2", "--full", "--queue", "fifo"},
		{"sim", "--workload", "w2", "--full", "--store", "etcd"},
		{"sim", "--workload", "w2", "--store", "bolt"},
		{"sim", "--workload", "w2", "--path", "api"},
		{"sim", "--workload", "w2", "--full", "--path", "scheduler"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, exitUsage, errb.String())
		}
	}
}

func TestSimAdvised(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idle.json")
	if err := os.WriteFile(path, []byte(`{"name": "idle",
		"nodes": [{"count": 20, "cpus": 4, "memory": "16Gi"}],
		"requests": [{"image": "idle", "type": "batch", "cpus": 2, "memory": 1024, "repeat": 20, "used": {"cpus": 0.05, "memory": 100}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"sim", "--workload", path, "--advised", "--json"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var res struct {
		AsGiven struct {
			NodesUsed int `json:"nodes_used"`
		} `json:"as_given"`
		Advised struct {
			NodesUsed int `json:"nodes_used"`
			Placed    int `json:"placed"`
		} `json:"advised"`
		Resized int `json:"resized"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	if res.Resized != 20 || res.AsGiven.NodesUsed != 10 || res.Advised.NodesUsed != 1 || res.Advised.Placed != 20 {
		t.Fatalf("advised replay: %s", out.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"sim", "--workload", path, "--advised"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "nodes used at peak 10 -> 1") {
		t.Fatalf("exit %d: %s", code, out.String())
	}
}
