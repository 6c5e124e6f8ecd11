package docker

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/docker/dockertest"
	"github.com/berth-dev/berth/internal/freeport"
)

// testOptions are options for tests: short backoffs, one engine per address.
func testOptions(addrs ...string) *Options {
	o := defaultOptions()
	o.PollInterval = 200 * time.Millisecond
	o.BackoffMin = 50 * time.Millisecond
	o.BackoffMax = 500 * time.Millisecond
	o.StopGrace = 5 * time.Second
	o.Pull = false // there is no registry here
	for i, a := range addrs {
		o.Engines = append(o.Engines, EngineConfig{Name: fmt.Sprintf("e%d", i+1), Address: a})
	}
	return o
}

func openTest(t *testing.T, o *Options) *Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := Open(ctx, o, driver.Env{Provider: "test", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { closeTest(t, d) })
	return d
}

// leakCheck makes the test fail if it leaves goroutines behind; it runs
// after every other cleanup, so after the driver is closed.
func leakCheck(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		// The tests' own clients keep idle connections; they are not the driver's.
		mainCli.Close()
		if second != nil {
			second.Client.Close()
		}
		goleak.VerifyNone(t, ignore)
	})
}

func closeTest(t *testing.T, d *Driver) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func helloSpec() *driver.Spec {
	return &driver.Spec{Image: helloImage, Resources: driver.Resources{CPU: 100, Memory: 32 * driver.MiB}}
}

func engineAddrs() []string {
	addrs := []string{DefaultHost}
	if second != nil {
		addrs = append(addrs, second.Address())
	}
	return addrs
}

func TestConformance(t *testing.T) {
	h := drivertest.Harness{
		Open: func(t *testing.T) driver.Driver {
			// Through the registry, as configuration would.
			def, err := driver.Lookup("docker")
			if err != nil {
				t.Fatal(err)
			}
			o := testOptions(engineAddrs()...)
			raw := map[string]any{
				"engines":       mustJSON(t, o.Engines),
				"poll_interval": "200ms", "backoff_min": "50ms", "backoff_max": "500ms",
				"stop_grace": "5s", "pull": false,
			}
			d, err := def.Open(context.Background(), raw, driver.Env{Provider: "conformance", Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		Spec:         helloSpec,
		Exec:         func(steps ...string) []string { return append([]string{"/hello", "probe"}, steps...) },
		MissingImage: func() *driver.Spec { return &driver.Spec{Image: "berth-test/missing:" + randomID()} },
		Parallel:     16,
	}
	if second != nil {
		// Present on the main engine only: Preload must copy it to the
		// second, from which an earlier run (-count) is removed first.
		dockertest.RemoveImages(context.Background(), second.Client, preloadImage)
		h.PreloadImage = preloadImage
	} else {
		t.Logf("Preload is not exercised by the suite: %s", secondWhy)
	}
	drivertest.Run(t, h)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := jsonMarshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAPIVersion checks that the client negotiates down to the engine's API
// version (1.41 for Docker 20.10) rather than refusing it.
func TestAPIVersion(t *testing.T) {
	d := openTest(t, testOptions(DefaultHost))
	ctx := context.Background()
	sv, err := mainCli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := sv.APIVersion
	if versionLess(client.MaxAPIVersion, want) {
		want = client.MaxAPIVersion
	}
	if got := d.engines[0].cli.ClientVersion(); got != want {
		t.Errorf("negotiated API version %s, want %s (engine %s speaks %s)", got, want, sv.Version, sv.APIVersion)
	}
	t.Logf("engine %s, API %s; client max %s, min %s; negotiated %s", sv.Version, sv.APIVersion, client.MaxAPIVersion, client.MinAPIVersion, d.engines[0].cli.ClientVersion())

	// A fixed version is used as given.
	o := testOptions(DefaultHost)
	o.APIVersion = "1.40"
	d2 := openTest(t, o)
	if got := d2.engines[0].cli.ClientVersion(); got != "1.40" {
		t.Errorf("api_version 1.40: client uses %s", got)
	}
	if _, err := d2.State(ctx); err != nil {
		t.Errorf("State with API 1.40: %v", err)
	}
}

func versionLess(a, b string) bool {
	am, _ := strconv.Atoi(strings.TrimPrefix(a, "1."))
	bm, _ := strconv.Atoi(strings.TrimPrefix(b, "1."))
	return am < bm
}

func TestOptionsValidate(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	def, err := driver.Lookup("docker")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		raw  map[string]any
		path string // the field the error must name
	}{
		{"unknown option", map[string]any{"hosts": "x"}, "hosts"},
		{"unknown engine field", map[string]any{"engines": `[{"name":"a","address":"unix:///x","colour":"red"}]`}, "engines"},
		{"missing name", map[string]any{"engines": `[{"address":"unix:///x"}]`}, "engines[0].name"},
		{"duplicate name", map[string]any{"engines": `[{"name":"a","address":"unix:///x"},{"name":"a","address":"unix:///y"}]`}, "engines[1].name"},
		{"bad scheme", map[string]any{"engines": `[{"name":"a","address":"http://x:1"}]`}, "engines[0].address"},
		{"tcp without port", map[string]any{"engines": `[{"name":"a","address":"tcp://host"}]`}, "engines[0].address"},
		{"relative socket", map[string]any{"host": "unix://docker.sock"}, "host"},
		{"tls on unix", map[string]any{"engines": `[{"name":"a","address":"unix:///x","tls":{"insecure_skip_verify":true}}]`}, "engines[0].tls"},
		{"cert file not found", map[string]any{"engines": `[{"name":"a","address":"tcp://h:2376"},{"name":"b","address":"tcp://h:2376","tls":{"ca":"` + ca + `","cert":"/nonexistent/cert.pem","key":"/nonexistent/key.pem"}}]`}, "engines[1].tls.cert"},
		{"ca not PEM", map[string]any{"engines": `[{"name":"a","address":"tcp://h:2376","tls":{"ca":"` + ca + `"}}]`}, "engines[0].tls.ca"},
		{"key without cert", map[string]any{"engines": `[{"name":"a","address":"tcp://h:2376","tls":{"insecure_skip_verify":true,"key":"/k"}}]`}, "engines[0].tls.cert"},
		{"negative capacity", map[string]any{"engines": `[{"name":"a","address":"unix:///x","capacity":{"cpus":-1}}]`}, "engines[0].capacity.cpus"},
		{"host and engines", map[string]any{"host": "unix:///x", "engines": `[{"name":"a","address":"unix:///x"}]`}, "host"},
		{"bad api version", map[string]any{"api_version": "2"}, "api_version"},
		{"zero timeout", map[string]any{"call_timeout": "0s"}, "call_timeout"},
		{"no change in flight", map[string]any{"max_in_flight": 0}, "max_in_flight"},
		{"too many changes in flight", map[string]any{"max_in_flight": "5000"}, "max_in_flight"},
		{"negative usage interval", map[string]any{"usage_interval": "-1s"}, "usage_interval"},
		{"wrong type", map[string]any{"pull": "maybe"}, "pull"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := def.Decode(c.raw)
			if !errors.Is(err, driver.ErrInvalid) {
				t.Fatalf("Decode: %v, want ErrInvalid", err)
			}
			if !drivertest.HasField(err, c.path) {
				t.Errorf("Decode: %v does not name %q", err, c.path)
			}
		})
	}
	// A good configuration, by flags' text form.
	opts, err := def.Decode(map[string]any{
		"engines":      `[{"name":"a","address":"unix:///var/run/docker.sock","labels":{"zone":"z1"},"capacity":{"cpus":1.5,"memory":"2Gi"},"drain":true}]`,
		"call_timeout": "10s",
	})
	if err != nil {
		t.Fatalf("Decode of a good configuration: %v", err)
	}
	o := opts.(*Options)
	if e := o.Engines[0]; e.Capacity.CPU != 1500 || e.Capacity.Memory != 2*driver.GiB || !e.Drain || e.Labels["zone"] != "z1" {
		t.Errorf("decoded engine: %+v", e)
	}
	// The same from a YAML file, where values arrive as native types.
	opts, err = def.Decode(map[string]any{
		"engines": []any{map[string]any{"name": "a", "address": "tcp://10.0.0.1:2376",
			"tls":      map[string]any{"insecure_skip_verify": true},
			"capacity": map[string]any{"cpus": 2, "memory": "1Gi"}}},
		"pull": false,
	})
	if err != nil {
		t.Fatalf("Decode of native values: %v", err)
	}
	if e := opts.(*Options).Engines[0]; e.Capacity.CPU != 2000 || e.Capacity.Memory != driver.GiB || e.TLS == nil || !e.TLS.InsecureSkipVerify || e.externalAddress() != "10.0.0.1" {
		t.Errorf("decoded engine: %+v", e)
	}
	// The host shorthand is one engine called local.
	opts, err = def.Decode(map[string]any{"host": "tcp://10.0.0.2:2375"})
	if err != nil {
		t.Fatal(err)
	}
	if es := opts.(*Options).engines(); len(es) != 1 || es[0].Name != "local" || es[0].Address != "tcp://10.0.0.2:2375" {
		t.Errorf("host shorthand: %+v", es)
	}
}

// create drives a create to the end and registers the instance's removal.
func create(t *testing.T, d *Driver, node string, spec *driver.Spec) *driver.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op, err := d.Create(ctx, node, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	inst, err := driver.Drive(ctx, op)
	if inst != nil && inst.ID != "" {
		t.Cleanup(func() { remove(t, d, inst.ID) })
	}
	if err != nil {
		t.Fatalf("Create: operation: %v", err)
	}
	return inst
}

func remove(t *testing.T, d *Driver, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op, err := d.Delete(ctx, id)
	if err == nil {
		_, err = driver.Drive(ctx, op)
	}
	if err != nil && !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("cleanup: delete %s: %v", id, err)
	}
}

// TestSpecMapping creates a container from a spec that uses every field the
// engine honours and checks the container the engine made.
func TestSpecMapping(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(DefaultHost))
	run := randomID()
	bindDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(bindDir, "in.txt"), []byte("from the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	volume := "berth-test-vol-" + run
	t.Cleanup(func() {
		_, _ = mainCli.VolumeRemove(context.Background(), volume, client.VolumeRemoveOptions{Force: true})
	})
	fixed := freeport.Port(t)
	spec := &driver.Spec{
		Name:              "berth-test-spec-" + run,
		Image:             helloImage,
		Resources:         driver.Resources{CPU: 500, Memory: 64 * driver.MiB},
		Cpuset:            "0",
		MemoryReservation: 32 * driver.MiB,
		Env:               map[string]string{"HELLO_LISTEN": ":8080", "HELLO_FILES": "/etc/app/app.conf,/berth/user-data,/data/in.txt", "COLOUR": "blue"},
		Hostname:          "web1",
		Domainname:        "example.test",
		Labels:            map[string]string{"team": "core"},
		Tags:              map[string]string{driver.TagManaged: "true", "berth.test.run": run},
		Ports: []driver.Port{
			{ContainerPort: 8080, Publish: true},                  // any host port
			{ContainerPort: 9090, HostPort: fixed, Publish: true}, // a fixed one
		},
		Volumes: []driver.Volume{
			{Source: bindDir, Target: "/data", ReadOnly: true},
			{Source: volume, Target: "/cache"},
		},
		RestartPolicy: driver.RestartPolicy{Name: "on-failure", MaxRetries: 2},
		ConfigFiles:   []driver.ConfigFile{{Path: "/etc/app/app.conf", Content: "answer=42", Mode: 0o600}},
		UserData:      "#cloud-config",
	}
	inst := create(t, d, "e1", spec)
	if inst.State != driver.StateRunning || inst.Name != spec.Name || inst.Node != "e1" {
		t.Errorf("instance: %+v", inst)
	}
	if inst.Tags["berth.test.run"] != run || inst.Tags[driver.TagManaged] != "true" || inst.Labels["team"] != "core" {
		t.Errorf("instance labels %v tags %v", inst.Labels, inst.Tags)
	}
	if inst.Resources.CPU != 500 || inst.Resources.Memory != 64*driver.MiB {
		t.Errorf("instance resources: %+v", inst.Resources)
	}

	_, cid, _ := d.resolve(inst.ID)
	ci, err := mainCli.ContainerInspect(context.Background(), cid, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := ci.Container
	hc := c.HostConfig
	if hc.NanoCPUs != 500_000_000 || hc.CpusetCpus != "0" || hc.Memory != 64<<20 || hc.MemoryReservation != 32<<20 {
		t.Errorf("resources: nano %d cpuset %q memory %d reservation %d", hc.NanoCPUs, hc.CpusetCpus, hc.Memory, hc.MemoryReservation)
	}
	if hc.RestartPolicy.Name != "on-failure" || hc.RestartPolicy.MaximumRetryCount != 2 {
		t.Errorf("restart policy: %+v", hc.RestartPolicy)
	}
	if c.Config.Hostname != "web1" || c.Config.Domainname != "example.test" {
		t.Errorf("hostname %q domainname %q", c.Config.Hostname, c.Config.Domainname)
	}
	if !slices.Contains(c.Config.Env, "COLOUR=blue") {
		t.Errorf("env: %v", c.Config.Env)
	}
	if c.Config.Labels["team"] != "core" || c.Config.Labels[driver.TagManaged] != "true" {
		t.Errorf("labels: %v", c.Config.Labels)
	}
	if c.Name != "/"+spec.Name {
		t.Errorf("name %q", c.Name)
	}
	mounts := map[string]string{}
	for _, m := range c.Mounts {
		mounts[m.Destination] = fmt.Sprintf("%s:%s:rw=%v", m.Type, m.Source+m.Name, m.RW)
	}
	if mounts["/data"] != "bind:"+bindDir+":rw=false" || !strings.HasPrefix(mounts["/cache"], "volume:") {
		t.Errorf("mounts: %v", mounts)
	}

	// The real port mapping, reported and reachable.
	var anyPort, fixedPort int
	for _, p := range inst.Ports {
		switch p.ContainerPort {
		case 8080:
			anyPort = p.HostPort
		case 9090:
			fixedPort = p.HostPort
		}
		if p.Protocol != "tcp" || p.HostIP == "" {
			t.Errorf("port mapping %+v", p)
		}
	}
	if anyPort == 0 || fixedPort != fixed {
		t.Fatalf("ports %+v: want 8080 on some host port and 9090 on %d", inst.Ports, fixed)
	}
	if !slices.Contains(inst.Addresses, "127.0.0.1") {
		t.Errorf("addresses %v lack the engine's external address", inst.Addresses)
	}
	var line string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(anyPort)), time.Second)
		if err == nil {
			line, _ = bufio.NewReader(conn).ReadString('\n')
			conn.Close()
			if line == "hello\n" {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if line != "hello\n" {
		t.Errorf("port %d: read %q, want the program's greeting", anyPort, line)
	}

	// Config files and user data were in place when the program started.
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Logs(ctx, inst.ID, driver.LogOptions{}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"file /etc/app/app.conf: answer=42", "file /berth/user-data: #cloud-config", "file /data/in.txt: from the host"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout %q lacks %q", out.String(), want)
		}
	}
	st, err := mainCli.ContainerStatPath(context.Background(), cid, client.ContainerStatPathOptions{Path: "/etc/app/app.conf"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Stat.Mode.Perm() != 0o600 {
		t.Errorf("config file mode %v, want 0600", st.Stat.Mode.Perm())
	}
}

// TestLogs checks that stdout and stderr arrive separated, that follow ends
// when the container ends, and that tail keeps the last line.
func TestLogs(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(DefaultHost))
	spec := helloSpec()
	spec.Tags = map[string]string{"berth.test.run": randomID()}
	inst := create(t, d, "e1", spec)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var out, errOut drivertest.SyncBuffer
	wait(t, func() bool {
		out.Reset()
		errOut.Reset()
		if err := d.Logs(ctx, inst.ID, driver.LogOptions{Stdout: true, Stderr: true}, &out, &errOut); err != nil {
			t.Fatal(err)
		}
		return strings.Contains(out.String(), "hello stdout") && strings.Contains(errOut.String(), "hello stderr")
	})
	if strings.Contains(out.String(), "stderr") || strings.Contains(errOut.String(), "stdout") {
		t.Errorf("streams mixed: stdout %q, stderr %q", out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if err := d.Logs(ctx, inst.ID, driver.LogOptions{Stderr: true}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if out.String() != "" || errOut.String() != "hello stderr\n" {
		t.Errorf("stderr only: stdout %q, stderr %q", out.String(), errOut.String())
	}

	// Follow until the container stops: the program says "bye" on SIGTERM.
	out.Reset()
	errOut.Reset()
	done := make(chan error, 1)
	go func() {
		done <- d.Logs(ctx, inst.ID, driver.LogOptions{Stdout: true, Follow: true}, &out, &errOut)
	}()
	wait(t, func() bool { return strings.Contains(out.String(), "hello stdout") })
	if err := d.Stop(ctx, inst.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Logs with follow: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Logs with follow did not end with the container")
	}
	if !strings.HasSuffix(out.String(), "bye\n") {
		t.Errorf("followed stdout %q does not end with the program's goodbye", out.String())
	}
	if errOut.String() != "" {
		t.Errorf("stdout only: stderr got %q", errOut.String())
	}
	// Tail keeps the last line of each stream.
	out.Reset()
	errOut.Reset()
	if err := d.Logs(ctx, inst.ID, driver.LogOptions{Tail: 1}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if out.String() != "bye\n" || errOut.String() != "hello stderr\n" {
		t.Errorf("tail 1: stdout %q, stderr %q; want the last line of each", out.String(), errOut.String())
	}
	got, err := d.Get(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != driver.StateExited || got.ExitCode == nil || *got.ExitCode != 0 {
		t.Errorf("after Stop: %+v, want exited with code 0", got)
	}
}

// TestErrors checks that each failure is classified at the source.
func TestErrors(t *testing.T) {
	leakCheck(t)
	o := testOptions(DefaultHost, "unix:///nonexistent/docker.sock")
	d := openTest(t, o)
	run := randomID()
	tags := map[string]string{"berth.test.run": run}
	t.Cleanup(func() { removeByLabel(t, mainCli, "berth.test.run", run) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drive := func(node string, spec *driver.Spec) error {
		spec.Tags = tags
		op, err := d.Create(ctx, node, spec)
		if err != nil {
			return err
		}
		_, err = driver.Drive(ctx, op)
		return err
	}

	img := "berth-test/missing:" + run
	err := drive("e1", &driver.Spec{Image: img})
	if !errors.Is(err, driver.ErrPermanent) || !strings.Contains(err.Error(), img) || !strings.Contains(err.Error(), "engine e1") {
		t.Errorf("missing image: %v, want ErrPermanent naming %s and engine e1", err, img)
	}

	nonet := helloSpec()
	nonet.Networks = []string{"berth-test-nonet-" + run}
	if err := drive("e1", nonet); !errors.Is(err, driver.ErrPermanent) || !strings.Contains(err.Error(), nonet.Networks[0]) || strings.Contains(err.Error(), "is not present") {
		t.Errorf("missing network: %v, want ErrPermanent naming the network, not the image", err)
	}

	name := "berth-test-dup-" + run
	s1 := helloSpec()
	s1.Name = name
	s1.Tags = tags
	create(t, d, "e1", s1)
	s2 := helloSpec()
	s2.Name = name
	if err := drive("e1", s2); !errors.Is(err, driver.ErrAlreadyExists) {
		t.Errorf("name conflict: %v, want ErrAlreadyExists", err)
	}

	if err := drive("e1", &driver.Spec{Kind: driver.KindVM, Image: helloImage}); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("kind vm: %v, want ErrUnsupported", err)
	}
	if err := drive("nowhere", helloSpec()); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("unknown node: %v, want ErrNotFound", err)
	}
	huge := helloSpec()
	huge.CPU = 100_000 * 1000
	if err := drive("e1", huge); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("more cpus than the engine has: %v, want ErrInsufficientCapacity", err)
	}
	bad := helloSpec()
	bad.Labels = map[string]string{"berth.mine": "x"}
	if err := drive("e1", bad); !errors.Is(err, driver.ErrInvalid) || !drivertest.HasField(err, "labels.berth.mine") {
		t.Errorf("label with the reserved prefix: %v, want ErrInvalid naming labels.berth.mine", err)
	}
	// The engine that is not there: offline in State, creates retryable.
	if err := drive("e2", helloSpec()); !errors.Is(err, driver.ErrRetryable) {
		t.Errorf("create on an unreachable engine: %v, want ErrRetryable", err)
	}
	st, err := d.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 2 || st.Nodes[0].Status != driver.NodeOnline || st.Nodes[1].Status != driver.NodeOffline || st.Nodes[1].Reason == "" {
		t.Errorf("State: %+v, want e1 online and e2 offline with a reason", st.Nodes)
	}
	if _, err := d.Get(ctx, "e2/0123"); !errors.Is(err, driver.ErrRetryable) {
		t.Errorf("Get on an unreachable engine: %v, want ErrRetryable", err)
	}
	list, err := d.List(ctx, tags)
	var partial *driver.PartialListError
	switch {
	case !errors.Is(err, driver.ErrRetryable) || !errors.As(err, &partial):
		t.Errorf("List with an engine offline: %v, want a PartialListError (ErrRetryable)", err)
	case !slices.Equal(partial.Nodes, []string{"e2"}):
		t.Errorf("List with e2 offline: missed nodes %v, want [e2]", partial.Nodes)
	case len(list) != 1 || list[0].Name != name:
		t.Errorf("List with e2 offline: %d instances, want the one container %s on e1", len(list), name)
	}
	if _, err := d.Get(ctx, "e1/"+strings.Repeat("0", 64)); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Get of a missing container: %v, want ErrNotFound", err)
	}
	if err := d.Resume(ctx, "e1/"+strings.Repeat("0", 64)); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Resume of a missing container: %v, want ErrNotFound", err)
	}
	if _, err := d.Get(ctx, "no-slash"); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("Get with a malformed id: %v, want ErrInvalid", err)
	}
}

// TestFailedStartLeavesNothing: a container that cannot start (its port is
// taken) is removed by the create operation before it reports the error.
func TestFailedStartLeavesNothing(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(DefaultHost))
	run := randomID()
	t.Cleanup(func() { removeByLabel(t, mainCli, "berth.test.run", run) })
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().(*net.TCPAddr).Port
	spec := helloSpec()
	spec.Name = "berth-test-taken-" + run
	spec.Tags = map[string]string{"berth.test.run": run}
	spec.Ports = []driver.Port{{ContainerPort: 8080, HostPort: taken, Publish: true}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op, err := d.Create(ctx, "e1", spec)
	if err != nil {
		t.Fatal(err)
	}
	_, err = driver.Drive(ctx, op)
	if !errors.Is(err, driver.ErrPermanent) {
		t.Fatalf("start with a taken port: %v, want ErrPermanent", err)
	}
	list, err := d.List(ctx, spec.Tags)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Errorf("List after a failed start: %d containers left", len(list))
	}
}

// TestOperationsRunToTheirEnd: with one change in flight on the engine,
// creates asked for at once wait their turn, reported Queued, and each runs
// to its end once it has its turn: every container is started before the
// next one is made.
func TestOperationsRunToTheirEnd(t *testing.T) {
	leakCheck(t)
	o := testOptions(DefaultHost)
	o.MaxInFlight = 1
	d := openTest(t, o)
	run := randomID()
	t.Cleanup(func() { removeByLabel(t, mainCli, "berth.test.run", run) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const n = 4
	ops := make([]driver.Operation, n)
	for i := range ops {
		spec := helloSpec()
		spec.Name = fmt.Sprintf("berth-test-turns-%s-%d", run, i)
		spec.Tags = map[string]string{"berth.test.run": run}
		op, err := d.Create(ctx, "e1", spec)
		if err != nil {
			t.Fatal(err)
		}
		ops[i] = op
	}
	// Each asks for its turn at its first Advance; one takes the only
	// slot, and the others wait.
	queued := 0
	for i, op := range ops {
		p, err := op.Advance(ctx)
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		if p.Queued {
			queued++
		}
	}
	if queued < n-1 {
		t.Errorf("%d of %d creates reported Queued at once, want at least %d: one slot", queued, n, n-1)
	}
	ids := make([]string, n)
	for i, op := range ops {
		inst, err := driver.Drive(ctx, op)
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		_, ids[i], _ = strings.Cut(inst.ID, "/")
	}
	type times struct{ created, started time.Time }
	got := make([]times, n)
	for i, id := range ids {
		ci, err := mainCli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := ci.Container
		got[i].created, _ = time.Parse(time.RFC3339Nano, c.Created)
		got[i].started, _ = time.Parse(time.RFC3339Nano, c.State.StartedAt)
	}
	// The turns go in no set order; in the order they went, each was
	// over before the next began.
	slices.SortFunc(got, func(a, b times) int { return a.created.Compare(b.created) })
	for i := 1; i < n; i++ {
		if !got[i].created.After(got[i-1].started) {
			t.Errorf("a container was made at %s, before the one made before it was started at %s: a create went before an earlier one's start",
				got[i].created.Format(time.StampMicro), got[i-1].started.Format(time.StampMicro))
		}
	}
}

// TestLeakLabels: a container made behind Berth's back with Berth's labels
// is listed (so leak cleanup can remove it); one without is never listed.
func TestLeakLabels(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(DefaultHost))
	run := randomID()
	t.Cleanup(func() { removeByLabel(t, mainCli, "berth.test.run", run) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ours, err := mainCli.ContainerCreate(ctx, client.ContainerCreateOptions{Image: helloImage,
		Config: configWithLabels(map[string]string{driver.TagManaged: "true", "berth.test.run": run, driver.TagInstance: "i-1"})})
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := mainCli.ContainerCreate(ctx, client.ContainerCreateOptions{Image: helloImage,
		Config: configWithLabels(map[string]string{"berth.test.run": run})})
	if err != nil {
		t.Fatal(err)
	}
	list, err := d.List(ctx, map[string]string{"berth.test.run": run})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != "e1/"+ours.ID || list[0].Tags[driver.TagInstance] != "i-1" {
		t.Fatalf("List: %+v, want only the container with Berth's labels", list)
	}
	// Leak cleanup deletes what it lists; the other container is untouched.
	op, err := d.Delete(ctx, list[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := driver.Drive(ctx, op); err != nil {
		t.Fatal(err)
	}
	if _, err := mainCli.ContainerInspect(ctx, ours.ID, client.ContainerInspectOptions{}); err == nil {
		t.Error("the leaked container is still there after Delete")
	}
	if _, err := mainCli.ContainerInspect(ctx, theirs.ID, client.ContainerInspectOptions{}); err != nil {
		t.Errorf("the unlabelled container: %v", err)
	}
}

// TestLifecycleActions exercises kill with a signal, pause and unpause,
// resize, restart and the events they cause.
func TestLifecycleActions(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(DefaultHost))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wctx, stopWatch := context.WithCancel(ctx)
	var evs syncEvents
	watchDone := make(chan error, 1)
	go func() { watchDone <- d.Watch(wctx, evs.add) }()
	time.Sleep(200 * time.Millisecond) // let the event streams open

	spec := helloSpec()
	spec.Tags = map[string]string{"berth.test.run": randomID()}
	inst := create(t, d, "e1", spec)
	if err := d.Suspend(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Get(ctx, inst.ID); got == nil || got.State != driver.StateSuspended {
		t.Errorf("after Suspend: %+v", got)
	}
	if err := d.Resume(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if err := d.Resume(ctx, inst.ID); !errors.Is(err, driver.ErrNotSuspended) {
		t.Errorf("Resume of a running container: %v, want ErrNotSuspended", err)
	}
	if err := d.Resize(ctx, inst.ID, driver.Resources{CPU: 250, Memory: 96 * driver.MiB}); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Get(ctx, inst.ID); got == nil || got.Resources.CPU != 250 || got.Resources.Memory != 96*driver.MiB {
		t.Errorf("after Resize: %+v", got)
	}
	if err := d.Kill(ctx, inst.ID, "NOSUCHSIGNAL"); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("Kill with a bad signal: %v, want ErrInvalid", err)
	}
	if err := d.Kill(ctx, inst.ID, "TERM"); err != nil {
		t.Fatal(err)
	}
	wait(t, func() bool {
		got, err := d.Get(ctx, inst.ID)
		return err == nil && got.State == driver.StateExited && got.ExitCode != nil && *got.ExitCode == 0
	})
	if err := d.Kill(ctx, inst.ID, "KILL"); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("Kill of an exited container: %v, want ErrPermanent", err)
	}
	if err := d.Restart(ctx, inst.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Get(ctx, inst.ID); got == nil || got.State != driver.StateRunning {
		t.Errorf("after Restart: %+v", got)
	}
	u, err := d.Usage(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if u.Memory <= 0 || u.Time.IsZero() {
		t.Errorf("Usage: %+v, want some memory in use", u)
	}
	for _, want := range []driver.EventType{driver.EventStart, driver.EventSuspend, driver.EventResume, driver.EventDie} {
		wait(t, func() bool { return evs.has(inst.ID, want) })
	}
	stopWatch()
	if err := <-watchDone; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch: %v, want context.Canceled", err)
	}
	for _, e := range evs.list() {
		if e.Instance == inst.ID && e.Type == driver.EventDie && e.Message != "exit code 0" {
			t.Errorf("die event %+v, want exit code 0", e)
		}
	}
}

// TestDieEvent: a container that exits by itself is reported by Watch with
// its exit code, and by Get as exited.
func TestDieEvent(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(DefaultHost))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wctx, stopWatch := context.WithCancel(ctx)
	var evs syncEvents
	watchDone := make(chan error, 1)
	go func() { watchDone <- d.Watch(wctx, evs.add) }()
	time.Sleep(200 * time.Millisecond)
	spec := helloSpec()
	spec.Env = map[string]string{"HELLO_EXIT": "3"}
	spec.Tags = map[string]string{"berth.test.run": randomID()}
	inst := create(t, d, "e1", spec)
	wait(t, func() bool { return evs.has(inst.ID, driver.EventDie) })
	stopWatch()
	<-watchDone
	for _, e := range evs.list() {
		if e.Instance == inst.ID && e.Type == driver.EventDie {
			if e.Message != "exit code 3" || e.State != driver.StateExited || e.Tags["berth.test.run"] != spec.Tags["berth.test.run"] {
				t.Errorf("die event %+v", e)
			}
		}
	}
	got, err := d.Get(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != driver.StateExited || got.ExitCode == nil || *got.ExitCode != 3 {
		t.Errorf("Get: %+v, want exited with code 3", got)
	}
}
