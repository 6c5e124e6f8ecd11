package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/freeport"
)

// TestDockerEndpointHighAvailability: three servers on etcd each serve the
// Docker endpoint; the docker CLI pointed at a follower runs a container
// (the follower forwards to the leader), another follower lists it and
// streams its logs, and after the leader is killed a survivor still
// answers for it.
func TestDockerEndpointHighAvailability(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("three servers: skipped in -short mode")
	}
	if _, err := exec.LookPath("docker"); err != nil {
		t.Fatal("this test needs the docker CLI: ", err)
	}
	// Two containers: the engine is shared with the rest of the suite.
	_, image := engineFor(t, "ha-docker", false)

	h := newHACluster(t, false)
	var dockerAddr [3]string
	for i := range h.args {
		dockerAddr[i] = fmt.Sprintf("127.0.0.1:%d", freeport.Port(t))
		h.args[i] = append(h.args[i], "--docker-listen", dockerAddr[i])
	}
	h.start(0, 1, 2)
	lead := h.leader(0, 1, 2)
	f1, f2 := (lead+1)%3, (lead+2)%3
	cfg := t.TempDir()
	if err := os.WriteFile(filepath.Join(cfg, "config.json"), []byte(`{"HttpHeaders": {"Authorization": "Bearer `+h.token+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	docker := func(i int, args ...string) (string, error) {
		return dockerCLI([]string{"DOCKER_HOST=tcp://" + dockerAddr[i], "DOCKER_CONFIG=" + cfg}, args...)
	}
	name := h.name + "-web"
	if out, err := docker(f1, "run", "-d", "--name", name, image); err != nil {
		t.Fatalf("docker run -d through the follower %s: %v: %s", memberNames[f1], err, out)
	}
	waitFor(t, "the container listed through the other follower", func() bool {
		out, err := docker(f2, "ps", "--format", "{{.Names}} {{.State}}")
		return err == nil && strings.Contains(out, name+" running")
	})
	// Running is not yet printed: the engine reports a container running
	// once its process is started, which on a loaded machine may write
	// its first line a while later.
	var said string
	waitFor(t, `"hello" in docker logs through the follower `+memberNames[f2], func() bool {
		out, err := docker(f2, "logs", name)
		if got := fmt.Sprintf("%v: %q", err, out); got != said {
			t.Logf("docker logs through the follower %s: %s", memberNames[f2], got)
			said = got
		}
		return err == nil && strings.Contains(out, "hello")
	})
	// The API of a follower reads the container's logs and stats through
	// its own provider (the engine is a shared back-end), not the leader.
	for path, want := range map[string]string{"/v1/instances/" + name + "/logs": "hello", "/v1/instances/" + name + "/stats?stream=false": `"memory_bytes"`} {
		waitFor(t, "GET "+path+" served by the follower "+memberNames[f2], func() bool {
			resp, b, err := h.get(f2, path)
			return err == nil && resp.StatusCode == http.StatusOK && resp.Header.Get("Berth-Served-By") == memberNames[f2] && strings.Contains(string(b), want)
		})
	}
	// So does its Docker endpoint, for the reads its copy and etcd
	// answer: the containers created and not started are kept in etcd,
	// so docker ps -a too. What only the leader knows (docker info, with
	// the nodes' use) the leader answers.
	idle := h.name + "-idle"
	if out, err := docker(f1, "create", "--name", idle, image); err != nil {
		t.Fatalf("docker create through the follower %s: %v: %s", memberNames[f1], err, out)
	}
	for path, want := range map[string]string{
		"/containers/json": name, "/containers/" + name + "/json": `"Running":true`,
		"/containers/" + name + "/logs?stdout=1": "hello", "/containers/" + name + "/stats?stream=false": `"memory_stats"`,
		"/containers/json?all=1": `"/` + idle + `"`, "/containers/" + idle + "/json": `"Status":"created"`,
	} {
		waitFor(t, "Docker GET "+path+" served by the follower "+memberNames[f2], func() bool {
			resp, b, err := h.getFrom("http://"+dockerAddr[f2], path)
			return err == nil && resp.StatusCode == http.StatusOK && resp.Header.Get("Berth-Served-By") == memberNames[f2] && strings.Contains(string(b), want)
		})
	}
	if resp, b, err := h.getFrom("http://"+dockerAddr[f2], "/info"); err != nil || resp.StatusCode != http.StatusOK ||
		resp.Header.Get("Berth-Served-By") != "" || !strings.Contains(string(b), `"Containers":2`) {
		t.Errorf("Docker GET /info through the follower %s: %v, %v, %s; want the leader's answer, with two containers", memberNames[f2], resp, err, b)
	}

	// The container created, not started, when the leader dies: the next
	// leader has it (kept in etcd) and starts it.
	h.servers[lead].kill9(t)
	lead = h.leader(f1, f2)
	t.Logf("after the kill: %s leads", memberNames[lead])
	for _, i := range []int{f1, f2} {
		waitFor(t, "the container listed through "+memberNames[i]+" after the kill", func() bool {
			out, err := docker(i, "ps", "--format", "{{.Names}}")
			return err == nil && strings.Contains(out, name)
		})
	}
	if out, err := docker(f2, "ps", "-a", "--filter", "name="+idle, "--format", "{{.Names}} {{.State}}"); err != nil || strings.TrimSpace(out) != idle+" created" {
		t.Errorf("docker ps -a of the created container after the kill: %v: %q; want it created", err, out)
	}
	// A loaded machine may cost the new leader its lease too (a needless
	// failover): a write it was forwarded then answers that it may or may
	// not have been made. Each write below is one a client may repeat.
	if out, err := repeatOnLeaderChange(func() (string, error) { return docker(f2, "start", idle) }); err != nil {
		t.Fatalf("docker start of the container created before the kill: %v: %s", err, out)
	}
	waitFor(t, "the container created before the kill running", func() bool {
		out, err := docker(f1, "ps", "--filter", "name="+idle, "--format", "{{.Names}}")
		return err == nil && strings.TrimSpace(out) == idle
	})
	for _, n := range []string{name, idle} {
		repeated := false
		out, err := repeatOnLeaderChange(func() (string, error) {
			out, err := docker(f1, "rm", "-f", n)
			if err != nil && repeated && strings.Contains(out, "No such container") {
				return out, nil // the removal that may not have been made was
			}
			repeated = true
			return out, err
		})
		if err != nil {
			t.Fatalf("docker rm -f %s: %v: %s", n, err, out)
		}
	}
	for _, n := range []string{name, idle} {
		waitFor(t, n+" gone from the engine", func() bool {
			out, err := dockerCLI(nil, "ps", "-a", "--filter", "name="+n, "--format", "{{.Names}}")
			return err == nil && strings.TrimSpace(out) == ""
		})
	}
}

// repeatOnLeaderChange runs write again, for up to two minutes, while it
// fails because no leader answered it: the leader it was forwarded to lost
// the lead before it answered, or none is elected (both 503, Retry-After
// 1). Any other outcome is returned.
func repeatOnLeaderChange(write func() (string, error)) (string, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := write()
		if err == nil || time.Now().After(deadline) ||
			!strings.Contains(out, "lost the lead before it answered") && !strings.Contains(out, "no Berth server leads right now") {
			return out, err
		}
		time.Sleep(time.Second)
	}
}
