package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

func clientCommands(c *cli) []*cobra.Command {
	withRefs := []*cobra.Command{
		inspectCmd(c), logsCmd(c),
		changeCmd(c, "stop", "Stop instances gracefully"),
		changeCmd(c, "start", "Start stopped instances"),
		changeCmd(c, "restart", "Restart instances"),
		changeCmd(c, "suspend", "Pause running instances: they keep their node and memory but use no cpu"),
		changeCmd(c, "resume", "Continue suspended instances"),
		holdCmd(c), statsCmd(c), attachCmd(c), execCmd(c),
		killCmd(c), rmCmd(c), resizeCmd(c), renameCmd(c), whyCmd(c),
	}
	for _, cmd := range withRefs {
		cmd.ValidArgsFunction = c.completeInstances
	}
	return append(withRefs, runCmd(c), planCmd(c), psCmd(c),
		nodesCmd(c), adviseCmd(c), rebalanceCmd(c), providersCmd(c), imagesCmd(c), preloadCmd(c), eventsCmd(c), driversCmd(c), quotasCmd(c), doctorCmd(c))
}

// completeInstances offers the names of the server's instances for shell
// completion.
func (c *cli) completeInstances(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	cl, err := c.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
	defer cancel()
	list, err := cl.Instances(ctx, control.Filter{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []cobra.Completion
	for _, in := range list {
		name := in.Name
		if name == "" {
			name = in.ID
		}
		if strings.HasPrefix(name, toComplete) {
			out = append(out, cobra.CompletionWithDesc(name, string(in.Phase)))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// printJSON writes v as indented JSON in Berth's output convention (sizes
// as integers of bytes; driver.MarshalOutput).
func printJSON(w io.Writer, v any) error {
	b, err := driver.MarshalOutputIndent(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// printJSONLine writes v as one line of JSON, for outputs of one object per
// line (events, stats, progress), in the same convention as printJSON.
func printJSONLine(w io.Writer, v any) error {
	b, err := driver.MarshalOutput(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func table(w io.Writer, header ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	return tw
}

// printList prints list as JSON when asJSON is set (an empty list as []),
// else as a table of header and one row of cells per item.
func printList[T any](w io.Writer, asJSON bool, list []T, header []string, cells func(T) []any) error {
	if asJSON {
		if list == nil {
			list = []T{}
		}
		return printJSON(w, list)
	}
	tw := table(w, header...)
	for _, v := range list {
		row(tw, cells(v)...)
	}
	return tw.Flush()
}

// listCmd completes cmd as a list verb with no arguments: it fetches the
// list through the API and prints it with printList, adding --json.
func listCmd[T any](c *cli, cmd *cobra.Command, header []string, fetch func(context.Context, *client.Client) ([]T, error), cells func(T) []any) *cobra.Command {
	var asJSON bool
	cmd.Args = nArgs(0, 0)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := c.client()
		if err != nil {
			return err
		}
		list, err := fetch(cmd.Context(), cl)
		if err != nil {
			return err
		}
		return printList(c.stdout, asJSON, list, header, cells)
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func row(tw *tabwriter.Writer, cols ...any) {
	s := make([]string, len(cols))
	for i, c := range cols {
		if b, ok := c.(driver.Bytes); ok {
			s[i] = b.Human()
		} else {
			s[i] = fmt.Sprint(c)
		}
		if s[i] == "" {
			s[i] = "-"
		}
	}
	fmt.Fprintln(tw, strings.Join(s, "\t"))
}

// specFlags are the Docker-like flags shared by run and plan.
type specFlags struct {
	name, cpus, memory, kind, typ, restart, provider, image, workdir, strategy string
	entrypoint, user, group                                                    string
	env, ports, volumes, labels, constraints, affinities                       []string
	count                                                                      int
	priority                                                                   int
}

func (s *specFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&s.name, "name", "", "instance name (a request of --count N names its instances NAME-i)")
	fl.StringVar(&s.cpus, "cpus", "", "cpus, e.g. 0.5 or 500m")
	fl.StringVarP(&s.memory, "memory", "m", "", "memory, e.g. 512m or 1G (Docker's units, binary in either case) or 512Mi; a bare number is MiB")
	fl.StringVar(&s.kind, "kind", "", "container, process, vm or baremetal (default: process without an image, else container)")
	fl.StringVar(&s.typ, "type", "", "service (spread) or batch (pack)")
	fl.StringVar(&s.restart, "restart", "", "restart policy: no, always, unless-stopped, on-failure[:N]")
	fl.StringVar(&s.provider, "provider", "", "provider to place on (default any)")
	fl.StringVar(&s.workdir, "workdir", "", "working directory")
	fl.StringVarP(&s.user, "user", "u", "", "run as this user: a name or a numeric id")
	fl.StringVar(&s.group, "group", "", "run as this group: a name or a numeric id (default the user's)")
	fl.StringVar(&s.entrypoint, "entrypoint", "", "replace the image's entry point")
	fl.StringVar(&s.strategy, "strategy", "", "placement strategy: binpack, spread, random, waterfill, average")
	fl.StringArrayVarP(&s.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.StringArrayVarP(&s.ports, "publish", "p", nil, "port [HOST_IP:][HOST_PORT:]CONTAINER_PORT[/PROTO] (repeatable)")
	fl.StringArrayVarP(&s.volumes, "volume", "v", nil, "volume SOURCE:TARGET[:ro] (repeatable)")
	fl.StringArrayVarP(&s.labels, "label", "l", nil, "label KEY=VALUE (repeatable)")
	fl.StringArrayVar(&s.constraints, "constraint", nil, "node constraint, e.g. disk==ssd or zone!=~eu-1 (repeatable)")
	fl.StringArrayVar(&s.affinities, "affinity", nil, "affinity to instances, e.g. image==redis (repeatable)")
	fl.IntVar(&s.count, "count", 0, "number of instances (default 1)")
	fl.IntVar(&s.priority, "priority", 0, "queue priority (higher first)")
}

// request builds the request from the flags and the arguments
// [IMAGE] [-- COMMAND ARGS...].
func (s *specFlags) request(cmd *cobra.Command, args []string) (scheduler.Request, error) {
	var r scheduler.Request
	dash := cmd.ArgsLenAtDash()
	switch {
	case dash == 0:
		r.Command = args
	case dash > 1:
		return r, usagef("give at most one image before --, got %q", args[:dash])
	case len(args) > 0:
		r.Image, r.Command = args[0], args[1:]
	}
	if len(r.Command) == 0 {
		r.Command = nil
	}
	r.Name = s.name
	r.Kind = driver.Kind(s.kind)
	if r.Kind == "" && r.Image == "" {
		r.Kind = driver.KindProcess
	}
	r.Type = driver.WorkloadType(s.typ)
	r.Provider = s.provider
	r.WorkingDir = s.workdir
	r.User, r.Group = s.user, s.group
	r.Strategy = scheduler.Strategy(s.strategy)
	r.Count = s.count
	r.Priority = s.priority
	r.Constraints = s.constraints
	r.Affinities = s.affinities
	if s.entrypoint != "" {
		r.Entrypoint = []string{s.entrypoint}
	}
	var err error
	if s.cpus != "" {
		if r.CPU, err = driver.ParseCPU(s.cpus); err != nil {
			return r, usagef("--cpus: %v", err)
		}
	}
	if s.memory != "" {
		if r.Memory, err = parseMemory(s.memory); err != nil {
			return r, usagef("--memory: %v", err)
		}
	}
	if r.Env, err = keyValues("--env", s.env); err != nil {
		return r, err
	}
	if r.Labels, err = keyValues("--label", s.labels); err != nil {
		return r, err
	}
	for _, p := range s.ports {
		port, err := parsePort(p)
		if err != nil {
			return r, usagef("--publish %q: %v", p, err)
		}
		r.Ports = append(r.Ports, port)
	}
	for _, v := range s.volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && parts[2] != "ro" && parts[2] != "rw") {
			return r, usagef("--volume %q: want SOURCE:TARGET[:ro]", v)
		}
		r.Volumes = append(r.Volumes, driver.Volume{Source: parts[0], Target: parts[1], ReadOnly: len(parts) == 3 && parts[2] == "ro"})
	}
	if s.restart != "" {
		name, n, ok := strings.Cut(s.restart, ":")
		r.RestartPolicy.Name = name
		if ok {
			if r.RestartPolicy.MaxRetries, err = strconv.Atoi(n); err != nil {
				return r, usagef("--restart %q: want on-failure:N", s.restart)
			}
		}
	}
	return r, nil
}

// parseMemory reads --memory as Docker does: a number with b, k, m, g or t
// in either case, optionally followed by b ("512m", "1G", "2gb"), is in
// binary units (1G is 1 GiB). Anything else is read by driver.ParseBytes
// ("512Mi"; a bare number is MiB).
func parseMemory(s string) (driver.Bytes, error) {
	t := strings.TrimSpace(s)
	if m := dockerSize.FindStringSubmatch(t); m != nil {
		mult := map[string]driver.Bytes{"b": 1, "k": driver.KiB, "m": driver.MiB, "g": driver.GiB, "t": driver.TiB}[strings.ToLower(m[2]+m[3])]
		f, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			return 0, fmt.Errorf("size %q: %w", s, err)
		}
		return driver.Bytes(math.Round(f * float64(mult))), nil
	}
	return driver.ParseBytes(t)
}

// dockerSize matches Docker's memory sizes: a number, then b, k, m, g or t
// in either case, then an optional b after k, m, g or t.
var dockerSize = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?) ?(?:([bB])|([kKmMgGtT])[bB]?)$`)

func keyValues(flag string, items []string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(items))
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		if !ok && flag == "--env" && k != "" {
			// Docker's -e KEY passes the variable from this environment.
			if val, set := os.LookupEnv(k); set {
				m[k] = val
				continue
			}
		}
		if !ok || k == "" {
			return nil, usagef("%s %q: want KEY=VALUE", flag, it)
		}
		m[k] = v
	}
	return m, nil
}

// parsePort reads [HOST_IP:][HOST_PORT:]CONTAINER_PORT[/PROTO].
func parsePort(s string) (driver.Port, error) {
	var p driver.Port
	spec, proto, _ := strings.Cut(s, "/")
	p.Protocol = proto
	parts := strings.Split(spec, ":")
	atoi := func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0, fmt.Errorf("%q is not a port number", v)
		}
		return n, nil
	}
	var err error
	switch len(parts) {
	case 1:
		p.ContainerPort, err = atoi(parts[0])
	case 2:
		if p.HostPort, err = atoi(parts[0]); err == nil {
			p.ContainerPort, err = atoi(parts[1])
		}
	case 3:
		p.HostIP = parts[0]
		if parts[1] != "" {
			p.HostPort, err = atoi(parts[1])
		}
		if err == nil {
			p.ContainerPort, err = atoi(parts[2])
		}
	default:
		err = fmt.Errorf("want [HOST_IP:][HOST_PORT:]CONTAINER_PORT[/PROTO]")
	}
	p.Publish = len(parts) > 1
	return p, err
}

func runCmd(c *cli) *cobra.Command {
	var s specFlags
	var asJSON, rm, detach, noWait, interactive, tty bool
	var pool string
	cmd := &cobra.Command{
		Use:   "run [flags] [IMAGE] [-- COMMAND [ARG...]]",
		Short: "Submit a request, print where its instances were placed and wait until they run",
		Example: `  berth run --name hello -- sh -c 'echo hello; sleep 60'
  berth run --name web --cpus 0.5 --memory 256Mi -p 8080:80 nginx:alpine
  berth run --pool ci --label sleeper --count 3     # a node set of a pool's label
  echo hello | berth run -i --rm alpine -- cat       # input through the API
  berth run -it --rm alpine -- sh                    # a shell on a terminal`,
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			if cmd.Flags().Changed("count") && s.count < 1 {
				return usagef("--count %d: want 1 or more", s.count)
			}
			detach = detach || noWait
			if rm && detach {
				return usagef("--rm waits for the instances to end: it does not go with --detach or --no-wait")
			}
			attached := (interactive || tty) && !detach
			if interactive || tty {
				if pool != "" || s.count > 1 {
					return usagef("-i and -t attach to one instance: they go with neither --pool nor --count")
				}
			}
			if pool != "" {
				return c.runPool(cmd, &s, pool, args, asJSON, detach)
			}
			req, err := s.request(cmd, args)
			if err != nil {
				return err
			}
			req.Stdin, req.TTY = interactive, tty
			cl, err := c.client()
			if err != nil {
				return err
			}
			ans, err := cl.Submit(cmd.Context(), req)
			if err != nil {
				return err
			}
			if rm {
				defer func() { err = errors.Join(err, c.removeWhenEnded(cmd.Context(), cl, ans)) }()
			}
			if attached {
				if asJSON {
					if err := printJSON(c.stdout, ans); err != nil {
						return err
					}
				}
				id := ans.Instances[0].Instance.ID
				if err := c.attach(cmd.Context(), cmd, cl, id, interactive, tty, true); err != nil {
					return err
				}
				if rm {
					return nil // removeWhenEnded says how it ended
				}
				in, err := waitEnded(cmd.Context(), cl, id)
				switch {
				case err != nil:
					return err
				case in.Phase == reconciler.Failed:
					return fmt.Errorf("instance %s failed: %s", in.ID, in.Message)
				case in.Observed != nil && in.Observed.ExitCode != nil && *in.Observed.ExitCode != 0:
					return fmt.Errorf("instance %s exited with code %d", in.ID, *in.Observed.ExitCode)
				}
				return nil
			}
			return c.placed(cmd.Context(), cl, ans, ans.Instances, asJSON, detach, control.Filter{Request: ans.Request})
		},
	}
	s.register(cmd)
	cmd.Flags().StringVar(&pool, "pool", "", "ask the pool for --count instances of its --label NAME (ready ones first), as a node set; no image or spec flags")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the answer (instances and their nodes) as JSON")
	cmd.Flags().BoolVar(&rm, "rm", false, "wait until the instances end, then remove them (also on Ctrl-C)")
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "return once the request is accepted, without waiting for its instances to run")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the instances are placed, without waiting for them to run (as -d)")
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "send this input to the instance until its end, and print its output until it ends (keep its input open with -d)")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "run the instance on a terminal; with -i on a terminal, this one is raw and its size follows")
	return cmd
}

// placed prints a submission's answer (as JSON, or its placed instances
// as a table) and, unless detach, waits until the instances f selects run.
func (c *cli) placed(ctx context.Context, cl *client.Client, ans any, ps []control.Placed, asJSON, detach bool, f control.Filter) error {
	if asJSON {
		if err := printJSON(c.stdout, ans); err != nil {
			return err
		}
	} else if err := c.placedTable(ps); err != nil {
		return err
	}
	if detach {
		return nil
	}
	return c.waitRunning(ctx, cl, f, len(ps))
}

// placedTable prints placed instances with their nodes.
func (c *cli) placedTable(ps []control.Placed) error {
	tw := table(c.stdout, "ID", "NAME", "PHASE", "NODE", "ADDRESS", "MESSAGE")
	for _, p := range ps {
		node, addr := "", ""
		if p.Node != nil {
			node, addr = p.Node.ID, p.Node.Address
		}
		row(tw, p.Instance.ID, p.Instance.Name, p.Instance.Phase, node, addr, p.Instance.Message)
	}
	return tw.Flush()
}

// runPool is run --pool: a node set of --count instances of the pool's
// label, named by --name (default "<label>-<random>"), the spec the
// label's.
func (c *cli) runPool(cmd *cobra.Command, s *specFlags, pool string, args []string, asJSON, detach bool) error {
	if len(args) > 0 {
		return usagef("--pool takes the spec of the pool's label: give no image or command")
	}
	fl := cmd.Flags()
	for _, name := range []string{"cpus", "memory", "kind", "type", "restart", "provider", "workdir", "user", "group", "entrypoint", "strategy", "env", "publish", "volume", "constraint", "affinity", "priority"} {
		if fl.Changed(name) {
			return usagef("--%s: --pool takes the spec of the pool's label", name)
		}
	}
	if len(s.labels) != 1 || strings.Contains(s.labels[0], "=") {
		return usagef("--pool needs one --label naming a label of the pool")
	}
	id := s.name
	if id == "" {
		id = scheduler.NewGroupID(s.labels[0])
	}
	g := scheduler.Group{ID: id, Kind: scheduler.KindNodeSet, Pool: pool, Services: []scheduler.Service{
		{Request: scheduler.Request{Spec: driver.Spec{Name: s.labels[0]}, Count: max(s.count, 1)}},
	}}
	cl, err := c.client()
	if err != nil {
		return err
	}
	ans, err := cl.SubmitGroup(cmd.Context(), g)
	if err != nil {
		return err
	}
	return c.placed(cmd.Context(), cl, ans, ans.Instances, asJSON, detach, control.Filter{Group: id})
}

// waitRunning waits, as docker run -d, until every one of the n
// instances f selects runs or has failed. It returns nil when all run (or
// are held, suspended, stopped on request, or ended by themselves with
// exit code 0), else an error naming each that failed, ended with another
// code, or was deleted. A progress line on stderr says how many run and
// where the others are, each time that changes; while instances wait for
// room it says why, once per reason.
func (c *cli) waitRunning(ctx context.Context, cl *client.Client, f control.Filter, n int) error {
	said := map[string]bool{}
	last := ""
	f.All = true
	for {
		list, err := cl.Instances(ctx, f)
		if err != nil {
			return err
		}
		var failed []error
		running, settled := 0, 0
		others := map[reconciler.Phase]int{}
		for _, in := range list {
			switch in.Phase {
			case reconciler.Running, reconciler.Held:
				running++
				settled++
				continue
			case reconciler.Exited, reconciler.Stopped, reconciler.Suspended:
				settled++
				if in.Observed != nil && in.Observed.ExitCode != nil && *in.Observed.ExitCode != 0 && in.Phase == reconciler.Exited {
					failed = append(failed, fmt.Errorf("instance %s exited with code %d", in.ID, *in.Observed.ExitCode))
				}
			case reconciler.Failed:
				settled++
				failed = append(failed, fmt.Errorf("instance %s failed: %s", in.ID, in.Message))
			case reconciler.Deleted:
				settled++
				failed = append(failed, fmt.Errorf("instance %s was deleted before it ran", in.ID))
			case reconciler.Pending:
				if in.Message != "" && !said[in.Message] {
					said[in.Message] = true
					fmt.Fprintf(c.stderr, "waiting: %s\n", in.Message)
				}
			}
			others[in.Phase]++
		}
		if line := progressLine(running, n, others); line != last {
			fmt.Fprintln(c.stderr, line)
			last = line
		}
		if settled >= n && len(list) >= n {
			return errors.Join(failed...)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// progressLine says how many of n instances run and how many are in each
// other phase: "1/3 running, 1 creating, 1 pending".
func progressLine(running, n int, others map[reconciler.Phase]int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d/%d running", running, n)
	for _, ph := range reconciler.Phases {
		if k := others[ph]; k > 0 {
			fmt.Fprintf(&b, ", %d %s", k, ph)
		}
	}
	return b.String()
}

func planCmd(c *cli) *cobra.Command {
	var s specFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "plan [flags] [IMAGE] [-- COMMAND [ARG...]]",
		Short: "Dry run: where would this request go, and why not",
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := s.request(cmd, args)
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			ans, err := cl.Plan(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(c.stdout, ans)
			}
			if len(ans.Placements) > 0 {
				tw := table(c.stdout, "INSTANCE", "NODE", "ADDRESS", "CPUS", "MEMORY")
				for _, p := range ans.Placements {
					row(tw, p.Instance, p.Node.ID, p.Node.Address, p.Node.CPUs, p.Node.Memory)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			if ans.Unplaced > 0 {
				fmt.Fprintf(c.stdout, "%d instance(s) cannot be placed now:\n", ans.Unplaced)
				for _, r := range ans.Reasons {
					fmt.Fprintln(c.stdout, "  "+r)
				}
			}
			return nil
		},
	}
	s.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func psCmd(c *cli) *cobra.Command {
	var f control.Filter
	var phases []string
	var asJSON, quiet bool
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List instances",
		Args:  nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, p := range phases {
				f.Phases = append(f.Phases, control.Phase(p))
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			// Without --limit or --after every page is fetched; with
			// either, one page, and where the next one starts is told.
			var list []control.Instance
			var next string
			if f.Limit != 0 || f.After != "" {
				list, next, err = cl.InstancesPage(cmd.Context(), f)
			} else {
				list, err = cl.Instances(cmd.Context(), f)
			}
			if err != nil {
				return err
			}
			if next != "" {
				fmt.Fprintf(c.stderr, "berth: more instances follow; add --after %s to list them\n", next)
			}
			slices.SortFunc(list, func(a, b control.Instance) int {
				if c := a.Created.Compare(b.Created); c != 0 {
					return c
				}
				return strings.Compare(a.ID, b.ID)
			})
			if quiet && !asJSON {
				for _, in := range list {
					fmt.Fprintln(c.stdout, in.ID)
				}
				return nil
			}
			return printList(c.stdout, asJSON, list, []string{"ID", "NAME", "PHASE", "PROVIDER", "NODE", "WHAT", "PORTS", "CREATED", "MESSAGE"},
				func(in control.Instance) []any {
					return []any{in.ID, in.Name, in.Phase, in.Provider, in.Node, what(in.Spec), portsText(in), ago(in.Created), truncate(in.Message, 60)}
				})
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&f.All, "all", "a", false, "include deleted instances")
	fl.StringVar(&f.Provider, "provider", "", "only this provider")
	fl.StringVar(&f.Node, "node", "", "only this node")
	// --namespace names the namespace to list here, shadowing the global
	// --namespace (where submissions land), which ps has no use for.
	fl.StringVar(&f.Owner, "namespace", "", "only this namespace's instances")
	fl.StringVar(&f.Pool, "pool", "", "only this pool")
	fl.StringVar(&f.Group, "group", "", "only this group")
	fl.StringVar(&f.Request, "request", "", "only this request")
	fl.StringVar(&f.Name, "name", "", "only this name")
	fl.StringSliceVar(&phases, "phase", nil, "only these phases (comma-separated)")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	fl.BoolVarP(&quiet, "quiet", "q", false, "print ids only")
	fl.IntVar(&f.Limit, "limit", 0, "at most N instances, those with the smallest ids (at most 10000)")
	fl.StringVar(&f.After, "after", "", "only instances whose id sorts after this one (where --limit stopped)")
	return cmd
}

func what(s *driver.Spec) string {
	if s == nil {
		return ""
	}
	w := s.Image
	if cmd := slices.Concat(s.Entrypoint, s.Command); len(cmd) > 0 {
		if w != "" {
			w += " "
		}
		w += strings.Join(cmd, " ")
	}
	return truncate(w, 40)
}

func truncate(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func inspectCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect REF...",
		Short: "Show instances as JSON (by id or name)",
		Args:  nArgs(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			var out []*control.Instance
			for _, ref := range args {
				in, err := cl.Instance(cmd.Context(), ref)
				if err != nil {
					return fmt.Errorf("%s: %w", ref, err)
				}
				out = append(out, in)
			}
			return printJSON(c.stdout, out)
		},
	}
	return cmd
}

func logsCmd(c *cli) *cobra.Command {
	var follow, onlyOut, onlyErr bool
	var tail int
	cmd := &cobra.Command{
		Use:   "logs REF",
		Short: "Print an instance's output (stdout to stdout, stderr to stderr)",
		Args:  nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			opts, skip, err := logOptions(follow, tail, onlyOut, onlyErr)
			if err != nil || skip {
				return err
			}
			err = cl.Logs(cmd.Context(), args[0], opts, c.stdout, c.stderr)
			if err != nil && follow && cmd.Context().Err() != nil {
				return nil
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&follow, "follow", "f", false, "keep printing new output")
	fl.IntVar(&tail, "tail", -1, "only the last N lines of each stream (default all; 0 prints none)")
	fl.BoolVar(&onlyOut, "stdout", false, "only stdout")
	fl.BoolVar(&onlyErr, "stderr", false, "only stderr")
	return cmd
}

func changeCmd(c *cli, verb, short string) *cobra.Command {
	var grace time.Duration
	cmd := &cobra.Command{
		Use:   verb + " REF...",
		Short: short,
		Args:  nArgs(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.eachRef(args, func(cl *client.Client, ref string) (err error) {
				switch verb {
				case "stop":
					_, err = cl.Stop(cmd.Context(), ref, grace)
				case "start":
					_, err = cl.Start(cmd.Context(), ref)
				case "restart":
					_, err = cl.Restart(cmd.Context(), ref, grace)
				case "suspend":
					_, err = cl.Suspend(cmd.Context(), ref)
				case "resume":
					_, err = cl.Resume(cmd.Context(), ref)
				}
				return err
			})
		},
	}
	switch verb {
	case "suspend":
		cmd.Aliases = []string{"pause"}
	case "resume":
		cmd.Aliases = []string{"unpause"}
	}
	if verb == "stop" || verb == "restart" {
		cmd.Flags().VarP((*seconds)(&grace), "time", "t", "seconds (or a duration such as 1m) before the instance is forced down (default: the back-end's)")
	}
	return cmd
}

func holdCmd(c *cli) *cobra.Command {
	var d time.Duration
	cmd := &cobra.Command{
		Use:   "hold REF... --for DURATION",
		Short: "Keep running instances for a while, then delete them (holding again moves the expiry)",
		Args:  nArgs(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("for") {
				return usagef("hold needs --for, such as --for 2h")
			}
			return c.eachRef(args, func(cl *client.Client, ref string) error {
				_, err := cl.Hold(cmd.Context(), ref, d)
				return err
			})
		},
	}
	cmd.Flags().DurationVar(&d, "for", 0, "how long to keep them before they are deleted, such as 2h or 90m (at most 720h)")
	return cmd
}

func statsCmd(c *cli) *cobra.Command {
	var noStream, asJSON bool
	cmd := &cobra.Command{
		Use:   "stats REF",
		Short: "Show an instance's measured cpu and memory use, a line a second until interrupted",
		Args:  nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			p := &statsPrinter{w: c.stdout, json: asJSON}
			if noStream {
				st, err := cl.Stats(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return p.print(*st)
			}
			err = cl.StreamStats(cmd.Context(), args[0], p.print)
			if err != nil && cmd.Context().Err() != nil {
				return nil
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&noStream, "no-stream", false, "print one measurement and return")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per measurement")
	return cmd
}

// statsPrinter prints measurements: a header, then a row each, or one
// JSON object per line.
type statsPrinter struct {
	w       io.Writer
	json    bool
	started bool
}

const statsRow = "%-20s  %-10s  %6s  %9s  %10s  %12s  %s\n"

func (p *statsPrinter) print(st api.Stats) error {
	if p.json {
		return printJSONLine(p.w, st)
	}
	if !p.started {
		p.started = true
		fmt.Fprintf(p.w, statsRow, "NAME", "PHASE", "CPUS", "CPU LIMIT", "MEMORY", "MEMORY LIMIT", "TIME")
	}
	name := st.Name
	if name == "" {
		name = st.ID
	}
	_, err := fmt.Fprintf(p.w, statsRow, truncate(name, 20), st.Phase, st.CPUs, limit(st.CPULimit),
		driver.Bytes(st.MemoryBytes).Human(), limitBytes(st.MemoryLimitBytes), st.Time.Local().Format(time.TimeOnly))
	return err
}

// limitBytes writes a memory limit for people, ∞ for none.
func limitBytes(n int64) string {
	if n == 0 {
		return "∞"
	}
	return driver.Bytes(n).Human()
}

// eachRef calls fn for every reference in refs, printing each reference
// that succeeds and the error of each that fails, and returns the first
// error (already reported).
func (c *cli) eachRef(refs []string, fn func(cl *client.Client, ref string) error) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var first error
	for _, ref := range refs {
		if err := fn(cl, ref); err != nil {
			fmt.Fprintf(c.stderr, "berth: %s: %v\n", ref, err)
			if first == nil {
				first = reported{err}
			}
			continue
		}
		fmt.Fprintln(c.stdout, ref)
	}
	return first
}

// reported is an error already printed per argument; run prints only a
// summary for it.
type reported struct{ error }

func (r reported) Unwrap() error { return r.error }

func killCmd(c *cli) *cobra.Command {
	var sig string
	cmd := &cobra.Command{
		Use:   "kill REF...",
		Short: "Send a signal to instances (default KILL)",
		Args:  nArgs(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.eachRef(args, func(cl *client.Client, ref string) error {
				_, err := cl.Kill(cmd.Context(), ref, sig)
				return err
			})
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", api.DefaultSignal, "signal name or number")
	return cmd
}

func rmCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "rm REF...",
		Aliases: []string{"delete"},
		Short:   "Delete instances (the back-end resource is removed)",
		Args:    nArgs(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.eachRef(args, func(cl *client.Client, ref string) error {
				_, err := cl.Delete(cmd.Context(), ref)
				return err
			})
		},
	}
	cmd.Flags().BoolP("force", "f", false, "accepted for Docker compatibility; rm always removes running instances")
	return cmd
}

func resizeCmd(c *cli) *cobra.Command {
	var cpus, memory string
	cmd := &cobra.Command{
		Use:   "resize REF --cpus N --memory SIZE",
		Short: "Change a running instance's cpu and memory limits",
		Args:  nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r driver.Resources
			var err error
			if cpus == "" && memory == "" {
				return usagef("give --cpus, --memory or both")
			}
			if cpus != "" {
				if r.CPU, err = driver.ParseCPU(cpus); err != nil {
					return usagef("--cpus: %v", err)
				}
			}
			if memory != "" {
				if r.Memory, err = parseMemory(memory); err != nil {
					return usagef("--memory: %v", err)
				}
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			in, err := cl.Resize(cmd.Context(), args[0], r)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "%s: cpus %s, memory %s\n", in.ID, in.Spec.CPU, in.Spec.Memory)
			return nil
		},
	}
	cmd.Flags().StringVar(&cpus, "cpus", "", "new cpu limit")
	cmd.Flags().StringVarP(&memory, "memory", "m", "", "new memory limit")
	return cmd
}

func renameCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "rename REF NAME",
		Short: "Rename an instance, and its back-end resource with it",
		Args:  nArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			in, err := cl.Rename(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "%s: %s\n", in.ID, in.Name)
			return nil
		},
	}
}

func nodesCmd(c *cli) *cobra.Command {
	var prov string
	cmd := listCmd(c, &cobra.Command{Use: "nodes", Short: "List every provider's nodes with Berth's reservations and measured use"},
		[]string{"PROVIDER", "NODE", "STATUS", "ADDRESS", "CPUS", "MEMORY", "BERTH CPUS", "BERTH MEMORY", "USED CPUS", "USED MEMORY", "INSTANCES", "OVERCOMMIT"},
		func(ctx context.Context, cl *client.Client) ([]control.NodeView, error) { return cl.Nodes(ctx, prov) },
		func(n control.NodeView) []any {
			var usedCPU, usedMem any = "", ""
			if m := n.Measured; m != nil {
				usedCPU, usedMem = m.CPU, driver.Bytes(m.MemoryBytes)
			}
			return []any{n.Provider, n.Name, n.Status, n.Address, n.Capacity.CPU, n.Capacity.Memory, n.Berth.CPU, n.Berth.Memory,
				usedCPU, usedMem, n.BerthCount, n.Overcommit}
		})
	cmd.Flags().StringVar(&prov, "provider", "", "only this provider")
	return cmd
}

func adviseCmd(c *cli) *cobra.Command {
	var f control.Filter
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "advise [--provider P] [--group G] [--namespace NS] [--json]",
		Short: "List running instances whose reservation is far from their measured use, with a suggested size",
		Long: `Advise compares what each running instance reserves with what it was measured
to use (the 95th percentile of the recent samples, plus 20 %) and lists those
reserving twice what they use, or half: with the size to reserve instead, the
sums per group, and what the cluster would get back in all.`,
		Args: nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			ans, err := cl.Advice(cmd.Context(), f)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(c.stdout, ans)
			}
			mem := func(s control.Size) string { return driver.Bytes(s.MemoryBytes).Human() }
			tw := table(c.stdout, "INSTANCE", "GROUP", "NODE", "RESERVED", "USED (P95)", "SUGGESTED", "SAMPLES")
			for _, a := range ans.Instances {
				row(tw, a.Instance, a.Group, a.Provider+"/"+a.Node, fmt.Sprintf("%s cpus, %s", a.Reserved.CPUs, mem(a.Reserved)),
					fmt.Sprintf("%s cpus, %s", a.Used.CPUs, mem(a.Used)), fmt.Sprintf("%s cpus, %s", a.Suggested.CPUs, mem(a.Suggested)), a.Samples)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, g := range ans.Groups {
				fmt.Fprintf(c.stdout, "group %s: %d instances reserve %s cpus, %s; suggested %s cpus, %s\n", g.Group, g.Instances,
					g.Reserved.CPUs, mem(g.Reserved), g.Suggested.CPUs, mem(g.Suggested))
			}
			if ans.Advised > len(ans.Instances) {
				fmt.Fprintf(c.stdout, "(the %d of %d that give back the most cpu)\n", len(ans.Instances), ans.Advised)
			}
			fmt.Fprintf(c.stdout, "the cluster would get back %s cpus and %s\n", ans.Saves.CPUs, mem(ans.Saves))
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.Provider, "provider", "", "only this provider")
	fl.StringVar(&f.Group, "group", "", "only this group")
	fl.StringVar(&f.Owner, "namespace", "", "only this namespace (of those the token sees)")
	fl.BoolVar(&asJSON, "json", false, "print the answer as JSON")
	return cmd
}

func providersCmd(c *cli) *cobra.Command {
	cmd := listCmd(c, &cobra.Command{Use: "providers", Short: "List providers with their health and circuit breaker state, and the scheduler's counts"},
		[]string{"NAME", "DRIVER", "BREAKER", "FAILURES", "NODES", "CAPABILITIES", "ERROR"},
		func(ctx context.Context, cl *client.Client) ([]control.ProviderView, error) { return cl.Providers(ctx) },
		func(p control.ProviderView) []any {
			errText := p.Error
			if errText == "" {
				errText = p.Health.LastError
			}
			return []any{p.Name, p.Driver, p.Health.Breaker, p.Health.ConsecutiveFailures, p.Nodes, strings.Join(p.Capabilities, ","), truncate(errText, 60)}
		})
	list := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := list(cmd, args); err != nil {
			return err
		}
		if asJSON, _ := cmd.Flags().GetBool("json"); asJSON {
			return nil
		}
		cl, err := c.client()
		if err != nil {
			return err
		}
		st, err := cl.Scheduler(cmd.Context())
		if err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "\nschedulers: %d, placements committed: %d, conflicts: %d\n", st.Schedulers, st.Committed, st.Conflicts)
		return nil
	}
	return cmd
}

func imagesCmd(c *cli) *cobra.Command { return clusterImagesCmd(c) }

func preloadCmd(c *cli) *cobra.Command {
	var prov string
	var nodes []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "preload --provider P IMAGE",
		Short: "Make an image present on a provider's nodes, with progress",
		Args:  nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			progress := preloadPrinter(c, asJSON)
			err = cl.Preload(cmd.Context(), prov, args[0], nodes, progress.update)
			progress.finish()
			if err == nil && !asJSON {
				fmt.Fprintf(c.stdout, "%s is present on the requested nodes of %s\n", args[0], prov)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&prov, "provider", "", "provider (required)")
	cmd.Flags().StringSliceVar(&nodes, "node", nil, "nodes (default all; comma-separated or repeated)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each progress step as a JSON line")
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		if prov == "" {
			return usagef("preload needs --provider")
		}
		return nil
	}
	return cmd
}

// progressPrinter shows preload progress: a bar per node on a terminal,
// one line per step otherwise, JSON lines with --json.
type progressPrinter struct {
	c      *cli
	json   bool
	bar    *progressbar.ProgressBar
	nodes  map[string]bool
	status string
}

func preloadPrinter(c *cli, asJSON bool) *progressPrinter {
	p := &progressPrinter{c: c, json: asJSON, nodes: map[string]bool{}}
	if f, ok := c.stderr.(*os.File); ok && !asJSON && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions64(-1, progressbar.OptionSetWriter(c.stderr), progressbar.OptionShowBytes(true),
			progressbar.OptionSetDescription("preload"), progressbar.OptionClearOnFinish())
	}
	return p
}

func (p *progressPrinter) update(pr driver.PreloadProgress) {
	switch {
	case p.json:
		_ = printJSONLine(p.c.stdout, pr)
	case p.bar != nil:
		if pr.Total > 0 {
			p.bar.ChangeMax64(pr.Total)
			_ = p.bar.Set64(pr.Current)
		}
		p.bar.Describe(fmt.Sprintf("%s %s", pr.Node, pr.Status))
	default:
		line := fmt.Sprintf("%s: %s %s", pr.Node, pr.Image, pr.Status)
		if pr.Total > 0 {
			line += fmt.Sprintf(" %d/%d", pr.Current, pr.Total)
		}
		if pr.Err != "" {
			line += ": " + pr.Err
		}
		if line != p.status {
			fmt.Fprintln(p.c.stderr, line)
			p.status = line
		}
	}
}

func (p *progressPrinter) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

func eventsCmd(c *cli) *cobra.Command {
	var since int64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Stream changes of instances and nodes until interrupted",
		Args:  nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			p := newEventPrinter(c.stdout)
			err = cl.Events(cmd.Context(), since, func(ev control.Event) {
				if asJSON {
					_ = printJSONLine(c.stdout, ev)
					return
				}
				p.print(ev)
			})
			if cmd.Context().Err() != nil {
				return nil
			}
			return err
		},
	}
	cmd.Flags().Int64Var(&since, "since", 0, "start after this store revision (0: from now)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per event")
	return cmd
}

func driversCmd(c *cli) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "drivers",
		Short: "List the server's registered drivers and their options",
		Args:  nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			list, err := cl.Drivers(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(c.stdout, list)
			}
			for i, d := range list {
				if i > 0 {
					fmt.Fprintln(c.stdout)
				}
				flag := func(o driver.Option) string { return "--" + driver.FlagName(d.Name, o) }
				if d.Plugin != "" {
					// A plugin's options are set in its provider's options.options.
					fmt.Fprintf(c.stdout, "%s %s (plugin %s, provider %s): %s\n", d.Name, d.Version, d.Plugin, d.Provider, d.Summary)
					flag = func(driver.Option) string { return "-" }
				} else {
					fmt.Fprintf(c.stdout, "%s: %s\n", d.Name, d.Summary)
				}
				tw := table(c.stdout, "  OPTION", "TYPE", "DEFAULT", "RANGE", "FLAG", "HELP")
				for _, o := range d.Options {
					row(tw, "  "+o.Name, o.Type, o.Default, o.Range, flag(o), o.Help)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func quotasCmd(c *cli) *cobra.Command {
	return listCmd(c, &cobra.Command{Use: "quotas", Short: "List quotas and their use"},
		[]string{"SCOPE", "NAME", "INSTANCES", "CPUS", "MEMORY"},
		func(ctx context.Context, cl *client.Client) ([]control.QuotaUse, error) { return cl.Quotas(ctx) },
		func(q control.QuotaUse) []any {
			scope, name := "owner", q.Owner
			if q.Provider != "" {
				scope, name = "provider", q.Provider
			} else if q.Pool != "" {
				scope, name = "pool", q.Pool
			}
			return []any{scope, name, fmt.Sprintf("%d/%s", q.UsedInstances, limit(q.Instances)),
				fmt.Sprintf("%s/%s", q.UsedCPU, limit(q.CPU)), fmt.Sprintf("%s/%s", q.UsedMemory, limit(q.Memory))}
		})
}

func limit[T comparable](v T) string {
	var zero T
	if v == zero {
		return "∞"
	}
	return fmt.Sprint(v)
}

func doctorCmd(c *cli) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Show what the server found wrong with its data: the stored records it moved aside (admin)",
		Args:  nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			d, err := cl.Doctor(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(c.stdout, d)
			}
			if len(d.Quarantined) == 0 {
				fmt.Fprintln(c.stdout, "no stored record was moved aside")
				return nil
			}
			fmt.Fprintf(c.stdout, "%d stored records could not be read and were moved aside; their bytes are kept under the key shown\n", len(d.Quarantined))
			tw := table(c.stdout, "KEY", "KEPT AS", "BYTES", "TIME", "REASON")
			for _, q := range d.Quarantined {
				row(tw, q.Key, q.QuarantineKey, q.Bytes, q.Time.Format(time.RFC3339), q.Reason)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
