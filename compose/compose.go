// Package compose turns a Compose file into one Berth group, with the
// Compose specification's own loader (github.com/compose-spec/compose-go/v2):
// each service is a service of the group (replicas, resources, ports,
// environment, restart policy, volumes, placement constraints), depends_on
// becomes the start-up order, and every attribute Berth cannot honour is
// refused by its path ("services.web.cap_add") before anything is
// submitted.
package compose

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/tree"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// Labels Berth writes on every instance of a project, as Compose does.
const (
	LabelProject = "com.docker.compose.project"
	LabelService = "com.docker.compose.service"
)

// supported are the Compose attributes Berth honours; every other one is
// refused by name.
var supported = func() []tree.Path {
	var out []tree.Path
	for _, p := range []string{
		"name", "version", "services",
		"networks", "networks.default", "networks.default.*",
		"volumes", "volumes.*", "volumes.*.name",
	} {
		out = append(out, tree.Path(p))
	}
	for _, p := range []string{
		"", "image", "command", "command.[]", "entrypoint", "entrypoint.[]",
		"environment", "environment.*", "env_file", "env_file.[]", "env_file.[].*",
		"labels", "labels.*", "working_dir", "hostname", "domainname",
		"cpus", "cpuset", "mem_limit", "mem_reservation", "restart",
		"ports", "ports.[]", "ports.[].target", "ports.[].published", "ports.[].protocol", "ports.[].host_ip", "ports.[].mode",
		"volumes", "volumes.[]", "volumes.[].type", "volumes.[].source", "volumes.[].target", "volumes.[].read_only", "volumes.[].bind", "volumes.[].bind.*", "volumes.[].volume", "volumes.[].volume.*",
		"depends_on", "depends_on.*", "depends_on.*.condition", "depends_on.*.required", "depends_on.*.restart",
		"networks", "networks.default", "networks.default.*",
		"deploy", "deploy.mode", "deploy.replicas", "deploy.labels", "deploy.labels.*",
		"deploy.resources", "deploy.resources.limits", "deploy.resources.limits.cpus", "deploy.resources.limits.memory",
		"deploy.resources.reservations", "deploy.resources.reservations.cpus", "deploy.resources.reservations.memory",
		"deploy.restart_policy", "deploy.restart_policy.condition", "deploy.restart_policy.max_attempts",
		"deploy.placement", "deploy.placement.constraints", "deploy.placement.constraints.[]", "deploy.placement.max_replicas_per_node",
	} {
		out = append(out, tree.Path(strings.TrimSuffix("services.*."+p, ".")))
	}
	return out
}()

// Project is a loaded Compose file, turned into a group.
type Project struct {
	// Name is the project's name (the file's name:, -p, or the directory).
	Name  string
	Group scheduler.Group
}

// Load reads the Compose files (the first one names the project's
// directory), checks that Berth can honour every attribute and returns the
// group to submit, whose id is the project's name and a fresh suffix (ids
// are never reused). name overrides the project name when not empty; env
// is the environment for interpolation.
func Load(ctx context.Context, files []string, name string, env []string) (*Project, error) {
	var refused []string
	report := func(found []loader.UnsupportedAttribute) {
		for _, f := range found {
			refused = append(refused, string(f.Path))
		}
	}
	opts := []cli.ProjectOptionsFn{
		cli.WithEnv(env), cli.WithDotEnv,
		cli.WithLoadOptions(loader.WithSupportedAttributes(supported, report)),
	}
	if name != "" {
		opts = append(opts, cli.WithName(name))
	}
	po, err := cli.NewProjectOptions(files, opts...)
	if err != nil {
		return nil, err
	}
	p, err := po.LoadProject(ctx)
	if err != nil {
		return nil, err
	}
	if len(refused) > 0 {
		slices.Sort(refused)
		return nil, driver.Errorf(driver.ErrUnsupported, "Berth cannot honour %s", strings.Join(slices.Compact(refused), ", "))
	}
	return translate(p)
}

func translate(p *types.Project) (*Project, error) {
	if len(p.Services) == 0 {
		return nil, driver.Errorf(driver.ErrInvalid, "the project %s has no service", p.Name)
	}
	order, err := startupOrder(p)
	if err != nil {
		return nil, err
	}
	// A project name may hold a '_', which ids keep for their namespace
	// (control.ChosenID).
	g := scheduler.Group{ID: scheduler.NewGroupID(strings.ReplaceAll(p.Name, "_", "-"))}
	var es driver.FieldErrors
	for _, name := range slices.Sorted(maps.Keys(p.Services)) {
		svc := p.Services[name]
		path := "services." + name
		s := scheduler.Service{StartupOrder: order[name]}
		s.Name = name
		s.Image = svc.Image
		s.Kind = driver.KindContainer
		s.Entrypoint = svc.Entrypoint
		s.Command = svc.Command
		s.WorkingDir, s.Hostname, s.Domainname, s.Cpuset = svc.WorkingDir, svc.Hostname, svc.DomainName, svc.CPUSet
		for k, v := range svc.Environment {
			if v == nil {
				continue // unset in the environment: Compose leaves it out too
			}
			if s.Env == nil {
				s.Env = map[string]string{}
			}
			s.Env[k] = *v
		}
		s.Labels = map[string]string{LabelProject: p.Name, LabelService: name}
		for k, v := range svc.Labels {
			s.Labels[k] = v
		}
		s.CPU = driver.MilliCPU(svc.CPUS * 1000)
		s.Memory = driver.Bytes(svc.MemLimit)
		s.MemoryReservation = driver.Bytes(svc.MemReservation)
		s.Count = 1
		if svc.Scale != nil {
			s.Count = *svc.Scale
		}
		if d := svc.Deploy; d != nil {
			if d.Mode != "" && d.Mode != "replicated" {
				es.Add(path+".deploy.mode", "%q: Berth runs replicated services only", d.Mode)
			}
			if d.Replicas != nil {
				s.Count = *d.Replicas
			}
			if l := d.Resources.Limits; l != nil {
				if l.NanoCPUs > 0 {
					s.CPU = driver.MilliCPU(float64(l.NanoCPUs) * 1000)
				}
				if l.MemoryBytes > 0 {
					s.Memory = driver.Bytes(l.MemoryBytes)
				}
			}
			if r := d.Resources.Reservations; r != nil {
				if r.NanoCPUs > 0 && s.CPU == 0 {
					s.CPU = driver.MilliCPU(float64(r.NanoCPUs) * 1000)
				}
				if r.MemoryBytes > 0 {
					s.MemoryReservation = driver.Bytes(r.MemoryBytes)
				}
			}
			s.Constraints = append(s.Constraints, d.Placement.Constraints...)
			s.MaxPerNode = int(d.Placement.MaxReplicas)
			if rp := d.RestartPolicy; rp != nil {
				switch rp.Condition {
				case "none":
					s.RestartPolicy = driver.RestartPolicy{Name: "no"}
				case "on-failure":
					s.RestartPolicy = driver.RestartPolicy{Name: "on-failure"}
				case "any", "":
					s.RestartPolicy = driver.RestartPolicy{Name: "always"}
				default:
					es.Add(path+".deploy.restart_policy.condition", "%q: want none, on-failure or any", rp.Condition)
				}
				if rp.MaxAttempts != nil {
					s.RestartPolicy.MaxRetries = int(*rp.MaxAttempts)
				}
			}
			for k, v := range d.Labels {
				s.Labels[k] = v
			}
		}
		if s.Count < 1 {
			es.Add(path+".deploy.replicas", "%d: Berth runs at least one replica of a service", s.Count)
		}
		if svc.Restart != "" {
			pol, max, _ := strings.Cut(svc.Restart, ":")
			switch pol {
			case "no", "always", "unless-stopped", "on-failure":
				s.RestartPolicy = driver.RestartPolicy{Name: pol}
			default:
				es.Add(path+".restart", "%q: want no, always, on-failure[:N] or unless-stopped", svc.Restart)
			}
			if max != "" {
				n, err := strconv.Atoi(max)
				if err != nil {
					es.Add(path+".restart", "%q: the retry count is not a number", svc.Restart)
				}
				s.RestartPolicy.MaxRetries = n
			}
		}
		for i, pc := range svc.Ports {
			pp := fmt.Sprintf("%s.ports[%d]", path, i)
			if pc.Mode != "" && pc.Mode != "ingress" && pc.Mode != "host" {
				es.Add(pp+".mode", "%q: want host", pc.Mode)
			}
			port := driver.Port{ContainerPort: int(pc.Target), Protocol: pc.Protocol, HostIP: pc.HostIP, Publish: pc.Published != ""}
			if pc.Published != "" {
				n, err := strconv.Atoi(pc.Published)
				if err != nil {
					es.Add(pp+".published", "%q: Berth publishes one port, not a range", pc.Published)
				}
				port.HostPort = n
				if n != 0 && s.Count > 1 {
					s.MaxPerNode = 1 // one fixed host port per node
				}
			}
			s.Ports = append(s.Ports, port)
		}
		for i, v := range svc.Volumes {
			vp := fmt.Sprintf("%s.volumes[%d]", path, i)
			switch v.Type {
			case types.VolumeTypeBind, types.VolumeTypeVolume:
			default:
				es.Add(vp+".type", "%q: Berth mounts bind and volume only", v.Type)
				continue
			}
			if v.Source == "" {
				es.Add(vp+".source", "anonymous volumes are not supported: name the volume")
				continue
			}
			src := v.Source
			if v.Type == types.VolumeTypeVolume {
				if vc, ok := p.Volumes[v.Source]; ok && vc.Name != "" {
					src = vc.Name
				}
			}
			s.Volumes = append(s.Volumes, driver.Volume{Source: src, Target: v.Target, ReadOnly: v.ReadOnly})
		}
		g.Services = append(g.Services, s)
	}
	if err := es.Err(); err != nil {
		return nil, err
	}
	return &Project{Name: p.Name, Group: g}, nil
}

// startupOrder gives each service its depth in the depends_on graph: a
// service starts after everything it depends on.
func startupOrder(p *types.Project) (map[string]int, error) {
	order := map[string]int{}
	visiting := map[string]bool{}
	var depth func(name string) (int, error)
	depth = func(name string) (int, error) {
		if d, ok := order[name]; ok {
			return d, nil
		}
		if visiting[name] {
			return 0, driver.Errorf(driver.ErrInvalid, "services.%s.depends_on: a dependency cycle", name)
		}
		visiting[name] = true
		svc, ok := p.Services[name]
		if !ok {
			return 0, driver.Errorf(driver.ErrInvalid, "depends_on names %s, which is not a service", name)
		}
		d := 0
		for dep, cfg := range svc.DependsOn {
			if cfg.Condition != "" && cfg.Condition != types.ServiceConditionStarted {
				return 0, driver.Errorf(driver.ErrUnsupported, "services.%s.depends_on.%s.condition %q: Berth orders start-up only (service_started)", name, dep, cfg.Condition)
			}
			dd, err := depth(dep)
			if err != nil {
				return 0, err
			}
			d = max(d, dd+1)
		}
		visiting[name] = false
		order[name] = d
		return d, nil
	}
	for name := range p.Services {
		if _, err := depth(name); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// ErrNoProject is returned when no instance carries the project's label.
var ErrNoProject = errors.New("compose: no such project")
