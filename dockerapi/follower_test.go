package dockerapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/drivers/docker/dockertest"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
)

// followerEnv is the Docker endpoint of a server that follows e's: a
// read-only plane over e's store with a docker provider of its own, the
// endpoint over it with e's endpoint as its leader, on a socket of its own.
type followerEnv struct {
	plane *control.Plane
	sock  string
	// forwarded counts the requests handed to the leader.
	forwarded atomic.Int64
}

// follower starts a follower of e. Unless follow, its read-only plane
// does not run: its copy stays what it loaded, as far behind the store as
// a test makes it.
func (e *env) follower(t *testing.T, follow bool) *followerEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prov := openProvider(t, fmt.Sprintf(`[{"name":"main","address":%q}]`, dockertest.MainHost), e.cluster)
	f := &followerEnv{}
	var err error
	f.plane, err = control.New(ctx, control.Config{Store: e.store, Providers: []*provider.Provider{prov}, Cluster: e.cluster, Logger: quiet, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if follow {
		runPlane(t, f.plane)
	}
	leader := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.forwarded.Add(1)
		e.server.ServeHTTP(w, r)
	})
	s := dockerapi.New(f.plane, dockerapi.Options{Authenticator: e.tokens, Logger: quiet, ServerVersion: "test", Store: e.store, WriteTimeout: writeTimeout, Leader: leader})
	f.sock = serveUnix(t, s)
	return f
}

// docker runs the docker CLI against the follower's endpoint with the
// DOCKER_CONFIG directory config.
func (f *followerEnv) docker(t *testing.T, config string, args ...string) (string, string, int) {
	t.Helper()
	return dockerAt(t, "unix://"+f.sock, config, args...)
}

// served runs the docker CLI against the follower and fails the test
// unless it exits 0 without a request handed to the leader.
func (f *followerEnv) served(t *testing.T, config string, args ...string) string {
	t.Helper()
	before := f.forwarded.Load()
	out, errs, code := f.docker(t, config, args...)
	if code != 0 {
		t.Fatalf("docker %s through the follower: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	if n := f.forwarded.Load() - before; n != 0 {
		t.Errorf("docker %s through the follower: %d requests went to the leader, want none", strings.Join(args, " "), n)
	}
	return out
}

// forwardedTo runs the docker CLI against the follower and fails the test
// unless the leader answered part of it.
func (f *followerEnv) forwardedTo(t *testing.T, config string, args ...string) (string, string, int) {
	t.Helper()
	before := f.forwarded.Load()
	out, errs, code := f.docker(t, config, args...)
	if f.forwarded.Load() == before {
		t.Errorf("docker %s through the follower: nothing went to the leader", strings.Join(args, " "))
	}
	return out, errs, code
}

// waitFollowed waits until the follower's copy shows ref in phase with a
// back-end id.
func (f *followerEnv) waitFollowed(t *testing.T, ref string, phase reconciler.Phase) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		in, err := f.plane.Instance(context.Background(), ref)
		if err == nil && in.Phase == phase && in.BackendID != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower's copy of %s: %+v %v; want %s", ref, in, err, phase)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// inspected is what TestFollowerServesReads compares of docker inspect.
type inspected struct {
	ID    string `json:"Id"`
	Name  string
	State struct {
		Status string
	}
	Config struct {
		Image string
	}
	HostConfig struct {
		AutoRemove bool
	}
}

func inspectJSON(t *testing.T, out string) inspected {
	t.Helper()
	var got []inspected
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 {
		t.Fatalf("docker inspect printed %q: %v", out, err)
	}
	return got[0]
}

// TestFollowerServesReads: a follower's Docker endpoint answers docker ps
// (-a too), inspect, logs, stats and events of the leader's containers,
// the networks and volumes, from its read-only plane and the store, as the
// leader does, with no request to the leader; it hands the leader what
// only the leader knows (docker info, with the nodes' use) and every
// write.
func TestFollowerServesReads(t *testing.T) {
	e := setup(t)
	f := e.follower(t, true)
	start := time.Now()
	web := strings.TrimSpace(e.must(t, "run", "-d", "--name", "web", helloImage))
	tmp := strings.TrimSpace(e.must(t, "run", "-d", "--rm", "--name", "tmp", helloImage))
	e.must(t, "network", "create", "front")
	e.must(t, "volume", "create", "data")
	idle := strings.TrimSpace(e.must(t, "create", "--name", "idle", "--network", "front", "-v", "data:/data", helloImage))
	f.waitFollowed(t, web, reconciler.Running)
	f.waitFollowed(t, tmp, reconciler.Running)

	ps := f.served(t, e.config, "ps", "--format", "{{.Names}}")
	if got := strings.Fields(ps); len(got) != 2 || !strings.Contains(ps, "web") || !strings.Contains(ps, "tmp") {
		t.Errorf("docker ps through the follower: %q, want web and tmp", ps)
	}
	for _, c := range []struct {
		name, id   string
		autoRemove bool
	}{{"web", web, false}, {"tmp", tmp, true}} {
		got := inspectJSON(t, f.served(t, e.config, "inspect", c.name))
		want := inspectJSON(t, e.must(t, "inspect", c.name))
		if got != want || got.ID != c.id || got.State.Status != "running" || got.HostConfig.AutoRemove != c.autoRemove {
			t.Errorf("docker inspect %s through the follower: %+v; the leader: %+v; want id %s, running, AutoRemove %t", c.name, got, want, c.id, c.autoRemove)
		}
	}
	// The program writes its two lines as it starts.
	waitFor(t, "web's output through the follower", func() bool {
		out, _, code := f.docker(t, e.config, "logs", "web")
		return code == 0 && strings.Contains(out, "hello stdout")
	})
	logs := f.served(t, e.config, "logs", "web")
	if !strings.Contains(logs, "hello stdout") {
		t.Errorf("docker logs web through the follower: %q", logs)
	}
	if out := f.served(t, e.config, "stats", "--no-stream", "--format", "{{.Name}}", "web"); strings.TrimSpace(out) != "web" {
		t.Errorf("docker stats --no-stream web through the follower: %q", out)
	}
	if out := f.served(t, e.config, "version", "--format", "{{.Server.Version}}"); strings.TrimSpace(out) != "test" {
		t.Errorf("docker version through the follower: %q", out)
	}
	evs := f.served(t, e.config, "events", "--filter", "type=container", "--format", "{{.Action}} {{.Actor.Attributes.name}}",
		"--since", fmt.Sprint(start.Add(-time.Second).Unix()), "--until", fmt.Sprint(time.Now().Add(time.Second).Unix()))
	for _, want := range []string{"start web", "start tmp"} {
		if !strings.Contains(evs, want) {
			t.Errorf("docker events through the follower: %q, want %q in it", evs, want)
		}
	}

	// The container created and not started is the leader's, kept in the
	// store: the follower reads it there. So are the networks and volumes.
	if out := f.served(t, e.config, "ps", "-a", "--format", "{{.Names}} {{.State}}"); !strings.Contains(out, "idle created") || !strings.Contains(out, "web running") {
		t.Errorf("docker ps -a through the follower: %q; want idle created and web running", out)
	}
	if out := f.served(t, e.config, "ps", "--filter", "status=created", "--format", "{{.Names}}"); strings.TrimSpace(out) != "idle" {
		t.Errorf("docker ps --filter status=created through the follower: %q; want idle", out)
	}
	got := inspectJSON(t, f.served(t, e.config, "inspect", "idle"))
	if want := inspectJSON(t, e.must(t, "inspect", "idle")); got != want || got.ID != idle || got.State.Status != "created" {
		t.Errorf("docker inspect idle through the follower: %+v; the leader: %+v; want id %s, created", got, want, idle)
	}
	if out := f.served(t, e.config, "network", "inspect", "--format", "{{range .Containers}}{{.Name}} {{end}}", "front"); strings.Fields(out)[0] != "idle" || len(strings.Fields(out)) != 1 {
		t.Errorf("docker network inspect front through the follower: %q; want idle on it", out)
	}
	if out := f.served(t, e.config, "network", "ls", "--format", "{{.Name}}"); !strings.Contains(out, "front") {
		t.Errorf("docker network ls through the follower: %q; want front", out)
	}
	if out := f.served(t, e.config, "volume", "ls", "--format", "{{.Name}}"); strings.TrimSpace(out) != "data" {
		t.Errorf("docker volume ls through the follower: %q; want data", out)
	}
	if out := f.served(t, e.config, "volume", "inspect", "--format", "{{.Name}}", "data"); strings.TrimSpace(out) != "data" {
		t.Errorf("docker volume inspect data through the follower: %q", out)
	}
	// A network made after the follower first read them is listed too.
	e.must(t, "network", "create", "back")
	if out := f.served(t, e.config, "network", "ls", "--format", "{{.Name}}"); !strings.Contains(out, "back") {
		t.Errorf("docker network ls through the follower after a create on the leader: %q; want back", out)
	}

	// What the leader alone knows: the nodes' use.
	if out, errs, code := f.forwardedTo(t, e.config, "info", "--format", "{{.Containers}}"); code != 0 || strings.TrimSpace(out) != "3" {
		t.Errorf("docker info through the follower: exit %d, %q %q; want 3 containers", code, out, errs)
	}
	// Another namespace's token: the follower shows it none of these, as
	// the leader does not.
	other := e.dockerConfig(t, e.newToken(t, "other", auth.RoleOperator, "elsewhere"))
	if out := f.served(t, other, "ps", "-a", "--format", "{{.Names}}"); strings.TrimSpace(out) != "" {
		t.Errorf("docker ps -a with another namespace's token through the follower: %q; want nothing", out)
	}
	for _, name := range []string{"web", "idle"} {
		if _, errs, code := f.forwardedTo(t, other, "inspect", name); code == 0 || !strings.Contains(errs, "No such") {
			t.Errorf("docker inspect %s with another namespace's token through the follower: exit %d, %q; want no such container", name, code, errs)
		}
	}
	// Writes go to the leader.
	if _, errs, code := f.forwardedTo(t, e.config, "rm", "-f", "web", "tmp", idle); code != 0 {
		t.Errorf("docker rm -f through the follower: exit %d, %q", code, errs)
	}
	e.waitGone(t, web)
	e.waitGone(t, tmp)
	if _, errs, code := f.forwardedTo(t, e.config, "network", "rm", "front", "back"); code != 0 {
		t.Errorf("docker network rm through the follower: exit %d, %q", code, errs)
	}
	if _, errs, code := f.forwardedTo(t, e.config, "volume", "rm", "data"); code != 0 {
		t.Errorf("docker volume rm through the follower: exit %d, %q", code, errs)
	}
	if out := f.served(t, e.config, "network", "ls", "--format", "{{.Name}}"); strings.Contains(out, "front") || strings.Contains(out, "back") {
		t.Errorf("docker network ls through the follower after the removal: %q", out)
	}
}

// TestFollowerReadsAreFresh: what a follower says of a container is what
// the store holds, however far behind its copy is: a container the leader
// stopped is not shown running, nor one it started shown created.
func TestFollowerReadsAreFresh(t *testing.T) {
	e := setup(t)
	e.must(t, "run", "-d", "--name", "web", helloImage)
	e.waitPhase(t, "web", reconciler.Running)
	f := e.follower(t, false) // its copy shows web running, for good
	if out := f.served(t, e.config, "inspect", "--format", "{{.State.Status}}", "web"); strings.TrimSpace(out) != "running" {
		t.Fatalf("docker inspect web through the follower: %q, want running", out)
	}
	e.must(t, "stop", "web")
	out, errs, code := f.forwardedTo(t, e.config, "inspect", "--format", "{{.State.Status}}", "web")
	if code != 0 || strings.TrimSpace(out) != "exited" {
		t.Errorf("docker inspect web through a follower whose copy is behind: exit %d, %q %q; want exited", code, out, errs)
	}
	// A container created since: the store keeps it, the follower reads
	// it there; once started, the follower's copy does not hold it and
	// the leader answers.
	e.must(t, "create", "--name", "late", helloImage)
	if out := f.served(t, e.config, "inspect", "--format", "{{.State.Status}}", "late"); strings.TrimSpace(out) != "created" {
		t.Errorf("docker inspect late, created, through the follower: %q, want created", out)
	}
	e.must(t, "start", "late")
	out, errs, code = f.forwardedTo(t, e.config, "inspect", "--format", "{{.State.Status}}", "late")
	if code != 0 || strings.TrimSpace(out) != "running" {
		t.Errorf("docker inspect late, started, through a follower whose copy is behind: exit %d, %q %q; want running", code, out, errs)
	}
}
