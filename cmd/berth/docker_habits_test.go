package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/reconciler"
)

func TestSecondsFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{"5", 5 * time.Second, false},
		{"0", 0, false},
		{"1m30s", 90 * time.Second, false},
		{"-1", 0, true},
		{"soon", 0, true},
	} {
		var s seconds
		err := s.Set(tc.in)
		if (err != nil) != tc.bad || (!tc.bad && time.Duration(s) != tc.want) {
			t.Errorf("seconds.Set(%q) = %v, %v; want %v (error %v)", tc.in, time.Duration(s), err, tc.want, tc.bad)
		}
	}
}

func TestLogOptions(t *testing.T) {
	for _, tc := range []struct {
		follow   bool
		tail     int
		wantTail int
		skip     bool
		usage    bool
	}{
		{false, -1, 0, false, false},
		{false, 0, 0, true, false},
		{true, 0, 0, false, true},
		{false, 3, 3, false, false},
		{false, -2, 0, false, true},
	} {
		opts, skip, err := logOptions(tc.follow, tc.tail, false, false)
		if skip != tc.skip || (err != nil) != tc.usage || (err == nil && opts.Tail != tc.wantTail) {
			t.Errorf("logOptions(follow %v, tail %d) = %+v, %v, %v", tc.follow, tc.tail, opts, skip, err)
		}
		if err != nil && exitCode(err) != exitUsage {
			t.Errorf("logOptions(follow %v, tail %d): exit code %d, want %d", tc.follow, tc.tail, exitCode(err), exitUsage)
		}
	}
}

// TestEventPrinter: each line carries a time, and an event that shows
// nothing new is left out.
func TestEventPrinter(t *testing.T) {
	var buf bytes.Buffer
	p := newEventPrinter(&buf)
	p.now = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
	in := &control.Instance{ID: "a", Name: "web", Phase: reconciler.Running, Provider: "sim", Node: "n1"}
	p.print(control.Event{Revision: 1, Kind: control.EventInstance, Instance: in})
	p.print(control.Event{Revision: 2, Kind: control.EventInstance, Instance: in}) // the same again
	stopped := *in
	stopped.Phase = reconciler.Stopped
	p.print(control.Event{Revision: 3, Kind: control.EventInstance, Instance: &stopped})
	want := "2026-01-02T03:04:05Z 1 instance a web running sim n1\n2026-01-02T03:04:05Z 3 instance a web stopped sim n1\n"
	if buf.String() != want {
		t.Errorf("events printed\n%s\nwant\n%s", buf.String(), want)
	}
}

// TestHabitsExitCodesAndJSON: the exit codes docs/cli.md gives, and the
// --json shapes of the verbs added here.
func TestHabitsExitCodesAndJSON(t *testing.T) {
	addr := testServer(t)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"frobnicate"}, exitUsage},
		{[]string{"ps", "--no-such-flag"}, exitUsage},
		{[]string{"inspect"}, exitUsage},
		{[]string{"inspect", "nothere"}, exitNotFound},
		{[]string{"logs", "nothere"}, exitNotFound},
		{[]string{"rm", "nothere"}, exitNotFound},
		{[]string{"run", "--cpus", "-1", "busybox"}, exitInvalid},
		{[]string{"run", "--memory", "lots", "busybox"}, exitUsage},
		{[]string{"ps"}, exitOK},
		{[]string{"nodes", "--json"}, exitOK},
		{[]string{"advise"}, exitOK},
		{[]string{"advise", "--json"}, exitOK},
		{[]string{"advise", "extra"}, exitUsage},
		{[]string{"images"}, exitOK},
		{[]string{"images", "--node", "n"}, exitUsage},
		{[]string{"images", "--provider", "nope"}, exitNotFound},
		{[]string{"preload", "busybox"}, exitUsage},
		{[]string{"logs", "--tail", "0", "-f", "x"}, exitUsage},
		{[]string{"stop", "-t", "soon", "x"}, exitUsage},
		{[]string{"stop", "-t", "1", "nothere"}, exitNotFound},
		{[]string{"version"}, exitOK},
		{[]string{"group", "ls"}, exitOK},
		{[]string{"group", "inspect", "nothere"}, exitNotFound},
		{[]string{"group", "rm", "nothere"}, exitNotFound},
		{[]string{"compose", "up", "-f", "/nonexistent/compose.yaml"}, exitError},
		{[]string{"compose", "up", "-f", "../../compose/testdata/unhonoured.yaml"}, exitUnsupported},
	} {
		code, _, errOut := berth(t, addr, tc.args...)
		if code != tc.code {
			t.Errorf("berth %s: exit %d, want %d (%s)", strings.Join(tc.args, " "), code, tc.code, errOut)
		}
	}
	if code, _, errOut := berth(t, "http://127.0.0.1:1", "ps"); code != exitUnavailable || !strings.Contains(errOut, "is the server running at http://127.0.0.1:1?") {
		t.Errorf("ps against no server: exit %d, %q", code, errOut)
	}

	code, out, _ := berth(t, addr, "version", "--json")
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v["client"] == "" || v["server"] == nil {
		t.Errorf("version --json: %d %q %v", code, out, err)
	}
	if code, _, errOut := berth(t, addr, "preload", "--provider", "sim", "busybox:latest"); code != 0 {
		t.Fatalf("preload: %d %s", code, errOut)
	}
	code, out, _ = berth(t, addr, "images", "--json")
	var imgs []map[string]any
	if err := json.Unmarshal([]byte(out), &imgs); code != 0 || err != nil || len(imgs) != 2 || imgs[0]["provider"] == nil || imgs[0]["node"] == nil || imgs[0]["name"] == nil {
		t.Errorf("images --json: %d %q %v", code, out, err)
	}
	code, out, _ = berth(t, addr, "group", "ls", "--json")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("group ls --json with no group: %d %q", code, out)
	}
	code, out, _ = berth(t, addr, "ps")
	if code != 0 || !strings.Contains(out, "PORTS") {
		t.Errorf("ps has no PORTS column: %q", out)
	}
}

// TestJSONKeysSnakeCase: every --json output follows one convention: keys
// in snake_case, sizes as integers of bytes (the instance asks for 1537 KiB,
// not a whole number of MiB, which Bytes' own JSON would write "1573888B"),
// times in RFC 3339.
func TestJSONKeysSnakeCase(t *testing.T) {
	addr := testServer(t)
	if code, _, errOut := berth(t, addr, "run", "--name", "j", "--memory", "1537k", "busybox"); code != 0 {
		t.Fatalf("run: %s", errOut)
	}
	sizes := 0
	for _, args := range [][]string{
		{"providers", "--json"}, {"nodes", "--json"}, {"ps", "--json"}, {"quotas", "--json"},
		{"drivers", "--json"}, {"images", "--json"}, {"version", "--json"}, {"group", "ls", "--json"}, {"inspect", "j"},
	} {
		code, out, errOut := berth(t, addr, args...)
		if code != 0 {
			t.Errorf("berth %v: exit %d: %s", args, code, errOut)
			continue
		}
		dec := json.NewDecoder(strings.NewReader(out))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Errorf("berth %v: %v", args, err)
			continue
		}
		if bad := nonSnakeKeys(v, nil); len(bad) > 0 {
			t.Errorf("berth %v: keys not in snake_case: %v", args, bad)
		}
		walkJSON(v, "", func(key string, x any) {
			switch key {
			case "memory", "disk", "memory_reservation", "size", "used_memory", "memory_bytes", "memory_limit_bytes":
				sizes++
				n, ok := x.(json.Number)
				if _, err := n.Int64(); !ok || err != nil {
					t.Errorf("berth %v: %s = %v, want an integer number of bytes", args, key, x)
				}
			case "time", "created", "since", "updated", "started", "finished":
				s, ok := x.(string)
				if _, err := time.Parse(time.RFC3339Nano, s); !ok || err != nil {
					t.Errorf("berth %v: %s = %v, want a time in RFC 3339", args, key, x)
				}
			}
		})
		if strings.Contains(out, "1573888B") || (args[0] == "inspect" && !strings.Contains(out, "1573888")) {
			t.Errorf("berth %v: the instance's memory is not 1573888 bytes as an integer: %s", args, out)
		}
	}
	if sizes == 0 {
		t.Error("no size in any output: the check saw nothing")
	}
}

// walkJSON calls fn with every key of every object in v and its value.
func walkJSON(v any, key string, fn func(key string, v any)) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			fn(k, x)
			walkJSON(x, k, fn)
		}
	case []any:
		for _, x := range v {
			walkJSON(x, key, fn)
		}
	}
}

func nonSnakeKeys(v any, bad []string) []string {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if strings.ToLower(k) != k || strings.ContainsAny(k, " -") {
				bad = append(bad, k)
			}
			bad = nonSnakeKeys(x, bad)
		}
	case []any:
		for _, x := range v {
			bad = nonSnakeKeys(x, bad)
		}
	}
	return bad
}
