package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
)

// dockerCommands are the verbs added for Docker's habits: compose, group
// and version.
func dockerCommands(c *cli) []*cobra.Command {
	return []*cobra.Command{composeCmd(c), groupCmd(c), versionCmd(c)}
}

// seconds is a duration flag that takes whole seconds, as docker stop -t
// does, or a Go duration ("1m30s").
type seconds time.Duration

func (s *seconds) String() string {
	if *s == 0 {
		return ""
	}
	return time.Duration(*s).String()
}

func (s *seconds) Set(v string) error {
	if n, err := strconv.Atoi(v); err == nil {
		if n < 0 {
			return fmt.Errorf("%d: must not be negative", n)
		}
		*s = seconds(time.Duration(n) * time.Second)
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return fmt.Errorf("%q: want whole seconds or a duration such as 1m", v)
	}
	*s = seconds(d)
	return nil
}

func (s *seconds) Type() string { return "seconds" }

// logOptions turns the logs flags into options; skip is set when there is
// nothing to print (--tail 0 without --follow).
func logOptions(follow bool, tail int, onlyOut, onlyErr bool) (opts driver.LogOptions, skip bool, err error) {
	opts = driver.LogOptions{Follow: follow, Stdout: !onlyErr, Stderr: !onlyOut}
	switch {
	case tail < -1:
		return opts, false, usagef("--tail %d: want a number of lines, 0 or more", tail)
	case tail == 0 && follow:
		return opts, false, usagef("--tail 0 --follow: the back-ends cannot skip what was written before; use --tail 1")
	case tail == 0:
		return opts, true, nil
	case tail > 0:
		opts.Tail = tail
	}
	return opts, false, nil
}

// eventPrinter prints events one line each, with the time it received
// them, and leaves out an event that shows nothing new of its instance or
// node.
type eventPrinter struct {
	w    io.Writer
	last map[string]string // line printed last, by instance or node
	now  func() time.Time
}

func newEventPrinter(w io.Writer) *eventPrinter {
	return &eventPrinter{w: w, last: map[string]string{}, now: time.Now}
}

func (p *eventPrinter) print(ev control.Event) {
	var key, line string
	switch {
	case ev.Instance != nil:
		in := ev.Instance
		key = "i/" + in.ID
		if ev.Deleted {
			line = fmt.Sprintf("instance %s %s removed", in.ID, in.Name)
		} else {
			line = strings.TrimRight(fmt.Sprintf("instance %s %s %s %s %s %s", in.ID, in.Name, in.Phase, in.Provider, in.Node, in.Message), " ")
		}
	case ev.Node != nil:
		key = "n/" + ev.Node.Provider + "/" + ev.Node.Name
		line = strings.TrimRight(fmt.Sprintf("node %s/%s %s %s", ev.Node.Provider, ev.Node.Name, ev.Node.Status, ev.Node.Reason), " ")
	default:
		return
	}
	if p.last[key] == line {
		return
	}
	p.last[key] = line
	if ev.Deleted {
		delete(p.last, key)
	}
	fmt.Fprintf(p.w, "%s %d %s\n", p.now().UTC().Format(time.RFC3339), ev.Revision, line)
}

// nodeImage is an image on one node, for images --json.
type nodeImage struct {
	Provider string `json:"provider"`
	Node     string `json:"node"`
	driver.Image
}

// clusterImagesCmd lists the images of every node that lists images, or
// of one provider or node.
func clusterImagesCmd(c *cli) *cobra.Command {
	var prov, node string
	cmd := listCmd(c, &cobra.Command{Use: "images [--provider P] [--node N]", Short: "List the images present on the cluster's nodes"},
		[]string{"PROVIDER", "NODE", "IMAGE", "ID", "SIZE", "CREATED"},
		func(ctx context.Context, cl *client.Client) ([]nodeImage, error) {
			return clusterImages(ctx, cl, prov, node)
		},
		func(im nodeImage) []any {
			return []any{im.Provider, im.Node, im.Name, truncate(im.ID, 19), im.Size, ago(im.Created)}
		})
	cmd.Flags().StringVar(&prov, "provider", "", "only this provider")
	cmd.Flags().StringVar(&node, "node", "", "only this node (needs --provider)")
	return cmd
}

func clusterImages(ctx context.Context, cl *client.Client, prov, node string) ([]nodeImage, error) {
	if node != "" && prov == "" {
		return nil, usagef("--node needs --provider")
	}
	provs, err := cl.Providers(ctx)
	if err != nil {
		return nil, err
	}
	lists := map[string]bool{}
	for _, p := range provs {
		lists[p.Name] = slices.Contains(p.Capabilities, driver.CapImages)
	}
	if prov != "" {
		if _, ok := lists[prov]; !ok {
			return nil, driver.Errorf(driver.ErrNotFound, "provider %q", prov)
		}
		if !lists[prov] {
			return nil, driver.Errorf(driver.ErrUnsupported, "provider %s does not list images", prov)
		}
	}
	nodes, err := cl.Nodes(ctx, prov)
	if err != nil {
		return nil, err
	}
	out := []nodeImage{}
	for _, n := range nodes {
		if !lists[n.Provider] || (node != "" && n.Name != node) || n.Status != driver.NodeOnline {
			continue
		}
		imgs, err := cl.Images(ctx, n.Provider, n.Name)
		if err != nil {
			return nil, fmt.Errorf("images of %s/%s: %w", n.Provider, n.Name, err)
		}
		for _, im := range imgs {
			out = append(out, nodeImage{Provider: n.Provider, Node: n.Name, Image: im})
		}
	}
	return out, nil
}

// versionCmd prints the client's version and the server's.
func versionCmd(c *cli) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the client's and the server's versions",
		Args:  nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			v := struct {
				Client string `json:"client"`
				Server string `json:"server,omitempty"`
				Error  string `json:"server_error,omitempty"`
			}{Client: api.BuildVersion()}
			cl, err := c.client()
			if err != nil {
				return err
			}
			sv, serr := cl.Version(cmd.Context())
			if serr == nil {
				v.Server = sv.Version
			} else {
				v.Error = serr.Error()
			}
			if asJSON {
				if err := printJSON(c.stdout, v); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(c.stdout, "Client: %s\n", v.Client)
				if serr == nil {
					fmt.Fprintf(c.stdout, "Server: %s (%s)\n", v.Server, c.addr)
				}
			}
			return serr
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// unreachable reports whether err is a failed dial of the server: nothing
// answered at its address.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.Is(err, driver.ErrRetryable) && errors.As(err, &op) && op.Op == "dial"
}

// portsText is the PORTS column: host:port->port/proto, as docker ps.
func portsText(in control.Instance) string {
	var out []string
	if in.Observed != nil && len(in.Observed.Ports) > 0 {
		for _, p := range in.Observed.Ports {
			out = append(out, fmt.Sprintf("%s:%d->%d/%s", p.HostIP, p.HostPort, p.ContainerPort, p.Protocol))
		}
		return strings.Join(out, ", ")
	}
	if in.Spec != nil {
		for _, p := range in.Spec.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = "tcp"
			}
			if p.HostPort != 0 {
				out = append(out, fmt.Sprintf("%d->%d/%s", p.HostPort, p.ContainerPort, proto))
			} else {
				out = append(out, fmt.Sprintf("%d/%s", p.ContainerPort, proto))
			}
		}
	}
	return strings.Join(out, ", ")
}

// removeWhenEnded waits until every instance of ans has ended (exited,
// stopped or failed), or ctx ends, then removes them all and waits until
// they are gone (run --rm). It reports an instance that failed or exited
// with a code other than 0 as an error.
func (c *cli) removeWhenEnded(ctx context.Context, cl *client.Client, ans *control.Answer) error {
	var list []control.Instance
	var errs []error
	for _, p := range ans.Instances {
		in, err := waitEnded(ctx, cl, p.Instance.ID)
		if err != nil {
			if ctx.Err() == nil {
				errs = append(errs, err)
			}
			list = append(list, p.Instance)
			continue
		}
		list = append(list, in)
		switch {
		case in.Phase == reconciler.Failed:
			errs = append(errs, fmt.Errorf("instance %s failed: %s", in.ID, in.Message))
		case in.Observed != nil && in.Observed.ExitCode != nil && *in.Observed.ExitCode != 0:
			errs = append(errs, fmt.Errorf("instance %s exited with code %d", in.ID, *in.Observed.ExitCode))
		}
	}
	// Removed also when interrupted: --rm leaves nothing behind.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if _, err := removeAll(rctx, cl, list, 2*time.Minute); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// waitEnded polls the instance id until it has ended.
func waitEnded(ctx context.Context, cl *client.Client, id string) (control.Instance, error) {
	for {
		in, err := cl.Instance(ctx, id)
		if err != nil {
			return control.Instance{}, err
		}
		switch in.Phase {
		case reconciler.Exited, reconciler.Stopped, reconciler.Failed, reconciler.Deleting, reconciler.Deleted:
			return *in, nil
		}
		select {
		case <-ctx.Done():
			return *in, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
