package dockerapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/config"
	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/docker/dockertest"
	"github.com/berth-dev/berth/reconciler"
)

// TestNetworks drives the network routes with the docker CLI: create, ls,
// inspect, a container created on the network, rm refused while it is
// on it, connect and disconnect of a created container, prune.
func TestNetworks(t *testing.T) {
	e := setup(t)
	id := strings.TrimSpace(e.must(t, "network", "create", "--label", "tier=front", "front"))
	if len(id) != 64 {
		t.Fatalf("docker network create printed %q, want a 64-digit id", id)
	}
	if _, errs, code := e.docker(t, "network", "create", "front"); code == 0 || !strings.Contains(errs, "already exists") {
		t.Errorf("a second network front: exit %d, %s", code, errs)
	}
	if _, errs, code := e.docker(t, "network", "create", "--subnet", "10.9.0.0/24", "sub"); code == 0 || !strings.Contains(errs, "--subnet") {
		t.Errorf("network create --subnet: exit %d, %s; want a refusal naming --subnet", code, errs)
	}
	if _, errs, code := e.docker(t, "network", "create", "-d", "overlay", "ov"); code == 0 || !strings.Contains(errs, "--driver overlay") {
		t.Errorf("network create -d overlay: exit %d, %s", code, errs)
	}
	if _, errs, code := e.docker(t, "network", "create", "-o", "com.docker.network.bridge.name=x", "opt"); code == 0 || !strings.Contains(errs, "--opt com.docker.network.bridge.name") {
		t.Errorf("network create -o com.docker.network.bridge.name=x: exit %d, %s", code, errs)
	}
	e.must(t, "network", "create", "-o", dockerapi.OptSpread+"=true", "wide")
	if got := strings.TrimSpace(e.must(t, "network", "inspect", "--format", "{{index .Options \""+dockerapi.OptSpread+"\"}}", "wide")); got != "true" {
		t.Errorf("the options of a network made with -o %s=true: %q", dockerapi.OptSpread, got)
	}
	e.must(t, "network", "rm", "wide")
	e.must(t, "network", "create", "spare")
	// The networks are kept in the plane's store: a server started
	// afresh over it has them.
	fresh := dockerapi.New(e.plane, dockerapi.Options{Authenticator: e.tokens, Logger: quiet, Store: e.store})
	req := httptest.NewRequest("GET", "/v1.41/networks/front", nil)
	req.Header.Set("Authorization", "Bearer "+e.token)
	rec := httptest.NewRecorder()
	fresh.ServeHTTP(rec, req)
	fresh.Close()
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), id) {
		t.Errorf("a fresh server over the store answers %d %s for network front", rec.Code, rec.Body.String())
	}
	ls := strings.Fields(e.must(t, "network", "ls", "--format", "{{.Name}}/{{.Driver}}/{{.Scope}}"))
	slices.Sort(ls)
	if !slices.Equal(ls, []string{"front/bridge/local", "spare/bridge/local"}) {
		t.Errorf("docker network ls: %v", ls)
	}
	if got := strings.TrimSpace(e.must(t, "network", "ls", "-q", "--filter", "label=tier=front")); got != id[:12] {
		t.Errorf("docker network ls --filter label=tier=front: %q, want %s", got, id[:12])
	}
	if got := strings.TrimSpace(e.must(t, "network", "inspect", "--format", "{{.Id}} {{.Labels.tier}}", id[:10])); got != id+" front" {
		t.Errorf("docker network inspect by id prefix: %q", got)
	}
	if _, errs, code := e.docker(t, "network", "inspect", "nowhere"); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("inspect of a missing network: exit %d, %s", code, errs)
	}

	// A reader of every namespace sees the network and may not remove it.
	reader := e.dockerConfig(t, e.reader)
	if out, _, code := e.dockerWith(t, reader, "network", "ls", "-q"); code != 0 || len(strings.Fields(out)) != 2 {
		t.Errorf("a reader's network ls: exit %d, %q", code, out)
	}
	if _, errs, code := e.dockerWith(t, reader, "network", "rm", "spare"); code == 0 || !strings.Contains(errs, "operate") {
		t.Errorf("a reader removed a network: exit %d, %s", code, errs)
	}
	// An operator of another namespace does not see it.
	other := e.dockerConfig(t, e.newToken(t, "other", auth.RoleOperator, "elsewhere"))
	if _, errs, code := e.dockerWith(t, other, "network", "inspect", "front"); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("another namespace's operator inspected front: exit %d, %s", code, errs)
	}
	if out := e.mustWith(t, other, "network", "ls", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("another namespace lists %q", out)
	}

	cid := strings.TrimSpace(e.must(t, "run", "-d", "--name", "web", "--network", "front", helloImage))
	in := e.waitPhase(t, "web", reconciler.Running)
	if in.ID != cid || in.Spec.Labels[dockerapi.LabelNetwork] != "front" || in.Spec.NetworkMode != "" {
		t.Errorf("the instance of a container on front: label %q, network mode %q", in.Spec.Labels[dockerapi.LabelNetwork], in.Spec.NetworkMode)
	}
	if got := strings.TrimSpace(e.must(t, "network", "inspect", "--format", "{{range .Containers}}{{.Name}}{{end}}", "front")); got != "web" {
		t.Errorf("the containers of front: %q, want web", got)
	}
	if got := e.must(t, "inspect", "--format", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}", "web"); strings.TrimSpace(got) != "front" {
		t.Errorf("docker inspect web shows networks %q", got)
	}
	// The back-end made the network's bridge for its first member.
	if got := e.engineNetworks(t); !slices.Equal(got, []string{"team.front"}) {
		t.Errorf("the engine's networks of the cluster: %v, want team.front", got)
	}
	if got := in.Spec.Networks; !slices.Equal(got, []string{"team.front"}) || !slices.Contains(in.Spec.NetworkAliases, "web") {
		t.Errorf("the spec of a container on front: networks %v, aliases %v", got, in.Spec.NetworkAliases)
	}
	// A bridge of the cluster's that no container is on (left by a crash)
	// goes after a listing; another cluster's stays.
	e.leakNetwork(t, "team.front", "team.leaked", "")
	e.leakNetwork(t, "team.front", "team.theirs", "another-cluster")
	deadline := time.Now().Add(time.Minute)
	for got := e.engineNetworks(t); !slices.Equal(got, []string{"team.front", "team.theirs"}); got = e.engineNetworks(t) {
		if time.Now().After(deadline) {
			t.Fatalf("the engine's networks of the cluster: %v, want the leaked one swept", got)
		}
		sleep()
	}
	if _, err := mainCli.NetworkRemove(context.Background(), "team.theirs", client.NetworkRemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := e.docker(t, "network", "rm", "front"); code == 0 || !strings.Contains(errs, "active endpoints") {
		t.Errorf("network rm of a network with a container: exit %d, %s", code, errs)
	}
	if _, errs, code := e.docker(t, "network", "disconnect", "spare", "web"); code == 0 || !strings.Contains(errs, "not connected") {
		t.Errorf("network disconnect of a network web is not on: exit %d, %s", code, errs)
	}

	// A created container joins and leaves a network before it starts.
	e.must(t, "create", "--name", "later", helloImage)
	e.must(t, "network", "connect", "--alias", "db", "spare", "later")
	if got := e.must(t, "inspect", "--format", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{$v.Aliases}}{{end}}", "later"); strings.TrimSpace(got) != "spare [db]" {
		t.Errorf("after network connect, later is on %q", got)
	}
	if _, errs, code := e.docker(t, "network", "rm", "spare"); code == 0 || !strings.Contains(errs, "later") {
		t.Errorf("network rm of spare with later on it: exit %d, %s", code, errs)
	}
	e.must(t, "network", "disconnect", "spare", "later")
	if got := strings.TrimSpace(e.must(t, "network", "prune", "-f")); !strings.Contains(got, "spare") || strings.Contains(got, "front") {
		t.Errorf("network prune: %q, want spare removed and front kept", got)
	}
	e.must(t, "rm", "-f", "web", "later")
	e.waitGone(t, cid)
	e.must(t, "network", "rm", "front")
	if out := e.must(t, "network", "ls", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("networks left: %q", out)
	}
	e.waitNoEngineNetworks(t)
}

// mustWith runs docker with the config directory cfg and fails the test
// unless it exits 0.
func (e *env) mustWith(t testing.TB, cfg string, args ...string) string {
	t.Helper()
	out, errs, code := e.dockerWith(t, cfg, args...)
	if code != 0 {
		t.Fatalf("docker %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// clientSocket serves e's endpoint on a unix socket of its own with the
// timeouts berth server gives it by default, as the clients meet it: a
// stop with Compose's 10-second grace outlasts setup's 2-second write
// timeout on a loaded machine. It returns the DOCKER_HOST.
func (e *env) clientSocket(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(filepath.Dir(e.sock), "clients.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: e.server, ReadHeaderTimeout: config.DefaultReadHeaderTimeout, ReadTimeout: config.DefaultReadTimeout, WriteTimeout: config.DefaultWriteTimeout}
	served := make(chan struct{})
	go func() { defer close(served); _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			_ = hs.Close()
		}
		<-served
	})
	return "unix://" + sock
}

// compose runs Debian's docker-compose (1.29) in dir against host, with
// the config directory cfg.
func compose(t *testing.T, host, cfg, dir string, args ...string) (string, string, int) {
	t.Helper()
	bin, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Fatalf("this test needs docker-compose (.ci/run installs Debian's): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "DOCKER_HOST="+host, "DOCKER_CONFIG="+cfg, "COMPOSE_INTERACTIVE_NO_CLI=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	var ee *exec.ExitError
	code := 0
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("docker-compose %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// composeSteps is a Compose project's everyday life, in order; down last.
var composeSteps = [][]string{
	{"up", "-d"}, {"ps"}, {"logs", "--no-color"}, {"up", "-d", "--scale", "web=2"},
	{"stop"}, {"start"}, {"up", "-d"}, {"restart"}, {"down"},
}

// composeLife runs composeSteps for project in dir against host and
// returns each step's failure ("" for a pass) and its output.
func composeLife(t *testing.T, host, cfg, dir, project string) (fails, outs []string) {
	t.Helper()
	for _, step := range composeSteps {
		out, errs, code := compose(t, host, cfg, dir, append([]string{"-p", project}, step...)...)
		why := ""
		if code != 0 {
			why = fmt.Sprintf("exit %d: %s", code, strings.TrimSpace(errs))
		}
		fails, outs = append(fails, why), append(outs, out+errs)
	}
	if fails[len(fails)-1] != "" {
		// Leave nothing behind.
		_, _, _ = compose(t, host, cfg, dir, "-p", project, "down", "-t", "1")
	}
	return fails, outs
}

// TestDockerCompose: Debian's docker-compose brings a project of three
// services up on its default network, where one reaches another by its
// service name through the engine's DNS, lists it and takes it down,
// leaving no network on the engine; the same steps run against the
// machine's engine are the reference.
func TestDockerCompose(t *testing.T) {
	e := setup(t)
	dir := t.TempDir()
	yaml := `version: "3.7"
services:
  db:
    image: ` + helloImage + `
    environment:
      ROLE: db
      HELLO_LISTEN: ":8080"
  web:
    image: ` + helloImage + `
    depends_on: [db]
    environment:
      ROLE: web
  probe:
    image: ` + helloImage + `
    depends_on: [db]
    command: ["dial", "db:8080"]
`
	if err := os.WriteFile(filepath.Join(dir, "docker-compose.yml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	refFails, _ := composeLife(t, dockertest.MainHost, e.dockerConfig(t, ""), dir, "ref"+dockertest.RandomID())
	for i, why := range refFails {
		if why != "" {
			t.Errorf("against the engine itself docker-compose %v fails: %s", composeSteps[i], why)
		}
	}

	project := "cp" + strings.ReplaceAll(e.cluster, "-", "")
	host := e.clientSocket(t)
	run := func(args ...string) string {
		t.Helper()
		out, errs, code := compose(t, host, e.config, dir, append([]string{"-p", project}, args...)...)
		if code != 0 {
			t.Fatalf("docker-compose %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errs)
		}
		return out + errs
	}
	if got := e.engineNetworks(t); len(got) != 0 {
		t.Fatalf("the engine has networks of the cluster before docker-compose up: %v", got)
	}
	run("up", "-d")
	e.waitRunning(t, 2)
	net := project + "_default"
	if got := strings.TrimSpace(e.must(t, "network", "inspect", "--format", "{{len .Containers}} {{index .Labels \"com.docker.compose.project\"}}", net)); got != "3 "+project {
		t.Errorf("network %s: %q, want its 3 containers and the project's label", net, got)
	}
	// probe dials db by its service name, and says what db answered.
	deadline := time.Now().Add(time.Minute)
	for logs := ""; !strings.Contains(logs, "dial db:8080: hello"); logs = e.must(t, "logs", project+"_probe_1") {
		if time.Now().After(deadline) {
			t.Fatalf("the probe did not reach db by its name: %q", logs)
		}
		sleep()
	}
	if got := e.engineNetworks(t); !slices.Equal(got, []string{"team." + net}) {
		t.Errorf("the engine's networks of the cluster: %v, want team.%s", got, net)
	}
	ps := run("ps")
	for _, svc := range []string{project + "_db_1", project + "_web_1"} {
		if !strings.Contains(ps, svc) {
			t.Errorf("docker-compose ps does not list %s:\n%s", svc, ps)
		}
	}
	run("down")
	if out := e.must(t, "ps", "-a", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("docker ps -a after docker-compose down: %q", out)
	}
	if out := e.must(t, "network", "ls", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("networks left after docker-compose down: %q", out)
	}
	e.waitNoEngineNetworks(t)

	// The whole life against Berth, for the share of steps that pass.
	fails, _ := composeLife(t, host, e.config, dir, project+"b")
	passed := 0
	for i, why := range fails {
		if why == "" {
			passed++
		} else {
			t.Logf("against Berth docker-compose %v fails: %s", composeSteps[i], why)
		}
	}
	t.Logf("docker-compose: %d of %d steps pass against Berth, %d of %d against the engine", passed, len(fails), len(refFails), len(refFails))
	for i, why := range fails {
		if why != "" {
			t.Errorf("against Berth docker-compose %v fails: %s", composeSteps[i], why)
		}
	}
}

// TestPauseRenameImages: docker pause and unpause suspend and resume
// the instance; rename renames a created container and a started one
// (its engine container too); image inspect, history and system
// df answer what the engines list.
func TestPauseRenameImages(t *testing.T) {
	e := setup(t)
	e.must(t, "run", "-d", "--name", "pz", helloImage)
	e.waitPhase(t, "pz", reconciler.Running)
	e.must(t, "pause", "pz")
	e.waitPhase(t, "pz", reconciler.Suspended)
	if got := strings.TrimSpace(e.must(t, "inspect", "--format", "{{.State.Status}} {{.State.Paused}}", "pz")); got != "paused true" {
		t.Errorf("docker inspect of a paused container: %q", got)
	}
	if _, errs, code := e.docker(t, "pause", "pz"); code == 0 || !strings.Contains(errs, "already paused") {
		t.Errorf("a second pause: exit %d, %s", code, errs)
	}
	e.must(t, "unpause", "pz")
	e.waitPhase(t, "pz", reconciler.Running)
	if _, errs, code := e.docker(t, "unpause", "pz"); code == 0 || !strings.Contains(errs, "not paused") {
		t.Errorf("unpause of a running container: exit %d, %s", code, errs)
	}

	// update: cpus and memory, live through the plane's resize; other
	// settings refused by name.
	e.must(t, "update", "--cpus", "0.25", "--memory", "48m", "pz")
	if got := strings.TrimSpace(e.must(t, "inspect", "--format", "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}", "pz")); got != "250000000 50331648" {
		t.Errorf("docker inspect after update --cpus 0.25 --memory 48m: %q", got)
	}
	_, bid, _ := strings.Cut(e.waitPhase(t, "pz", reconciler.Running).BackendID, "/")
	if ci, err := mainCli.ContainerInspect(context.Background(), bid, client.ContainerInspectOptions{}); err != nil || ci.Container.HostConfig.NanoCPUs != 250_000_000 || ci.Container.HostConfig.Memory != 48<<20 {
		t.Errorf("the engine's container after update: %v", err)
	}
	if _, errs, code := e.docker(t, "update", "--restart", "always", "pz"); code == 0 || !strings.Contains(errs, "--restart") {
		t.Errorf("docker update --restart: exit %d, %s", code, errs)
	}

	e.must(t, "create", "--name", "c1", helloImage)
	e.must(t, "update", "--cpus", "0.5", "c1")
	e.must(t, "rename", "c1", "c2")
	if got := strings.TrimSpace(e.must(t, "inspect", "--format", "{{.Name}}", "c2")); got != "/c2" {
		t.Errorf("after rename c1 c2, inspect c2 names %q", got)
	}
	if _, errs, code := e.docker(t, "rename", "c2", "pz"); code == 0 || !strings.Contains(errs, "already in use") {
		t.Errorf("rename to a name in use: exit %d, %s", code, errs)
	}
	// A started container is renamed, and so is its engine container
	// (which a restart's new copy is then named after); the old name is
	// free again.
	e.must(t, "rename", "pz", "qz")
	if got := strings.TrimSpace(e.must(t, "inspect", "--format", "{{.Name}} {{.State.Status}}", "qz")); got != "/qz running" {
		t.Errorf("after rename pz qz, inspect qz: %q", got)
	}
	if ci, err := mainCli.ContainerInspect(context.Background(), bid, client.ContainerInspectOptions{}); err != nil || ci.Container.Name != "/qz" {
		t.Errorf("the engine's container after rename pz qz: %v, %v", ci.Container.Name, err)
	}
	if _, errs, code := e.docker(t, "inspect", "pz"); code == 0 || !strings.Contains(errs, "No such") {
		t.Errorf("inspect of the old name: exit %d, %s", code, errs)
	}
	if _, errs, code := e.docker(t, "rename", "qz", "c2"); code == 0 || !strings.Contains(errs, "already in use") {
		t.Errorf("rename of a started container to a name in use: exit %d, %s", code, errs)
	}
	e.must(t, "rename", "qz", "pz")
	if got := strings.TrimSpace(e.must(t, "ps", "--format", "{{.Names}}", "--filter", "name=pz")); got != "pz" {
		t.Errorf("docker ps after renaming back: %q", got)
	}

	ii, err := mainCli.ImageInspect(context.Background(), helloImage)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(e.must(t, "image", "inspect", "--format", "{{.Id}} {{.Size}}", helloImage)); got != fmt.Sprintf("%s %d", ii.ID, ii.Size) {
		t.Errorf("docker image inspect: %q, the engine says %s %d", got, ii.ID, ii.Size)
	}
	if got := strings.TrimSpace(e.must(t, "image", "inspect", "--format", "{{index .RepoTags 0}}", ii.ID[len("sha256:"):][:12])); got != helloImage {
		t.Errorf("docker image inspect by a short id: %q", got)
	}
	if _, errs, code := e.docker(t, "image", "inspect", "berth-test/none:"+dockertest.RandomID()); code == 0 || !strings.Contains(errs, "No such image") {
		t.Errorf("inspect of a missing image: exit %d, %s", code, errs)
	}
	if got := e.must(t, "history", "--no-trunc", "--format", "{{.ID}} {{.Comment}}", helloImage); !strings.HasPrefix(got, ii.ID+" ") || !strings.Contains(got, "without its layers") {
		t.Errorf("docker history: %q", got)
	}
	df := e.must(t, "system", "df", "--format", "{{.Type}}={{.TotalCount}}/{{.Active}}")
	if !strings.Contains(df, "Containers=2/1") || !strings.Contains(df, "Local Volumes=0/0") {
		t.Errorf("docker system df:\n%s", df)
	}
}

// dockerPy runs testdata/clients.py (everyday docker-py work) against
// host with the config directory cfg and returns each operation's
// failure, "" for a pass, in order.
func dockerPy(t *testing.T, host, cfg, prefix string) (names []string, fails map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "testdata/clients.py", helloImage, prefix)
	cmd.Env = append(cleanEnv(), "DOCKER_HOST="+host, "DOCKER_CONFIG="+cfg)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("python3 testdata/clients.py against %s (.ci/run installs python3-docker): %v\n%s%s", host, err, out.String(), errb.String())
	}
	fails = map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if name, ok := strings.CutPrefix(line, "PASS "); ok {
			names = append(names, name)
			fails[name] = ""
		} else if rest, ok := strings.CutPrefix(line, "FAIL "); ok {
			name, why, _ := strings.Cut(rest, ": ")
			names = append(names, name)
			fails[name] = why
		}
	}
	if len(names) == 0 {
		t.Fatalf("clients.py against %s reported nothing:\n%s%s", host, out.String(), errb.String())
	}
	return names, fails
}

// TestDockerPy runs the same docker-py script against the machine's
// engine (the reference: every operation passes) and against Berth, where
// every operation must pass too.
func TestDockerPy(t *testing.T) {
	e := setup(t)
	ref, refFails := dockerPy(t, dockertest.MainHost, e.dockerConfig(t, ""), "ref"+dockertest.RandomID())
	for _, name := range ref {
		if refFails[name] != "" {
			t.Errorf("against the engine itself %s fails: %s", name, refFails[name])
		}
	}
	names, fails := dockerPy(t, e.clientSocket(t), e.config, "py"+dockertest.RandomID())
	if !slices.Equal(names, ref) {
		t.Fatalf("the script ran %v against Berth, %v against the engine", names, ref)
	}
	passed := 0
	for _, name := range names {
		if fails[name] == "" {
			passed++
			continue
		}
		t.Logf("against Berth %s fails: %s", name, fails[name])
	}
	t.Logf("docker-py: %d of %d operations pass against Berth, %d of %d against the engine", passed, len(names), len(ref), len(ref))
	for _, name := range names {
		if why := fails[name]; why != "" {
			t.Errorf("against Berth %s fails: %s", name, why)
		}
	}
}

// engineNetworks lists, sorted, the names of the networks of e's cluster
// on the engine.
func (e *env) engineNetworks(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := dockertest.Connect(ctx, dockertest.MainHost)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	res, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("label", driver.TagClusterName+"="+e.cluster)})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range res.Items {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	return out
}

// waitNoEngineNetworks waits until the engine has no network of e's
// cluster: each goes with the delete of its last container.
func (e *env) waitNoEngineNetworks(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		left := e.engineNetworks(t)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("networks of the cluster left on the engine: %v", left)
		}
		sleep()
	}
}

// leakNetwork makes, behind Berth's back, network name on the engine with
// the labels of network like (another cluster's id when cluster is set),
// as a crash would leave it.
func (e *env) leakNetwork(t *testing.T, like, name, cluster string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := dockertest.Connect(ctx, dockertest.MainHost)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	n, err := cli.NetworkInspect(ctx, like, client.NetworkInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	labels := maps.Clone(n.Network.Labels)
	if cluster != "" {
		labels[driver.TagCluster] = cluster
	}
	if _, err := cli.NetworkCreate(ctx, name, client.NetworkCreateOptions{Driver: "bridge", Labels: labels}); err != nil {
		t.Fatal(err)
	}
}
