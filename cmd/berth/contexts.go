package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
)

// EnvContext names the context to use instead of the file's current one.
const EnvContext = "BERTH_CONTEXT"

// contextsFile is the client's list of servers, as kubectl's kubeconfig
// and docker's contexts keep them: $XDG_CONFIG_HOME/berth/contexts.yaml (or
// ~/.config/berth/contexts.yaml), mode 0600 since it holds tokens.
type contextsFile struct {
	Current  string          `yaml:"current,omitempty"`
	Contexts []clientContext `yaml:"contexts"`
}

// clientContext is one server and how to talk to it.
type clientContext struct {
	Name      string `yaml:"name"`
	Addr      string `yaml:"addr"`
	Token     string `yaml:"token,omitempty"`
	Namespace string `yaml:"namespace,omitempty"`
	// CAFile is a PEM file of the CAs that sign the server's certificate
	// (https addresses); empty means the system's.
	CAFile string `yaml:"ca_file,omitempty"`
}

func contextsPath() (string, error) {
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "berth", "contexts.yaml"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".config", "berth", "contexts.yaml"), nil
}

// loadContexts reads the contexts file; a missing file is an empty one.
func loadContexts() (*contextsFile, string, error) {
	path, err := contextsPath()
	if err != nil {
		return &contextsFile{}, "", nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &contextsFile{}, path, nil
	}
	if err != nil {
		return nil, path, err
	}
	var f contextsFile
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, path, fmt.Errorf("%s: %w", path, err)
	}
	return &f, path, nil
}

func (f *contextsFile) save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (f *contextsFile) find(name string) (*clientContext, bool) {
	i := slices.IndexFunc(f.Contexts, func(c clientContext) bool { return c.Name == name })
	if i < 0 {
		return nil, false
	}
	return &f.Contexts[i], true
}

// client returns a client of the server the command line names: --addr,
// --token, --namespace and --ca-file (or their variables) override the
// chosen context (--context, $BERTH_CONTEXT, else the file's current one),
// and without a token a server on this host is reached with the admin token
// in its data directory.
func (c *cli) client() (*client.Client, error) {
	addr, token, ns, ca := c.addr, c.token, c.namespace, c.caFile
	name := c.context
	if name == "" {
		name = os.Getenv(EnvContext)
	}
	f, _, err := loadContexts()
	if err != nil {
		return nil, err
	}
	if name == "" {
		name = f.Current
	}
	if name != "" {
		cx, ok := f.find(name)
		if !ok {
			return nil, usagef("no context %q (berth context ls)", name)
		}
		if !c.addrSet {
			addr = cx.Addr
		}
		token, ns, ca = or(token, cx.Token), or(ns, cx.Namespace), or(ca, cx.CAFile)
	}
	if token, err = resolveToken(addr, token); err != nil {
		return nil, err
	}
	opts := []client.Option{client.WithToken(token), client.WithNamespace(ns)}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, usagef("--ca-file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("--ca-file %s: no PEM certificate in it", ca)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		opts = append(opts, client.WithHTTPClient(&http.Client{Transport: tr}))
	}
	return client.New(addr, opts...)
}

// or returns the first non-empty of a and b.
func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func contextCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "context",
		Short: "Keep several servers and their tokens, and choose one",
		Long: `Contexts name servers and how to reach them (address, token, namespace, CA),
as kubectl's and docker's do, in $XDG_CONFIG_HOME/berth/contexts.yaml (mode 0600).
--context NAME or $BERTH_CONTEXT picks one for a command; "berth context use"
sets the current one. --addr, --token, --namespace and --ca-file override it.`,
		Args: nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	use := &cobra.Command{
		Use: "use NAME", Short: "Make a context the current one", Args: nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, path, err := loadContexts()
			if err != nil {
				return err
			}
			if _, ok := f.find(args[0]); !ok {
				return usagef("no context %q (berth context ls)", args[0])
			}
			f.Current = args[0]
			return f.save(path)
		},
	}
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List the contexts (never their tokens)", Args: nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, _, err := loadContexts()
			if err != nil {
				return err
			}
			tw := table(c.stdout, "CURRENT", "NAME", "ADDR", "NAMESPACE", "TOKEN")
			for _, x := range f.Contexts {
				cur, tok := "", "no"
				if x.Name == f.Current {
					cur = "*"
				}
				if x.Token != "" {
					tok = "yes"
				}
				row(tw, cur, x.Name, x.Addr, x.Namespace, tok)
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use: "rm NAME", Short: "Remove a context", Args: nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, path, err := loadContexts()
			if err != nil {
				return err
			}
			i := slices.IndexFunc(f.Contexts, func(x clientContext) bool { return x.Name == args[0] })
			if i < 0 {
				return usagef("no context %q", args[0])
			}
			f.Contexts = slices.Delete(f.Contexts, i, i+1)
			if f.Current == args[0] {
				f.Current = ""
			}
			return f.save(path)
		},
	}
	cmd.AddCommand(contextAddCmd(), use, ls, rm)
	return cmd
}

// contextAddCmd returns `berth context add`.
func contextAddCmd() *cobra.Command {
	var cx clientContext
	var tokenFile string
	add := &cobra.Command{
		Use:   "add NAME --addr ADDR [--token-file FILE] [--namespace NS] [--ca-file FILE]",
		Short: "Add or replace a context",
		Args:  nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cx.Name = args[0]
			if err := auth.ValidName(cx.Name); err != nil {
				return usagef("context name %v", err)
			}
			if cx.Addr == "" {
				return usagef("--addr is required")
			}
			if _, err := client.New(cx.Addr); err != nil {
				return usagef("--addr: %v", err)
			}
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return usagef("--token-file: %v", err)
				}
				cx.Token = strings.TrimSpace(string(b))
			} else {
				cx.Token = os.Getenv(EnvToken)
			}
			f, path, err := loadContexts()
			if err != nil {
				return err
			}
			if old, ok := f.find(cx.Name); ok {
				*old = cx
			} else {
				f.Contexts = append(f.Contexts, cx)
			}
			if f.Current == "" {
				f.Current = cx.Name
			}
			return f.save(path)
		},
	}
	fl := add.Flags()
	fl.StringVar(&cx.Addr, "addr", "", "the server's address, e.g. https://berth.example.com:7480")
	fl.StringVar(&tokenFile, "token-file", "", "a file holding the token (default $"+EnvToken+"; never given on the command line, where others may see it)")
	fl.StringVar(&cx.Namespace, "namespace", "", "namespace submissions land in")
	fl.StringVar(&cx.CAFile, "ca-file", "", "PEM file of the CAs of the server's certificate")
	return add
}
