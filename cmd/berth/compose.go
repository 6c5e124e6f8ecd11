package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/compose"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
)

// composeFlags are what every compose verb takes.
type composeFlags struct {
	files   []string
	project string
}

func (f *composeFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringSliceVarP(&f.files, "file", "f", nil, "Compose file (default compose.yaml in this directory; repeat to merge)")
	cmd.Flags().StringVarP(&f.project, "project-name", "p", "", "project name (default the file's name:, else the directory's)")
}

// load reads the Compose files into a group.
func (f *composeFlags) load(ctx context.Context) (*compose.Project, error) {
	files := f.files
	if len(files) == 0 {
		for _, name := range []string{"compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml"} {
			if _, err := os.Stat(name); err == nil {
				files = []string{name}
				break
			}
		}
		if len(files) == 0 {
			return nil, usagef("no compose.yaml here: name the file with -f")
		}
	}
	return compose.Load(ctx, files, f.project, os.Environ())
}

// projectInstances lists the instances of a project, not deleted.
func projectInstances(ctx context.Context, cl *client.Client, project string) ([]control.Instance, error) {
	list, err := cl.Instances(ctx, control.Filter{})
	if err != nil {
		return nil, err
	}
	out := list[:0]
	for _, in := range list {
		if in.Spec != nil && in.Spec.Labels[compose.LabelProject] == project {
			out = append(out, in)
		}
	}
	return out, nil
}

func composeCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "compose",
		Short: "Run a Compose file as one Berth group",
		Long: `Run the services of a Compose file as one Berth group: replicas, resources,
ports, environment, restart policies, volumes, depends_on (as start-up order)
and deploy.placement constraints. Attributes Berth cannot honour are refused
by name before anything runs. up always runs detached, as docker compose up -d.`,
		Args: nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(composeUpCmd(c), composeDownCmd(c), composePsCmd(c))
	return cmd
}

func composeUpCmd(c *cli) *cobra.Command {
	var f composeFlags
	var detach, asJSON bool
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Submit the Compose file's services as one group",
		Args:  nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			p, err := f.load(ctx)
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			have, err := projectInstances(ctx, cl, p.Name)
			if err != nil {
				return err
			}
			if len(have) > 0 {
				return driver.Errorf(driver.ErrAlreadyExists, "project %s is up (group %s): berth compose down first", p.Name, have[0].Group)
			}
			ans, err := cl.SubmitGroup(ctx, p.Group)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(c.stdout, ans)
			}
			fmt.Fprintf(c.stdout, "project %s: group %s, %d instances\n", p.Name, ans.Group, len(ans.Instances))
			list := make([]control.Instance, len(ans.Instances))
			for i, pl := range ans.Instances {
				list[i] = pl.Instance
			}
			return printProject(c, list, false)
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVarP(&detach, "detach", "d", true, "run in the background (always: Berth's groups run detached)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the answer as JSON")
	return cmd
}

func composePsCmd(c *cli) *cobra.Command {
	var f composeFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List the project's instances",
		Args:  nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := f.load(cmd.Context())
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			list, err := projectInstances(cmd.Context(), cl, p.Name)
			if err != nil {
				return err
			}
			return printProject(c, list, asJSON)
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printProject prints a project's instances by service and name.
func printProject(c *cli, list []control.Instance, asJSON bool) error {
	slices.SortFunc(list, func(a, b control.Instance) int { return strings.Compare(a.ID, b.ID) })
	return printList(c.stdout, asJSON, list, []string{"NAME", "SERVICE", "PHASE", "NODE", "PORTS", "IMAGE"},
		func(in control.Instance) []any {
			svc, image := "", ""
			if in.Spec != nil {
				svc, image = in.Spec.Labels[compose.LabelService], in.Spec.Image
			}
			return []any{in.Name, svc, in.Phase, in.Node, portsText(in), image}
		})
}

func composeDownCmd(c *cli) *cobra.Command {
	var f composeFlags
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Remove every instance of the project and wait until they are gone",
		Args:  nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := f.load(cmd.Context())
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			list, err := projectInstances(cmd.Context(), cl, p.Name)
			if err != nil {
				return err
			}
			n, err := removeAll(cmd.Context(), cl, list, timeout)
			fmt.Fprintf(c.stdout, "project %s: %d instances removed\n", p.Name, n)
			return err
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the instances to be gone")
	return cmd
}

// removeAll deletes the instances and waits, up to timeout, until none of
// them is left (deleted or gone); it returns how many it removed.
func removeAll(ctx context.Context, cl *client.Client, list []control.Instance, timeout time.Duration) (int, error) {
	for _, in := range list {
		if _, err := cl.Delete(ctx, in.ID); err != nil && !isNotFound(err) {
			return 0, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, in := range list {
		for {
			got, err := cl.Instance(ctx, in.ID)
			if isNotFound(err) || (err == nil && got.Phase == reconciler.Deleted) {
				break
			}
			if err != nil && ctx.Err() == nil {
				return 0, err
			}
			select {
			case <-ctx.Done():
				return 0, driver.Errorf(driver.ErrTimeout, "instance %s is still %s after %s", in.ID, got.Phase, timeout)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return len(list), nil
}

func isNotFound(err error) bool { return err != nil && errors.Is(err, driver.ErrNotFound) }

func groupCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "group",
		Short: "List, inspect and remove groups",
		Args:  nArgs(0, 0),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the groups and their instances",
		Args:  nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			list, err := cl.Instances(cmd.Context(), control.Filter{})
			if err != nil {
				return err
			}
			type groupRow struct {
				ID        string `json:"id"`
				Project   string `json:"project,omitempty"`
				Instances int    `json:"instances"`
				Running   int    `json:"running"`
			}
			by := map[string]*groupRow{}
			var rows []groupRow
			for _, in := range list {
				if in.Group == "" {
					continue
				}
				g, ok := by[in.Group]
				if !ok {
					g = &groupRow{ID: in.Group}
					if in.Spec != nil {
						g.Project = in.Spec.Labels[compose.LabelProject]
					}
					by[in.Group] = g
				}
				g.Instances++
				if in.Phase == reconciler.Running {
					g.Running++
				}
			}
			for _, g := range by {
				rows = append(rows, *g)
			}
			slices.SortFunc(rows, func(a, b groupRow) int { return strings.Compare(a.ID, b.ID) })
			return printList(c.stdout, asJSON, rows, []string{"GROUP", "PROJECT", "INSTANCES", "RUNNING"},
				func(g groupRow) []any { return []any{g.ID, g.Project, g.Instances, g.Running} })
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	inspect := &cobra.Command{
		Use:   "inspect GROUP",
		Short: "Show a group's state and its services' counts as JSON",
		Args:  nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			g, err := cl.Group(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(c.stdout, g)
		},
	}
	var timeout time.Duration
	rm := &cobra.Command{
		Use:   "rm GROUP",
		Short: "Remove every instance of a group and wait until they are gone",
		Args:  nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			list, err := cl.Instances(cmd.Context(), control.Filter{Group: args[0]})
			if err != nil {
				return err
			}
			if len(list) == 0 {
				if _, err := cl.Group(cmd.Context(), args[0]); err != nil {
					return err
				}
			}
			n, err := removeAll(cmd.Context(), cl, list, timeout)
			fmt.Fprintf(c.stdout, "group %s: %s instances removed\n", args[0], strconv.Itoa(n))
			return err
		},
	}
	rm.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the instances to be gone")
	cmd.AddCommand(ls, inspect, rm)
	return cmd
}
