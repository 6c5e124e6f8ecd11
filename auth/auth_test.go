package auth_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/store/memory"
)

// TestBootstrapOnce: the first admin token is made once, its secret written
// to a 0600 file that authenticates; a second start makes none.
func TestBootstrapOnce(t *testing.T) {
	ctx := context.Background()
	tk := auth.NewTokens(memory.New(memory.Options{}), nil)
	path := filepath.Join(t.TempDir(), "data", auth.BootstrapFile)
	made, err := tk.Bootstrap(ctx, path)
	if err != nil || !made {
		t.Fatalf("first Bootstrap: %v %v", made, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v, want mode 0600", fi, err)
	}
	b, _ := os.ReadFile(path)
	id, err := tk.Authenticate(ctx, strings.TrimSpace(string(b)))
	if err != nil || id.Role != auth.RoleAdmin || !id.All() {
		t.Fatalf("the written secret: %+v %v", id, err)
	}
	if made, err := tk.Bootstrap(ctx, path); err != nil || made {
		t.Fatalf("second Bootstrap: %v %v, want nothing made", made, err)
	}
	list, _ := tk.List(ctx)
	if len(list) != 1 {
		t.Fatalf("%d tokens after two starts, want 1", len(list))
	}
}

func TestExpiryAndRevocation(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tk := auth.NewTokens(memory.New(memory.Options{}), func() time.Time { return now })
	secret, tok, err := tk.Create(ctx, auth.Spec{Name: "ci", Role: auth.RoleOperator, Namespaces: []string{"ci"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if tok.Digest == "" || strings.Contains(tok.Digest, secret) || tok.Digest != auth.Digest(secret) {
		t.Fatalf("stored digest %q", tok.Digest)
	}
	if _, err := tk.Authenticate(ctx, secret); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	if _, err := tk.Authenticate(ctx, secret); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("past its expiry: %v", err)
	}
	now = now.Add(-time.Minute)
	if _, err := tk.Revoke(ctx, tok.Accessor); err != nil {
		t.Fatal(err)
	}
	if _, err := tk.Authenticate(ctx, secret); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("revoked: %v", err)
	}
	if _, err := tk.Authenticate(ctx, strings.Repeat("x", auth.MaxSecretSize+1)); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("an oversized secret: %v", err)
	}
}

func TestSpecAndNamespaces(t *testing.T) {
	for _, c := range []struct {
		spec  auth.Spec
		field string
	}{
		{auth.Spec{Name: "", Role: auth.RoleAdmin}, "name"},
		{auth.Spec{Name: "a b", Role: auth.RoleAdmin}, "name"},
		{auth.Spec{Name: "x", Role: "root"}, "role"},
		{auth.Spec{Name: "x", Role: auth.RoleOperator}, "namespaces"},
		{auth.Spec{Name: "x", Role: auth.RoleOperator, Namespaces: []string{"*"}}, "namespaces[0]"},
		{auth.Spec{Name: "x", Role: auth.RoleReader, Namespaces: []string{"ok", "ok"}}, "namespaces[1]"},
		{auth.Spec{Name: "x", Role: auth.RoleReader, Namespaces: []string{"../x"}}, "namespaces[0]"},
	} {
		err := c.spec.Validate()
		var fe *driver.FieldError
		if !errors.As(err, &fe) || fe.Path != c.field {
			t.Errorf("%+v: %v, want a field error at %s", c.spec, err, c.field)
		}
	}
	op := auth.Identity{Name: "a", Role: auth.RoleOperator, Namespaces: []string{"team", "shared"}}
	if ns, err := op.Namespace(""); err != nil || ns != "team" {
		t.Errorf("default namespace %q %v, want the first", ns, err)
	}
	if _, err := op.Namespace("other"); err == nil {
		t.Error("a namespace not the token's was taken")
	}
	admin := auth.Identity{Name: "root", Role: auth.RoleAdmin, Namespaces: []string{auth.AllNamespaces}}
	if ns, _ := admin.Namespace(""); ns != auth.DefaultNamespace {
		t.Errorf("an admin's default namespace %q", ns)
	}
	if op.Sees("other") || !op.Sees("shared") || op.Sees("") || !admin.Sees("") {
		t.Error("Sees is wrong")
	}
	if op.Allows(auth.Admin) || !op.Allows(auth.Operate) || (auth.Identity{Role: auth.RoleReader}).Allows(auth.Operate) {
		t.Error("Allows is wrong")
	}
}

// TestAuthorize: the role is checked first (ErrForbidden, whatever the
// object), then the namespace (ErrNotVisible); the cluster's own objects
// (namespace "") are for admins and readers of every namespace only.
func TestAuthorize(t *testing.T) {
	ids := map[string]auth.Identity{
		"admin":      {Role: auth.RoleAdmin},
		"op-alice":   {Role: auth.RoleOperator, Namespaces: []string{"alice"}},
		"reader-all": {Role: auth.RoleReader, Namespaces: []string{auth.AllNamespaces}},
		"reader-a":   {Role: auth.RoleReader, Namespaces: []string{"alice"}},
		"unknown":    {Role: "root", Namespaces: []string{"alice"}},
	}
	for _, c := range []struct {
		id   string
		p    auth.Permission
		ns   string
		want error
	}{
		{"admin", auth.Operate, "", nil},
		{"admin", auth.Admin, "mallory", nil},
		{"op-alice", auth.Operate, "alice", nil},
		{"op-alice", auth.Read, "alice", nil},
		{"op-alice", auth.Operate, "mallory", auth.ErrNotVisible},
		{"op-alice", auth.Operate, "", auth.ErrNotVisible},
		{"op-alice", auth.Admin, "alice", auth.ErrForbidden},
		{"reader-a", auth.Read, "alice", nil},
		{"reader-a", auth.Operate, "alice", auth.ErrForbidden},
		{"reader-a", auth.Operate, "mallory", auth.ErrForbidden},
		{"reader-a", auth.Read, "", auth.ErrNotVisible},
		{"reader-all", auth.Read, "", nil},
		{"reader-all", auth.Read, "mallory", nil},
		{"reader-all", auth.Operate, "", auth.ErrForbidden},
		{"unknown", auth.Read, "alice", auth.ErrForbidden},
	} {
		if err := ids[c.id].Authorize(c.p, c.ns); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s %s in %q: %v, want %v", c.id, c.p, c.ns, err, c.want)
		}
	}
}
