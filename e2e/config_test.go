package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver/drivertest"
)

// serverExit runs `berth server` with args, expecting it to fail at once,
// and returns its stderr and exit code.
func serverExit(t *testing.T, args ...string) (string, int) {
	t.Helper()
	// A server that starts instead of refusing is stopped: the case fails
	// on its exit status, not by hanging the suite.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, berthBin, append([]string{"server"}, args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("berth server %v: %v (%s)", args, err, out)
	}
	return string(out), ee.ExitCode()
}

func TestServerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	data := "data_dir: " + filepath.Join(dir, "data") + "\n"
	good := "listen: 127.0.0.1:0\n" + data + "providers:\n  - name: sim\n    driver: sim\n    options: {nodes: 5}\n"
	cases := []struct {
		name  string
		args  []string
		code  int
		wants []string
	}{
		{"unknown option", []string{"--config", write("a.yaml", "providers:\n  - name: sim\n    driver: sim\n    options: {nodez: 5}\n")}, 4,
			[]string{"a.yaml", "providers[0].options.nodez", "unknown option"}},
		{"wrong type", []string{"--config", write("b.yaml", "shutdown_timeout: [1]\n")}, 4,
			[]string{"b.yaml", "shutdown_timeout", "want a duration"}},
		{"unknown key", []string{"--config", write("c.yaml", "providers:\n  - name: sim\n    drivr: sim\n")}, 4,
			[]string{"c.yaml", "providers[0].drivr", "line 3"}},
		{"oversized", []string{"--config", write("d.yaml", "#"+strings.Repeat("x", 1<<20)+"\n")}, 4,
			[]string{"d.yaml", "larger than"}},
		{"flag overrides file", []string{"--config", write("e.yaml", good), "--sim-nodes", "many"}, 4,
			[]string{"providers[0].options.nodes"}},
		{"unknown driver", []string{"--config", write("f.yaml", "providers:\n  - {name: x, driver: nope}\n")}, 4,
			[]string{"providers[0].driver", "nope"}},
		{"no data dir", []string{"--config", write("g.yaml", "providers:\n  - {name: sim, driver: sim}\n")}, 2,
			[]string{"data directory"}},
		{"bad flag", []string{"--no-such-flag"}, 2, []string{"no-such-flag"}},
		{"bad memory limit", []string{"--config", write("h.yaml", good), "--memory-limit", "lots"}, 2,
			[]string{"--memory-limit", "lots"}},
		{"negative memory limit", []string{"--config", write("i.yaml", good+"memory_limit: -5Gi\n")}, 4,
			[]string{"i.yaml", "memory_limit", "negative"}},
		// What would expose the server, or what it would ignore.
		{"open listener without TLS", []string{"--dev", "--data-dir", filepath.Join(dir, "d1"), "--listen", "0.0.0.0:0"}, 2,
			[]string{"0.0.0.0:0", "TLS", "--insecure"}},
		{"provider name escaping the data dir", []string{"--config", write("j.yaml", data+"providers:\n  - {name: ../../x, driver: sim}\n")}, 4,
			[]string{"providers[0].name", "DNS label"}},
		{"flags of an unused driver", []string{"--dev", "--data-dir", filepath.Join(dir, "d2"), "--sim-nodes", "5"}, 4,
			[]string{"--sim-nodes", "no provider uses the sim driver"}},
		{"a million workers", []string{"--config", write("k.yaml", data+"providers:\n  - {name: sim, driver: sim}\nreconcile: {workers: 1000000}\n")}, 4,
			[]string{"reconcile.workers", "0 to 256"}},
		{"a nanosecond sync", []string{"--config", write("l.yaml", data+"providers:\n  - {name: sim, driver: sim}\nreconcile: {sync_interval: 1ns}\n")}, 4,
			[]string{"reconcile.sync_interval", "100ms"}},
		{"a nanosecond poll", []string{"--dev", "--data-dir", filepath.Join(dir, "d3"), "--local-poll-interval", "1ns"}, 4,
			[]string{"poll_interval", "5ms"}},
		{"half a TLS pair", []string{"--dev", "--data-dir", filepath.Join(dir, "d4"), "--tls-cert", "/nonexistent.pem"}, 4,
			[]string{"tls", "cert and key"}},
		// A server on etcd.
		{"external and embedded etcd", []string{"--dev", "--data-dir", filepath.Join(dir, "d5"), "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-name", "a", "--etcd-peer-url", "http://127.0.0.1:2"}, 2,
			[]string{"--etcd-endpoints", "not both"}},
		{"member flags without a member", []string{"--dev", "--data-dir", filepath.Join(dir, "d6"), "--etcd-peer-url", "http://127.0.0.1:2"}, 2,
			[]string{"etcd-peer-url", "needs --etcd-name"}},
		{"a member open to the network", []string{"--dev", "--data-dir", filepath.Join(dir, "d7"), "--etcd-name", "a", "--etcd-peer-url", "http://10.1.2.3:2380"}, 2,
			[]string{"etcd-peer-url", "loopback", "TLS"}},
		{"a cluster without this member", []string{"--dev", "--data-dir", filepath.Join(dir, "d8"), "--etcd-name", "a", "--etcd-peer-url", "http://127.0.0.1:2380", "--etcd-initial-cluster", "b=http://127.0.0.1:2381"}, 2,
			[]string{"etcd-initial-cluster", "does not name this member"}},
		{"a 100 ms lease", []string{"--dev", "--data-dir", filepath.Join(dir, "d9"), "--etcd-name", "a", "--etcd-peer-url", "http://127.0.0.1:2380", "--leader-lease", "100ms"}, 2,
			[]string{"leader-lease", "1s to 1m"}},
		{"an election faster than five heartbeats", []string{"--dev", "--data-dir", filepath.Join(dir, "d11"), "--etcd-name", "a", "--etcd-peer-url", "http://127.0.0.1:2380", "--etcd-heartbeat-interval", "50ms", "--etcd-election-timeout", "100ms"}, 2,
			[]string{"etcd-election-timeout", "five heartbeats"}},
		{"a lease shorter than etcd grants", []string{"--dev", "--data-dir", filepath.Join(dir, "d40"), "--etcd-name", "a", "--etcd-peer-url", "http://127.0.0.1:2380", "--etcd-election-timeout", "1s", "--leader-lease", "1s"}, 2,
			[]string{"leader-lease", "no lease shorter than 2s"}},
		{"a lease without etcd", []string{"--dev", "--data-dir", filepath.Join(dir, "d10"), "--leader-lease", "5s"}, 2,
			[]string{"--leader-lease", "etcd"}},
		{"a Docker advertise URL without etcd", []string{"--dev", "--data-dir", filepath.Join(dir, "d12"), "--docker-advertise-url", "http://127.0.0.1:2375"}, 2,
			[]string{"--docker-advertise-url", "etcd"}},
		{"a bad Docker advertise URL", []string{"--dev", "--data-dir", filepath.Join(dir, "d13"), "--etcd-name", "a", "--etcd-peer-url", "http://127.0.0.1:2380", "--docker-advertise-url", "ftp://x"}, 2,
			[]string{"docker-advertise-url", "http(s)://HOST:PORT"}},
		{"a Docker endpoint on a unix socket on etcd", []string{"--dev", "--data-dir", filepath.Join(dir, "d14"), "--etcd-name", "a", "--etcd-peer-url", "http://127.0.0.1:2380", "--docker-listen", filepath.Join(dir, "d.sock")}, 2,
			[]string{"--docker-listen", "TCP", "--docker-advertise-url"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code := serverExit(t, c.args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d: %s", code, c.code, out)
			}
			for _, w := range c.wants {
				if !strings.Contains(out, w) {
					t.Errorf("output %q does not mention %q", out, w)
				}
			}
		})
	}
}

// TestGracefulShutdownEndsStreams starts an events follower and checks that
// SIGTERM ends it and the server cleanly.
func TestGracefulShutdownEndsStreams(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	cmd := exec.Command(berthBin, "events")
	cmd.Env = s.env()
	var out drivertest.SyncBuffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// The stream is open once an instance submitted now shows up in it.
	n := 0
	waitFor(t, "an event on the stream", func() bool {
		n++
		mustBerth(t, s, "run", "--name", "evt-"+itoa(n), "--", "true")
		time.Sleep(200 * time.Millisecond)
		return strings.Contains(out.String(), "evt-")
	})
	if err := s.stop(t); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, tail(s.logs(), 20))
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("berth events after the server stopped: %v", err)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("berth events still runs after the server stopped")
	}
	if !strings.Contains(s.logs(), `"msg":"stopped"`) {
		t.Errorf("no stopped line in the log:\n%s", tail(s.logs(), 10))
	}
}

// TestSimServerFromConfig runs a server configured by file (a sim provider
// whose node count comes from a flag) and uses the verbs that the local
// back-end cannot show: nodes, images, preload with progress, plan.
func TestSimServerFromConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "berth.yaml")
	body := "listen: 127.0.0.1:0\ndata_dir: " + filepath.Join(dir, "data") + "\n" +
		"providers:\n  - name: sim\n    driver: sim\n    options: {nodes: 2, shape: '{\"cpus\": 4, \"memory\": \"8Gi\"}'}\n" +
		"quotas:\n  - {provider: sim, instances: 50}\n"
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServerWith(t, "--config", cfg, "--sim-nodes", "3", "--memory-limit", "3Gi", "--gc-percent", "300")
	s.dataDir = filepath.Join(dir, "data")
	// The soft memory limit and the GC target reached the runtime: Go's
	// collector reports them.
	metrics := s.get(t, "/metrics")
	if !strings.Contains(string(metrics), "go_gc_gomemlimit_bytes 3.221225472e+09") {
		t.Errorf("/metrics does not report the 3Gi memory limit:\n%s", grepLines(string(metrics), "gomemlimit"))
	}
	if !strings.Contains(string(metrics), "go_gc_gogc_percent 300") {
		t.Errorf("/metrics does not report the GC target of 300:\n%s", grepLines(string(metrics), "gogc"))
	}
	var nodes []map[string]any
	if err := json.Unmarshal([]byte(mustBerth(t, s, "nodes", "--json")), &nodes); err != nil || len(nodes) != 3 {
		t.Fatalf("--sim-nodes 3 did not override the file: %v %d nodes", err, len(nodes))
	}
	node, _ := nodes[0]["name"].(string)
	out, stderr, code := berth(t, s, "preload", "--provider", "sim", "--node", node, "busybox:latest")
	if code != 0 || !strings.Contains(out, "busybox:latest is present") || !strings.Contains(stderr, node+": busybox:latest") {
		t.Fatalf("preload: exit %d\nstdout %q\nstderr %q", code, out, stderr)
	}
	if images := mustBerth(t, s, "images", "--provider", "sim", "--node", node); !strings.Contains(images, "busybox:latest") {
		t.Fatalf("images after preload: %q", images)
	}
	if plan := mustBerth(t, s, "plan", "--cpus", "100", "busybox"); !strings.Contains(plan, "cannot be placed") || !strings.Contains(plan, "3 nodes") {
		t.Fatalf("plan: %q", plan)
	}
	if q := mustBerth(t, s, "quotas"); !strings.Contains(q, "provider") || !strings.Contains(q, "0/50") {
		t.Fatalf("quotas: %q", q)
	}
	if _, stderr, code := berth(t, s, "images", "--provider", "nope"); code != 3 && code != 4 {
		t.Fatalf("images of an unknown provider: exit %d (%s)", code, stderr)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
