package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/driver"
)

func TestParsePort(t *testing.T) {
	cases := []struct {
		in   string
		want driver.Port
		bad  bool
	}{
		{"80", driver.Port{ContainerPort: 80}, false},
		{"8080:80", driver.Port{ContainerPort: 80, HostPort: 8080, Publish: true}, false},
		{"127.0.0.1:8080:80/udp", driver.Port{ContainerPort: 80, HostPort: 8080, HostIP: "127.0.0.1", Protocol: "udp", Publish: true}, false},
		{"127.0.0.1::80", driver.Port{ContainerPort: 80, HostIP: "127.0.0.1", Publish: true}, false},
		{"http", driver.Port{}, true},
		{"1:2:3:4", driver.Port{}, true},
	}
	for _, c := range cases {
		got, err := parsePort(c.in)
		if (err != nil) != c.bad {
			t.Errorf("%q: err %v", c.in, err)
			continue
		}
		if !c.bad && got != c.want {
			t.Errorf("%q: got %+v, want %+v", c.in, got, c.want)
		}
	}
}

func TestParseMemory(t *testing.T) {
	cases := map[string]driver.Bytes{
		"512":   512 * driver.MiB,
		"512m":  512 * driver.MiB,
		"2g":    2 * driver.GiB,
		"512Mi": 512 * driver.MiB,
		"1G":    driver.GiB,
		"1g":    driver.GiB,
		"1GB":   driver.GiB,
		"2M":    2 * driver.MiB,
		"1.5g":  1536 * driver.MiB,
		"100b":  100,
		"64k":   64 * driver.KiB,
		"64K":   64 * driver.KiB,
		"1GiB":  driver.GiB,
	}
	for in, want := range cases {
		got, err := parseMemory(in)
		if err != nil || got != want {
			t.Errorf("%q: got %v %v, want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"lots", "1bb", "1x", "g"} {
		if _, err := parseMemory(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestSpecFlags(t *testing.T) {
	var s specFlags
	c := runCmd(&cli{})
	c.ResetFlags()
	s.register(c)
	args := []string{"--name", "web", "--cpus", "500m", "-m", "256Mi", "-e", "A=1", "-p", "8080:80",
		"-v", "/data:/srv:ro", "-l", "tier=front", "--constraint", "disk==ssd", "--restart", "on-failure:3", "--count", "2",
		"nginx", "--", "nginx", "-g", "daemon off;"}
	if err := c.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	req, err := s.request(c, c.Flags().Args())
	if err != nil {
		t.Fatal(err)
	}
	if req.Image != "nginx" || !reflect.DeepEqual(req.Command, []string{"nginx", "-g", "daemon off;"}) || req.Kind != "" {
		t.Errorf("image/command/kind: %q %q %q", req.Image, req.Command, req.Kind)
	}
	if req.CPU != 500 || req.Memory != 256*driver.MiB || req.Env["A"] != "1" || req.Labels["tier"] != "front" || req.Count != 2 {
		t.Errorf("resources/env/labels: %+v", req)
	}
	if len(req.Ports) != 1 || req.Ports[0].HostPort != 8080 || len(req.Volumes) != 1 || !req.Volumes[0].ReadOnly {
		t.Errorf("ports/volumes: %+v %+v", req.Ports, req.Volumes)
	}
	if req.RestartPolicy.Name != "on-failure" || req.RestartPolicy.MaxRetries != 3 || req.Constraints[0] != "disk==ssd" {
		t.Errorf("restart/constraints: %+v %v", req.RestartPolicy, req.Constraints)
	}
	if err := req.Validate(); err != nil {
		t.Errorf("the request does not validate: %v", err)
	}
	for _, bad := range [][]string{{"--cpus", "x"}, {"-e", "=1"}, {"-v", "/only"}, {"--restart", "on-failure:x"}, {"-p", "a:b"}} {
		var s specFlags
		c := runCmd(&cli{})
		c.ResetFlags()
		s.register(c)
		if err := c.ParseFlags(bad); err != nil {
			t.Fatal(err)
		}
		_, err := s.request(c, nil)
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%v: got %v, want a usage error", bad, err)
		}
	}
}

func TestExitCodes(t *testing.T) {
	cases := []struct {
		err  error
		code int
	}{
		{nil, 0},
		{errors.New("boom"), 1},
		{usagef("bad"), 2},
		{fmt.Errorf("x: %w", driver.ErrNotFound), 3},
		{&api.Error{Code: "not_found"}, 3},
		{&driver.FieldError{Path: "cpus", Reason: "negative"}, 4},
		{&api.Error{Code: "invalid", Field: "cpus"}, 4},
		{&api.Error{Code: "already_exists", Field: "id"}, 5},
		{&api.Error{Code: "quota_exceeded"}, 5},
		{&api.Error{Code: "not_suspended"}, 5},
		{fmt.Errorf("resume: %w", driver.ErrNotSuspended), 5},
		{&api.Error{Code: "invalid", Field: "for"}, 4},
		{&api.Error{Code: "unsupported"}, 6},
		{fmt.Errorf("%w: dial", driver.ErrRetryable), 7},
		{reported{&api.Error{Code: "not_found"}}, 3},
	}
	for _, c := range cases {
		if got := exitCode(c.err); got != c.code {
			t.Errorf("exitCode(%v) = %d, want %d", c.err, got, c.code)
		}
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{{"no-such-verb"}, {"logs"}, {"ps", "--bogus"}, {"inspect"}, {"resize", "x"},
		{"suspend"}, {"resume"}, {"suspend", "x", "-t", "3"}, {"hold", "x"}, {"hold", "--for", "2h"}, {"hold", "x", "--for", "soon"},
		{"stats"}, {"stats", "a", "b"}, {"stats", "x", "--bogus"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != exitUsage {
			t.Errorf("berth %v: exit %d, want 2 (%s)", args, code, errb.String())
		}
	}
}

func TestUnreachableServerExits7(t *testing.T) {
	var out, errb bytes.Buffer
	// Port 1 on loopback refuses connections.
	if code := run(context.Background(), []string{"--addr", "http://127.0.0.1:1", "ps"}, &out, &errb); code != exitUnavailable {
		t.Errorf("exit %d, want 7 (%s)", code, errb.String())
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHumanBytes(t *testing.T) {
	for _, c := range []struct {
		in   driver.Bytes
		want string
	}{
		{0, "0B"}, {512, "512B"}, {1536, "1.5Ki"}, {512 * driver.MiB, "512Mi"},
		{24684092 * driver.KiB, "23.5Gi"}, {2 * driver.TiB, "2Ti"}, {-3 * driver.GiB, "-3Gi"},
	} {
		if got := c.in.Human(); got != c.want {
			t.Errorf("Bytes(%d).Human() = %q, want %q", int64(c.in), got, c.want)
		}
	}
}
