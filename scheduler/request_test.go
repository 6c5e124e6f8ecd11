package scheduler

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
)

func TestRequestCitadelJSON(t *testing.T) {
	var r Request
	in := `{"image": "crosbymichael/redis", "cpus": "0.2", "memory": 512, "type": "service",
		"count": 3, "constraints": ["disk==ssd"], "affinities": ["image!=~redis"], "provider": "sim", "priority": 5,
		"ports": [{"container_port": 6379, "publish": true}]}`
	if err := json.Unmarshal([]byte(in), &r); err != nil {
		t.Fatal(err)
	}
	if r.Image != "crosbymichael/redis" || r.CPU != 200 || r.Memory != 512*driver.MiB || r.Type != driver.TypeService {
		t.Fatalf("spec fields: %+v", r.Spec)
	}
	if r.Count != 3 || r.Provider != "sim" || r.Priority != 5 || len(r.Constraints) != 1 || len(r.Affinities) != 1 {
		t.Fatalf("placement fields: %+v", r)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if r.EffectiveStrategy() != StrategySpread {
		t.Errorf("service default strategy = %s", r.EffectiveStrategy())
	}
	r.Type = driver.TypeBatch
	if r.EffectiveStrategy() != StrategyBinpack {
		t.Errorf("batch default strategy = %s", r.EffectiveStrategy())
	}
}

func paths(err error) []string {
	var fes driver.FieldErrors
	if !errors.As(err, &fes) {
		return nil
	}
	var out []string
	for _, e := range fes {
		out = append(out, e.Path)
	}
	return out
}

func TestRequestValidate(t *testing.T) {
	tests := []struct {
		name string
		r    Request
		want []string
	}{
		{"ok", Request{Spec: driver.Spec{Image: "x"}}, nil},
		{"spec field", Request{Spec: driver.Spec{}}, []string{"image"}},
		{"count", Request{Spec: driver.Spec{Image: "x"}, Count: -1}, []string{"count"}},
		{"constraint", Request{Spec: driver.Spec{Image: "x"}, Constraints: []string{"ok==1", "bad"}}, []string{"constraints[1]"}},
		{"affinity", Request{Spec: driver.Spec{Image: "x"}, Affinities: []string{"label.==x"}}, []string{"affinities[0]"}},
		{"strategy", Request{Spec: driver.Spec{Image: "x"}, Strategy: "tetris"}, []string{"strategy"}},
		{"capability", Request{Spec: driver.Spec{Image: "x"}, Capabilities: []string{"resize", "fly"}}, []string{"capabilities[1]"}},
		{"negative cpu", Request{Spec: driver.Spec{Image: "x", Resources: driver.Resources{CPU: -1}}, MaxPerNode: -1}, []string{"cpus", "max_per_node"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.r.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, driver.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if got := paths(err); !slices.Equal(got, tt.want) {
				t.Fatalf("paths = %v, want %v (%v)", got, tt.want, err)
			}
		})
	}
}

func TestGroupValidate(t *testing.T) {
	two, five := 2, 5
	g := Group{ID: "g", Services: []Service{
		{Request: Request{Spec: driver.Spec{Name: "a", Image: "x"}, Count: 3}, Essential: &two},
		{Request: Request{Spec: driver.Spec{Name: "b", Image: "x"}, Count: 3}, Essential: &five},
		{Request: Request{Spec: driver.Spec{Name: "a"}}},
	}}
	want := []string{"services[1].essential", "services[2].image", "services[2].name"}
	if got := paths(g.Validate()); !slices.Equal(got, want) {
		t.Fatalf("paths = %v, want %v", got, want)
	}
	ns := Group{ID: "ns", Kind: KindNodeSet, Services: []Service{
		{Request: Request{Spec: driver.Spec{Name: "small", Image: "x"}}},
		{Request: Request{Spec: driver.Spec{Name: "big", Image: "x"}, Count: 2}, Essential: &two},
	}}
	if err := ns.Validate(); err != nil {
		t.Fatal(err)
	}
	one := 1
	ns.Services[1].Essential = &one
	if got := paths(ns.Validate()); !slices.Equal(got, []string{"services[1].essential"}) {
		t.Fatalf("node set with an elastic instance: %v", got)
	}
	if got := paths((&Group{}).Validate()); !slices.Equal(got, []string{"id", "services"}) {
		t.Fatalf("empty group: %v", got)
	}
}

func TestStrategyErrorNamesEveryStrategy(t *testing.T) {
	r := Request{Spec: driver.Spec{Image: "x"}, Strategy: "tetris"}
	var fe *driver.FieldError
	if err := r.Validate(); !errors.As(err, &fe) || fe.Path != "strategy" {
		t.Fatalf("Validate: %v, want a field error for strategy", err)
	}
	for _, s := range Strategies {
		if !strings.Contains(fe.Reason, string(s)) {
			t.Errorf("reason %q does not name %s", fe.Reason, s)
		}
	}
}

func TestServiceRequest(t *testing.T) {
	g := Group{ID: "g", Priority: 7, Provider: "p", Services: []Service{
		{Request: Request{Spec: driver.Spec{Name: "web", Image: "x"}, Priority: 1, Provider: "q"}},
		{Request: Request{ID: "db", Spec: driver.Spec{Image: "x"}}},
		{Request: Request{Spec: driver.Spec{Image: "x"}}},
	}}
	want := []string{"g.web", "g.db", "g.s2"}
	for i, id := range want {
		r := g.ServiceRequest(i)
		if r.ID != id || r.Group != "g" || r.Priority != 7 || r.Provider != "p" {
			t.Errorf("ServiceRequest(%d) = id %q group %q priority %d provider %q, want %q g 7 p", i, r.ID, r.Group, r.Priority, r.Provider, id)
		}
	}
	g.Priority, g.Provider = 0, ""
	if r := g.ServiceRequest(0); r.Priority != 1 || r.Provider != "q" {
		t.Errorf("without group priority and provider: %d %q, want the service's 1 q", r.Priority, r.Provider)
	}
	if g.Services[0].ID != "" {
		t.Errorf("ServiceRequest changed the group's service: id %q", g.Services[0].ID)
	}
}
