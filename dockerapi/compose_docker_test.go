package dockerapi_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/drivers/docker/dockertest"
)

// TestDockerComposeNetworksVolume: Debian's docker-compose brings up a
// project with two networks (frontend, backend; api on both), a named
// volume, depends_on, environment and a published port, scales web to 2,
// lists it, shows its logs, takes it down keeping the volume, and down -v
// removes the volume. Probes on each network reach api by its service
// name; one on frontend does not reach db, which is on backend only. Every
// step must pass against the machine's engine (the reference) and against
// Berth.
func TestDockerComposeNetworksVolume(t *testing.T) {
	e := setup(t)
	dir := t.TempDir()
	yaml := `version: "3.7"
services:
  db:
    image: ` + helloImage + `
    environment:
      HELLO_LISTEN: ":8080"
    volumes: ["data:/data"]
    networks: [backend]
  api:
    image: ` + helloImage + `
    depends_on: [db]
    environment:
      HELLO_LISTEN: ":8080"
    networks: [frontend, backend]
  web:
    image: ` + helloImage + `
    depends_on: [api]
    environment:
      HELLO_LISTEN: ":8080"
    ports: ["8080"]
    networks: [frontend]
  front-probe:
    image: ` + helloImage + `
    depends_on: [api]
    command: ["dial", "api:8080"]
    networks: [frontend]
  back-probe:
    image: ` + helloImage + `
    depends_on: [api]
    command: ["dial", "api:8080"]
    networks: [backend]
  far-probe:
    image: ` + helloImage + `
    depends_on: [db]
    environment:
      HELLO_DIAL_FOR: "3s"
    command: ["dial", "db:8080"]
    networks: [frontend]
volumes:
  data:
networks:
  frontend:
  backend:
`
	if err := os.WriteFile(filepath.Join(dir, "docker-compose.yml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	refCfg := e.dockerConfig(t, "")
	refProject := "ref" + dockertest.RandomID()
	t.Cleanup(func() {
		_, _, _ = compose(t, dockertest.MainHost, refCfg, dir, "-p", refProject, "down", "-v", "-t", "1")
	})
	ref := composeTarget{host: dockertest.MainHost, cfg: refCfg, docker: func(args ...string) (string, string, int) {
		return dockerAt(t, dockertest.MainHost, refCfg, args...)
	}}
	for _, why := range composeNetworksLife(t, ref, dir, refProject) {
		t.Errorf("against the engine itself: %s", why)
	}
	berth := composeTarget{host: e.clientSocket(t), cfg: e.config, docker: func(args ...string) (string, string, int) { return e.docker(t, args...) }}
	project := "cn" + strings.ReplaceAll(e.cluster, "-", "")
	for _, why := range composeNetworksLife(t, berth, dir, project) {
		t.Errorf("against Berth: %s", why)
	}
	if out := e.must(t, "ps", "-a", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("docker ps -a after docker-compose down: %q", out)
	}
	if out := e.must(t, "network", "ls", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("networks left after docker-compose down: %q", out)
	}
	e.waitNoEngineNetworks(t)
	noEngineVolume(t, mainCli, "team."+project+"_data")
}

// composeTarget is an engine API that docker-compose and docker drive.
type composeTarget struct {
	host, cfg string
	docker    func(args ...string) (string, string, int)
}

// composeNetworksLife runs TestDockerComposeNetworksVolume's steps for
// project in dir against to, and returns why each failed step failed.
func composeNetworksLife(t *testing.T, to composeTarget, dir, project string) []string {
	t.Helper()
	var fails []string
	failf := func(format string, args ...any) { fails = append(fails, fmt.Sprintf(format, args...)) }
	run := func(args ...string) string {
		out, errs, code := compose(t, to.host, to.cfg, dir, append([]string{"-p", project}, args...)...)
		if code != 0 {
			failf("docker-compose %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
		}
		return out + errs
	}
	vol := project + "_data"
	volumes := func() []string {
		out, errs, code := to.docker("volume", "ls", "-q", "--filter", "name="+vol)
		if code != 0 {
			failf("docker volume ls: exit %d: %s", code, errs)
		}
		return strings.Fields(out)
	}
	// waitLog waits until the logs of container c hold want.
	waitLog := func(c, want string) {
		deadline := time.Now().Add(time.Minute)
		for {
			out, errs, _ := to.docker("logs", c)
			if strings.Contains(out+errs, want) {
				return
			}
			if time.Now().After(deadline) {
				failf("the logs of %s: %q, want %q", c, out+errs, want)
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	run("up", "-d")
	waitLog(project+"_front-probe_1", "dial api:8080: hello")
	waitLog(project+"_back-probe_1", "dial api:8080: hello")
	waitLog(project+"_far-probe_1", "dial db:8080: ")
	if out, _, _ := to.docker("logs", project+"_far-probe_1"); strings.Contains(out, "hello") {
		failf("far-probe, on frontend, reached db, on backend only: %q", out)
	}
	if got := volumes(); !slices.Equal(got, []string{vol}) {
		failf("volumes after up: %v, want %s", got, vol)
	}
	if ps := run("ps"); !strings.Contains(ps, project+"_web_1") || !strings.Contains(ps, "->8080/tcp") {
		failf("docker-compose ps does not list web_1 with its port:\n%s", ps)
	}
	if logs := run("logs", "--no-color"); !strings.Contains(logs, "hello stdout") {
		failf("docker-compose logs:\n%s", logs)
	}
	run("up", "-d", "--scale", "web=2")
	if ps := run("ps"); !strings.Contains(ps, project+"_web_2") {
		failf("docker-compose ps after --scale web=2 does not list web_2:\n%s", ps)
	}
	out, _, _ := to.docker("inspect", "--format", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}", project+"_api_1")
	if got := strings.Fields(out); !slices.Equal(got, []string{project + "_backend", project + "_frontend"}) {
		failf("api's networks: %v, want %s_backend and %s_frontend", got, project, project)
	}
	run("down", "-t", "1")
	if got := volumes(); !slices.Equal(got, []string{vol}) {
		failf("volumes after down: %v, want %s kept", got, vol)
	}
	run("up", "-d")
	run("down", "-v", "-t", "1")
	if got := volumes(); len(got) != 0 {
		failf("volumes after down -v: %v, want none", got)
	}
	return fails
}
