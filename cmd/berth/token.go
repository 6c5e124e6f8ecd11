package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
)

// Environment variables of the client verbs.
const (
	EnvToken     = "BERTH_TOKEN"
	EnvNamespace = "BERTH_NAMESPACE"
)

// resolveToken returns the token to send to the server at addr: flag when
// set, else $BERTH_TOKEN, else, when addr is on this host, the admin token
// the server wrote in its default data directory (so a local --dev server
// needs no setup). It returns "" when there is none: the server then says
// a token is required.
func resolveToken(addr, flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if t := os.Getenv(EnvToken); t != "" {
		return t, nil
	}
	if !loopbackAddr(addr) {
		return "", nil
	}
	dir, err := devDataDir()
	if err != nil {
		return "", nil
	}
	b, err := os.ReadFile(filepath.Join(dir, auth.BootstrapFile))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// loopbackAddr reports whether addr (host:port or a URL) names this host's
// loopback interface.
func loopbackAddr(addr string) bool {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func tokenCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke API tokens (admin)",
		Long: `Create, list and revoke the bearer tokens of the API. Each token has a name,
a role (reader, operator or admin), the namespaces it acts in and an expiry.
The secret is printed once, when the token is created: keep it.`,
		Args: nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(tokenCreateCmd(c), tokenListCmd(c), tokenRevokeCmd(c))
	return cmd
}

func tokenCreateCmd(c *cli) *cobra.Command {
	var (
		req     api.TokenRequest
		role    string
		expires time.Duration
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "create --name NAME --role ROLE --namespace NS [--expires DURATION]",
		Short: "Create a token and print its secret (once)",
		Args:  nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.Name == "" {
				return usagef("--name is required")
			}
			if role == "" {
				return usagef("--role is required: reader, operator or admin")
			}
			if expires < 0 {
				return usagef("--expires %s: must not be negative", expires)
			}
			req.Role = auth.Role(role)
			if expires > 0 {
				req.Expires = expires.String()
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			t, err := cl.CreateToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(c.stdout, t)
			}
			fmt.Fprintln(c.stdout, t.Token)
			fmt.Fprintf(c.stderr, "token %q (accessor %s, role %s, namespaces %s) created; its secret is printed above and never again\n",
				t.Name, t.Accessor, t.Role, strings.Join(t.Namespaces, ","))
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&req.Name, "name", "", "the token's name (unique)")
	fl.StringVar(&role, "role", "", "reader, operator or admin")
	// --namespace shadows the global --namespace (where submissions land).
	fl.StringSliceVar(&req.Namespaces, "namespace", nil, "namespaces the token acts in (repeat or comma-separate; * for every namespace, admin and reader only)")
	fl.DurationVar(&expires, "expires", 0, "how long the token is accepted, e.g. 720h (default: for ever)")
	fl.BoolVar(&asJSON, "json", false, "print JSON (the secret is its token field)")
	return cmd
}

func tokenListCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "list", Aliases: []string{"ls"}, Short: "List the tokens (never their secrets)"}
	return listCmd(c, cmd, []string{"ACCESSOR", "NAME", "ROLE", "NAMESPACES", "CREATED", "EXPIRES"},
		func(ctx context.Context, cl *client.Client) ([]api.TokenInfo, error) { return cl.Tokens(ctx) },
		func(t api.TokenInfo) []any {
			exp := "never"
			if !t.Expires.IsZero() {
				exp = t.Expires.Format(time.RFC3339)
			}
			return []any{t.Accessor, t.Name, t.Role, strings.Join(t.Namespaces, ","), t.Created.Format(time.RFC3339), exp}
		})
}

func tokenRevokeCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ACCESSOR|NAME...",
		Short: "Revoke tokens: they stop being accepted at once",
		Args:  nArgs(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			for _, ref := range args {
				t, err := cl.RevokeToken(cmd.Context(), ref)
				if err != nil {
					return err
				}
				fmt.Fprintf(c.stdout, "%s\t%s\n", t.Accessor, t.Name)
			}
			return nil
		},
	}
}
