package driver_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
)

func validSpec() *driver.Spec {
	return &driver.Spec{
		Name:      "web-1",
		Image:     "nginx:1.27",
		Resources: driver.Resources{CPU: 200, Memory: 512 * driver.MiB},
		Env:       map[string]string{"PORT": "80"},
		Ports:     []driver.Port{{ContainerPort: 80, HostPort: 8080}, {ContainerPort: 80, HostPort: 8080, Protocol: "udp"}},
		Volumes:   []driver.Volume{{Source: "/srv/data", Target: "/data"}, {Source: "cache", Target: "/cache", ReadOnly: true}},
		ConfigFiles: []driver.ConfigFile{
			{Path: "/etc/app.conf", Content: "x=1"},
		},
		RestartPolicy: driver.RestartPolicy{Name: "on-failure", MaxRetries: 3},
		Tags:          map[string]string{driver.TagManaged: "true"},
	}
}

func paths(err error) []string {
	var fes driver.FieldErrors
	if !errors.As(err, &fes) {
		return nil
	}
	var out []string
	for _, fe := range fes {
		out = append(out, fe.Path)
	}
	return out
}

func TestSpecValidate(t *testing.T) {
	if err := validSpec().Validate(); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	proc := &driver.Spec{Kind: driver.KindProcess, Command: []string{"sleep", "1"}}
	if err := proc.Validate(); err != nil {
		t.Errorf("a process with only a command: %v", err)
	}
	files := func(n int) []driver.ConfigFile {
		var out []driver.ConfigFile
		for i := range n {
			out = append(out, driver.ConfigFile{Path: "/etc/f" + string(rune('a'+i)), Content: "x"})
		}
		return out
	}
	cases := []struct {
		name   string
		mutate func(*driver.Spec)
		path   string
	}{
		{"bad name", func(s *driver.Spec) { s.Name = "-web" }, "name"},
		{"stdin on a vm", func(s *driver.Spec) { s.Kind, s.Stdin = driver.KindVM, true }, "stdin"},
		{"tty on bare metal", func(s *driver.Spec) { s.Kind, s.TTY = driver.KindBareMetal, true }, "tty"},
		{"long name", func(s *driver.Spec) { s.Name = strings.Repeat("a", driver.MaxNameLength+1) }, "name"},
		{"no image", func(s *driver.Spec) { s.Image = "" }, "image"},
		{"image with space", func(s *driver.Spec) { s.Image = "a b" }, "image"},
		{"process without command", func(s *driver.Spec) { s.Kind, s.Image = driver.KindProcess, "" }, "command"},
		{"bad kind", func(s *driver.Spec) { s.Kind = "pod" }, "kind"},
		{"bad type", func(s *driver.Spec) { s.Type = "cron" }, "type"},
		{"negative cpus", func(s *driver.Spec) { s.CPU = -1 }, "cpus"},
		{"negative memory", func(s *driver.Spec) { s.Memory = -1 }, "memory"},
		{"negative disk", func(s *driver.Spec) { s.Disk = -1 }, "disk"},
		{"negative gpus", func(s *driver.Spec) { s.GPUs = -1 }, "gpus"},
		{"negative other", func(s *driver.Spec) { s.Other = map[string]int64{"fpga": -1} }, "other.fpga"},
		{"empty other name", func(s *driver.Spec) { s.Other = map[string]int64{"": 1} }, "other"},
		{"negative reservation", func(s *driver.Spec) { s.MemoryReservation = -1 }, "memory_reservation"},
		{"reservation over limit", func(s *driver.Spec) { s.MemoryReservation = s.Memory + 1 }, "memory_reservation"},
		{"bad cpuset", func(s *driver.Spec) { s.Cpuset = "0-" }, "cpuset"},
		{"bad env", func(s *driver.Spec) { s.Env = map[string]string{"1X": "y"} }, "env.1X"},
		{"relative working dir", func(s *driver.Spec) { s.WorkingDir = "tmp" }, "working_dir"},
		{"bad hostname", func(s *driver.Spec) { s.Hostname = "a_b" }, "hostname"},
		{"empty label key", func(s *driver.Spec) { s.Labels = map[string]string{"": "x"} }, "labels"},
		{"empty tag key", func(s *driver.Spec) { s.Tags = map[string]string{"": "x"} }, "tags"},
		{"container port", func(s *driver.Spec) { s.Ports[0].ContainerPort = 0 }, "ports[0].container_port"},
		{"host port range", func(s *driver.Spec) { s.Ports[1].HostPort = 70000 }, "ports[1].host_port"},
		{"protocol", func(s *driver.Spec) { s.Ports[0].Protocol = "icmp" }, "ports[0].protocol"},
		{"host port twice", func(s *driver.Spec) { s.Ports[1].Protocol = "tcp" }, "ports[1].host_port"},
		{"volume source", func(s *driver.Spec) { s.Volumes[0].Source = "" }, "volumes[0].source"},
		{"volume name", func(s *driver.Spec) { s.Volumes[1].Source = "bad name" }, "volumes[1].source"},
		{"volume target", func(s *driver.Spec) { s.Volumes[0].Target = "data" }, "volumes[0].target"},
		{"target twice", func(s *driver.Spec) { s.Volumes[1].Target = "/data/" }, "volumes[1].target"},
		{"empty network", func(s *driver.Spec) { s.Networks = []string{"a", ""} }, "networks[1]"},
		{"bad network alias", func(s *driver.Spec) { s.Networks, s.NetworkAliases = []string{"a"}, []string{"db", "a b"} }, "network_aliases[1]"},
		{"aliases without networks", func(s *driver.Spec) { s.Networks, s.NetworkAliases = nil, []string{"db"} }, "network_aliases"},
		{"six config files", func(s *driver.Spec) { s.ConfigFiles = files(driver.MaxConfigFiles + 1) }, "config_files"},
		{"config path", func(s *driver.Spec) { s.ConfigFiles[0].Path = "etc/x" }, "config_files[0].path"},
		{"config dir path", func(s *driver.Spec) { s.ConfigFiles[0].Path = "/etc/" }, "config_files[0].path"},
		{"config path twice", func(s *driver.Spec) { s.ConfigFiles = append(s.ConfigFiles, s.ConfigFiles[0]) }, "config_files[1].path"},
		{"config too big", func(s *driver.Spec) { s.ConfigFiles[0].Content = strings.Repeat("x", driver.MaxConfigFileSize+1) }, "config_files[0].content"},
		{"config mode", func(s *driver.Spec) { s.ConfigFiles[0].Mode = 0o17777 }, "config_files[0].mode"},
		{"user data too big", func(s *driver.Spec) { s.UserData = strings.Repeat("x", driver.MaxUserDataSize+1) }, "user_data"},
		{"restart name", func(s *driver.Spec) { s.RestartPolicy.Name = "sometimes" }, "restart_policy.name"},
		{"retries without on-failure", func(s *driver.Spec) { s.RestartPolicy.Name = "always" }, "restart_policy.max_retries"},
		{"negative retries", func(s *driver.Spec) { s.RestartPolicy.MaxRetries = -1 }, "restart_policy.max_retries"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := validSpec()
			c.mutate(s)
			err := s.Validate()
			if !errors.Is(err, driver.ErrInvalid) {
				t.Fatalf("Validate: %v, want ErrInvalid", err)
			}
			if got := paths(err); !slices.Equal(got, []string{c.path}) {
				t.Errorf("Validate: field errors on %v, want exactly [%s] (%v)", got, c.path, err)
			}
		})
	}
	s := validSpec()
	s.CPU, s.Image = -1, ""
	if got := paths(s.Validate()); len(got) != 2 {
		t.Errorf("two bad fields: errors on %v, want both", got)
	}
	if got := (&driver.Spec{}).KindOrDefault(); got != driver.KindContainer {
		t.Errorf("KindOrDefault = %q", got)
	}
}

func TestValidateResourcesPrefix(t *testing.T) {
	err := driver.ValidateResources("capacity.", driver.Resources{Memory: -1})
	if got := paths(err); !slices.Equal(got, []string{"capacity.memory"}) {
		t.Errorf("ValidateResources: %v", err)
	}
	if err := driver.ValidateResources("x.", driver.Resources{CPU: 1}); err != nil {
		t.Errorf("ValidateResources of good resources: %v", err)
	}
}
