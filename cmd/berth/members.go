package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/client"
)

func membersCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "members",
		Short: "List, add and remove the etcd members of a highly available cluster",
		Long: `A highly available cluster keeps its state in etcd: each server started with
--etcd-name runs a member. "add" registers a new member's peer URL; start its
server next with --etcd-initial-cluster-state existing and an
--etcd-initial-cluster that lists every member. "remove" takes a member out
(stop its server first). Listing needs a reader token, changes an admin one.`,
		Args: nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	list := &cobra.Command{Use: "list", Aliases: []string{"ls"}, Short: "List the members"}
	listCmd(c, list, []string{"ID", "NAME", "PEER URLS", "CLIENT URLS"},
		func(ctx context.Context, cl *client.Client) ([]api.Member, error) { return cl.Members(ctx) },
		func(m api.Member) []any {
			name := m.Name
			if name == "" {
				name = "(not started)"
			}
			return []any{m.ID, name, strings.Join(m.PeerURLs, ","), strings.Join(m.ClientURLs, ",")}
		})
	add := &cobra.Command{
		Use:   "add PEER-URL",
		Short: "Register a new member by its peer URL",
		Args:  nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			m, err := cl.AddMember(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "%s\n", m.ID)
			fmt.Fprintf(c.stderr, "member %s added; start its server with --etcd-initial-cluster-state existing\n", m.ID)
			return nil
		},
	}
	rm := &cobra.Command{
		Use:     "remove ID",
		Aliases: []string{"rm"},
		Short:   "Remove a member (stop its server first)",
		Args:    nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			return cl.RemoveMember(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(list, add, rm)
	return cmd
}
