package dockerapi_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/drivers/docker/dockertest"
	"github.com/berth-dev/berth/reconciler"
)

// TestRunRmEcho: docker run --rm IMAGE echo hello prints hello, exits 0 and
// leaves nothing behind.
func TestRunRmEcho(t *testing.T) {
	e := setup(t)
	out, errs, code := e.docker(t, "run", "--rm", helloImage, "echo", "hello")
	if code != 0 || out != "hello\n" {
		t.Fatalf("docker run --rm: exit %d, stdout %q, stderr %q; want exit 0 and hello", code, out, errs)
	}
	if out := e.must(t, "ps", "-a", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("docker ps -a after run --rm lists %q, want nothing", out)
	}
}

// TestLifecycle drives one container through the docker CLI and checks
// that what docker shows agrees with Berth's own list (berth ps --json
// reads the same plane.Instances).
func TestLifecycle(t *testing.T) {
	e := setup(t)
	ctx := context.Background()

	// Follow events from before the container exists.
	evCmd, evOut := e.start(t, "events", "--format", "{{.Action}} {{.Actor.Attributes.name}}", "--filter", "type=container")

	id := strings.TrimSpace(e.must(t, "run", "-d", "--name", "web", "-e", "A=1", "-e", "constraint:node==main",
		"-p", "18080:80", "-l", "team=blue", "--cpus", "0.5", "-m", "64m", "--restart", "on-failure", helloImage))
	if id == "" {
		t.Fatal("docker run -d printed no id")
	}
	// run -d returns once the container runs, as the Engine's does.
	if st := strings.TrimSpace(e.must(t, "inspect", "--format", "{{.State.Status}}", "web")); st != "running" {
		t.Errorf("docker inspect right after docker run -d: %q, want running", st)
	}
	// An entrypoint that cannot run fails the run, with the CLI's code.
	if _, errs, code := e.docker(t, "run", "-d", "--name", "noentry", "--entrypoint", "/no-such-program", helloImage); code != 126 && code != 127 {
		t.Errorf("docker run -d of a missing entrypoint: exit %d, stderr %q; want 126 or 127", code, errs)
	}
	e.must(t, "rm", "-f", "noentry")
	in := e.waitPhase(t, "web", reconciler.Running)
	if in.ID != id {
		t.Errorf("docker run -d printed %s, Berth's instance is %s", id, in.ID)
	}
	if in.Node != "main" || in.Spec.CPU != 500 || in.Spec.Memory != 64<<20 || in.Spec.Env["A"] != "1" || in.Spec.Labels["team"] != "blue" || in.Spec.RestartPolicy.Name != "on-failure" {
		t.Errorf("Berth's instance: node %s, spec %+v", in.Node, *in.Spec)
	}
	if _, ok := in.Spec.Env["constraint:node"]; ok {
		t.Error("the constraint was passed to the container's environment")
	}

	ps := e.must(t, "ps", "--format", "{{.ID}} {{.Names}} {{.Image}} {{.State}} {{.Ports}}")
	want := id[:12] + " web " + helloImage + " running "
	if !strings.HasPrefix(ps, want) || !strings.HasSuffix(strings.TrimSpace(ps), ":18080->80/tcp") {
		t.Errorf("docker ps:\n%s\nwant %s", ps, want)
	}
	if out := e.must(t, "ps", "-q", "--filter", "label=team=red"); strings.TrimSpace(out) != "" {
		t.Errorf("docker ps --filter label=team=red lists %q", out)
	}
	if out := e.must(t, "ps", "-q", "--no-trunc", "--filter", "name=web", "--filter", "status=running"); strings.TrimSpace(out) != id {
		t.Errorf("docker ps --filter name=web lists %q, want %s", out, id)
	}

	insp := e.must(t, "inspect", "--format", "{{.Name}} {{.State.Status}} {{.Config.Image}} {{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} {{.HostConfig.RestartPolicy.Name}}", "web")
	if want := "/web running " + helloImage + " 500000000 67108864 on-failure"; strings.TrimSpace(insp) != want {
		t.Errorf("docker inspect: %q, want %q", insp, want)
	}

	// logs -f follows until the container stops.
	logCmd, logOut := e.start(t, "logs", "-f", "web")
	if out := e.must(t, "logs", "--tail", "1", "web"); out != "hello stdout\n" {
		// --tail 1 keeps the last line of each stream; stdout only here.
		t.Logf("docker logs --tail 1: %q", out)
	}
	ts := e.must(t, "logs", "--timestamps", "--tail", "1", "web")
	if f := strings.Fields(ts); len(f) < 3 || f[1] != "hello" {
		t.Errorf("docker logs --timestamps: %q", ts)
	} else if _, err := time.Parse(time.RFC3339Nano, f[0]); err != nil {
		t.Errorf("docker logs --timestamps: %q: %v", ts, err)
	}
	e.must(t, "stop", "-t", "1", "web")
	if err := logCmd.Wait(); err != nil {
		t.Errorf("docker logs -f: %v", err)
	}
	if !strings.Contains(logOut.String(), "hello stdout") {
		t.Errorf("docker logs -f printed %q", logOut.String())
	}
	waited := strings.TrimSpace(e.must(t, "wait", "web"))
	in = e.waitPhase(t, "web", reconciler.Stopped, reconciler.Exited)
	if in.Observed == nil || in.Observed.ExitCode == nil {
		t.Errorf("Berth has no exit code for the stopped container: %+v", in.Observed)
	} else if waited != strconv.Itoa(*in.Observed.ExitCode) {
		t.Errorf("docker wait printed %q, Berth's exit code is %d", waited, *in.Observed.ExitCode)
	}
	if out := e.must(t, "ps", "-a", "--format", "{{.Names}} {{.State}}"); strings.TrimSpace(out) != "web exited" {
		t.Errorf("docker ps -a after stop: %q", out)
	}
	e.must(t, "rm", "-f", "web")
	e.waitGone(t, id)
	if out := e.must(t, "ps", "-a", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("docker ps -a after rm -f lists %q", out)
	}
	list, err := e.plane.Instances(ctx, control.Filter{})
	if err != nil || len(list) != 0 {
		t.Errorf("Berth lists %d instances after rm -f (%v)", len(list), err)
	}

	// The events seen: create, start, die, stop, destroy, once each.
	_ = evCmd.Process.Signal(os.Interrupt)
	_ = evCmd.Wait()
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(evOut.String()), "\n") {
		if strings.HasSuffix(l, " web") { // noentry's are not counted
			got = append(got, l)
		}
	}
	want2 := []string{"create web", "start web", "die web", "stop web", "destroy web"}
	if !slices.Equal(got, want2) {
		t.Errorf("docker events:\n%s\nwant %v", evOut.String(), want2)
	}
}

// TestRunAttachedExitCode: an attached run streams stdout and stderr apart
// and returns the container's exit code.
func TestRunAttachedExitCode(t *testing.T) {
	e := setup(t)
	out, errs, code := e.docker(t, "run", "--rm", "-e", "HELLO_EXIT=3", helloImage)
	if code != 3 || out != "hello stdout\n" || !strings.Contains(errs, "hello stderr") {
		t.Fatalf("docker run: exit %d, stdout %q, stderr %q; want 3, hello stdout, hello stderr", code, out, errs)
	}
	// Without --rm the container stays, exited.
	if out, errs, code := e.docker(t, "run", "--name", "kept", helloImage, "echo", "kept"); code != 0 || out != "kept\n" {
		t.Fatalf("docker run: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if out := e.must(t, "ps", "-a", "--filter", "name=kept", "--format", "{{.State}} {{.Status}}"); !strings.HasPrefix(out, "exited Exited (0)") {
		t.Errorf("docker ps -a after an attached run: %q", out)
	}
	e.must(t, "rm", "kept")
	// create + start, then kill -s and restart.
	id := strings.TrimSpace(e.must(t, "create", "--name", "two", helloImage))
	if out := e.must(t, "ps", "-a", "--format", "{{.Names}} {{.State}}"); strings.TrimSpace(out) != "two created" {
		t.Errorf("docker ps -a after create: %q", out)
	}
	e.must(t, "start", id)
	e.waitPhase(t, "two", reconciler.Running)
	e.must(t, "kill", "-s", "TERM", "two")
	in := e.waitPhase(t, "two", reconciler.Exited, reconciler.Stopped)
	if in.Observed.ExitCode == nil || *in.Observed.ExitCode != 0 {
		t.Errorf("after kill -s TERM: %+v", in.Observed)
	}
	e.must(t, "restart", "-t", "1", "two")
	e.waitPhase(t, "two", reconciler.Running)
	e.must(t, "rm", "-f", "two")
	e.waitGone(t, id)
}

// TestRefusals: what Berth cannot do is refused with a message that says
// so, and the endpoint refuses requests without an accepted token.
func TestRefusals(t *testing.T) {
	e := setup(t)
	e.must(t, "create", "--name", "c1", helloImage)
	e.must(t, "network", "create", "spare")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-d", "--privileged", helloImage}, "Berth cannot honour --privileged"},
		{[]string{"run", "-d", "--init", helloImage}, "--init"},
		{[]string{"plugin", "ls"}, "not supported by Berth"},
		{[]string{"exec", "x", "ls"}, "No such container"},
		{[]string{"logs", "--since", "1m", "c1"}, "--since"},
		{[]string{"run", "-d", "-v", "/data", helloImage}, "anonymous volumes (-v /data"},
		{[]string{"network", "connect", "--ip", "10.1.2.3", "spare", "c1"}, "--ip"},
		{[]string{"network", "connect", "--link", "c1:db", "spare", "c1"}, "--link"},
		{[]string{"run", "-d", "-v", "named:/data", "-v", "/scratch", helloImage}, "anonymous volumes (-v /scratch"},
	} {
		_, errs, code := e.docker(t, tc.args...)
		if code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("docker %v: exit %d, stderr %q; want an error saying %q", tc.args, code, errs, tc.want)
		}
	}
	for _, tc := range []struct{ token, want string }{
		{"", "bearer token"},
		{"wrong", "unknown, revoked or expired"},
	} {
		_, errs, code := e.dockerWith(t, e.dockerConfig(t, tc.token), "ps")
		if code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("docker ps with token %q: exit %d, stderr %q; want %q", tc.token, code, errs, tc.want)
		}
	}
	reader := e.dockerConfig(t, e.reader)
	if _, _, code := e.dockerWith(t, reader, "ps"); code != 0 {
		t.Errorf("a reader cannot list")
	}
	if _, errs, code := e.dockerWith(t, reader, "run", "-d", helloImage); code == 0 || !strings.Contains(errs, "needs the operate permission") {
		t.Errorf("a reader ran a container: exit %d, %s", code, errs)
	}
}

// TestInfoVersionImages: docker version, info and images answer the
// cluster's figures.
func TestInfoVersionImages(t *testing.T) {
	e := setup(t)
	if out := e.must(t, "version", "--format", "{{.Server.APIVersion}} {{.Server.Version}}"); strings.TrimSpace(out) != dockerapi.Version+" test" {
		t.Errorf("docker version: %q", out)
	}
	nodes, err := e.plane.Nodes(context.Background())
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes %v %v", nodes, err)
	}
	out := e.must(t, "info", "--format", "{{.NCPU}} {{.MemTotal}} {{.Containers}}")
	want := fmt.Sprintf("%d %d 0", nodes[0].Capacity.CPU/1000, nodes[0].Capacity.Memory)
	if strings.TrimSpace(out) != want {
		t.Errorf("docker info: %q, want %q", out, want)
	}
	if out := e.must(t, "images", "--format", "{{.Repository}}:{{.Tag}}", helloImage); strings.TrimSpace(out) != helloImage {
		t.Errorf("docker images %s: %q", helloImage, out)
	}
	if _, errs, code := e.docker(t, "pull", helloImage); code == 0 || !strings.Contains(errs, "admin") {
		t.Errorf("an operator pulled (a preload needs an admin): exit %d, %s", code, errs)
	}
	admin := e.dockerConfig(t, e.admin)
	if out, errs, code := e.dockerWith(t, admin, "pull", helloImage); code != 0 {
		t.Errorf("docker pull of an image an engine has: exit %d %s %s", code, out, errs)
	}
	if _, errs, code := e.dockerWith(t, admin, "pull", "berth-test/none:"+dockertest.RandomID()); code == 0 || !strings.Contains(errs, "no registry") {
		t.Errorf("docker pull of an image no engine has: exit %d, %s", code, errs)
	}
}

// TestVolumesAndStats: -v binds a host directory; stats --no-stream
// answers the back-end's measurement.
func TestVolumesAndStats(t *testing.T) {
	e := setup(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("from the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errs, code := e.docker(t, "run", "--rm", "-v", dir+":/data:ro", "-e", "HELLO_FILES=/data/f", "-e", "HELLO_EXIT=0", helloImage)
	if code != 0 || !strings.Contains(out, "file /data/f: from the host") {
		t.Fatalf("docker run -v: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	e.must(t, "run", "-d", "--name", "busy", "-m", "32m", helloImage)
	e.waitPhase(t, "busy", reconciler.Running)
	stats := e.must(t, "stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}}", "busy")
	if !strings.HasPrefix(stats, "busy ") || !strings.Contains(stats, "/ 32MiB") {
		t.Errorf("docker stats --no-stream: %q", stats)
	}
	e.must(t, "rm", "-f", "busy")
}

// TestPlacementRules: constraints from a label or the environment, as
// Swarm classic read them, reach Berth's scheduler: one no node can ever
// meet is refused with the reason, naming the constraint and the nodes.
func TestPlacementRules(t *testing.T) {
	e := setup(t)
	_, errs, code := e.docker(t, "run", "-d", "--name", "nowhere", "-l", "berth.constraint=node==elsewhere", helloImage)
	if code == 0 || !strings.Contains(errs, "no node can ever take it") || !strings.Contains(errs, "node==elsewhere") {
		t.Errorf("docker run with a constraint no node meets: exit %d, stderr %q; want refused naming the constraint", code, errs)
	}
	// What the create left behind goes with rm -f.
	_, _, _ = e.docker(t, "rm", "-f", "nowhere")
}

// TestRunAsUser: docker run --user USER:GROUP reaches the engine: the
// container runs as that user.
func TestRunAsUser(t *testing.T) {
	e := setup(t)
	e.must(t, "run", "-d", "--name", "asuser", "--user", "65534:65534", helloImage)
	in := e.waitPhase(t, "asuser", reconciler.Running)
	_, id, _ := strings.Cut(in.BackendID, "/")
	res, err := mainCli.ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := res.Container.Config.User; u != "65534:65534" {
		t.Errorf("the engine runs the container as %q, want 65534:65534", u)
	}
	e.must(t, "rm", "-f", "asuser")
}
