package compose_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/compose"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

func TestLoadThreeServices(t *testing.T) {
	p, err := compose.Load(context.Background(), []string{"testdata/three.yaml"}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "shop" || !strings.HasPrefix(p.Group.ID, "shop-") {
		t.Errorf("project %q, group %q", p.Name, p.Group.ID)
	}
	by := map[string]scheduler.Service{}
	for _, s := range p.Group.Services {
		by[s.Name] = s
	}
	db, api, web := by["db"], by["api"], by["web"]
	if db.StartupOrder != 0 || api.StartupOrder != 1 || web.StartupOrder != 2 {
		t.Errorf("start-up order db %d, api %d, web %d; want 0, 1, 2", db.StartupOrder, api.StartupOrder, web.StartupOrder)
	}
	if db.CPU != 500 || db.Memory != 64<<20 || db.Env["POSTGRES_PASSWORD"] != "example" || len(db.Constraints) != 1 || db.Constraints[0] != "node==main" {
		t.Errorf("db: %+v", db)
	}
	if api.Count != 2 || web.Count != 1 {
		t.Errorf("replicas: api %d, web %d", api.Count, web.Count)
	}
	if len(web.Ports) != 1 || web.Ports[0] != (driver.Port{ContainerPort: 80, HostPort: 18081, Protocol: "tcp", Publish: true}) || web.RestartPolicy.Name != "always" {
		t.Errorf("web: ports %+v, restart %+v", web.Ports, web.RestartPolicy)
	}
	if web.Labels[compose.LabelProject] != "shop" || web.Labels[compose.LabelService] != "web" {
		t.Errorf("web labels %v", web.Labels)
	}
	if strings.Join(web.Command, " ") != "serve --port 80" {
		t.Errorf("web command %q", web.Command)
	}
}

func TestLoadRefusesByName(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"services:\n  a:\n    image: x\n    cap_add: [NET_ADMIN]\n", "services.a.cap_add"},
		{"services:\n  a:\n    image: x\n    healthcheck:\n      test: [CMD, x]\n", "services.a.healthcheck"},
		{"services:\n  a:\n    image: x\nsecrets:\n  s:\n    file: ./s\n", "secrets"},
		{"services:\n  a:\n    image: x\n    deploy:\n      placement:\n        preferences: [{spread: node.labels.zone}]\n", "services.a.deploy.placement.preferences"},
		{"services:\n  a:\n    image: x\n    depends_on:\n      b: {condition: service_healthy}\n  b:\n    image: y\n", "service_healthy"},
		{"services:\n  a:\n    image: x\n    depends_on: [b]\n  b:\n    image: y\n    depends_on: [a]\n", "cycle"},
	} {
		dir := t.TempDir()
		f := filepath.Join(dir, "compose.yaml")
		if err := os.WriteFile(f, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := compose.Load(context.Background(), []string{f}, "p", nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %q", tc.yaml, err, tc.want)
		}
		if err != nil && !errors.Is(err, driver.ErrUnsupported) && !errors.Is(err, driver.ErrInvalid) && !strings.Contains(err.Error(), "cycle") {
			t.Logf("%s: %v", tc.want, err)
		}
	}
}
