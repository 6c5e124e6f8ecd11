package control

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/berth-dev/berth/driver"
)

// Bounds of an exec (CheckExec): how many words a command and entries an
// environment may have, how long all of them may be together, and how long
// a user and a working directory may be.
const (
	MaxExecWords   = 1024
	MaxExecEnv     = 256
	MaxExecBytes   = 128 << 10
	MaxExecUser    = 256
	MaxExecWorkDir = 4096
)

// Exec runs a command in the running instance ref through its provider
// (driver.Execer) and returns the command's exit code: its output to
// stdout and stderr, stdin (when not nil) to its input, until it ends or
// ctx ends. Options out of bounds (CheckExecOptions) are driver.ErrInvalid
// naming the field, as is an instance with no back-end resource yet; a
// provider that cannot exec answers driver.ErrUnsupported naming the
// provider and its driver. A user (USER[:GROUP]) that the namespace's
// run-as policy does not allow the caller ctx carries is auth.ErrForbidden
// naming the field, as at submit.
func (p *Plane) Exec(ctx context.Context, ref string, opts driver.ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if err := CheckExecOptions(&opts); err != nil {
		return -1, err
	}
	in, prov, err := p.verbs.live(ref)
	if err != nil {
		return -1, err
	}
	// The command runs as the namespace's policy allows its workloads to
	// (RunAs): an exec is no way round it.
	if opts.User != "" {
		user, group, _ := strings.Cut(opts.User, ":")
		if err := p.admitter.checkRunAs(ctx, &driver.Spec{User: user, Group: group}, in.Owner, ""); err != nil {
			return -1, err
		}
	}
	if !slices.Contains(prov.Capabilities(), driver.CapExec) {
		return -1, cannotExec(prov.Name(), driverName(prov))
	}
	return prov.Exec(ctx, in.BackendID, opts, stdin, stdout, stderr)
}

// CanExec returns nil when the provider of the instance ref can run
// commands in it, so that a caller may refuse before it commits to a
// stream; otherwise the error Exec would give (an instance not placed
// yet, a provider that cannot exec).
func (p *Plane) CanExec(ref string) error {
	_, prov, err := p.verbs.live(ref)
	if err != nil {
		return err
	}
	if !slices.Contains(prov.Capabilities(), driver.CapExec) {
		return cannotExec(prov.Name(), driverName(prov))
	}
	return nil
}

func cannotExec(provider, drv string) error {
	return driver.Errorf(driver.ErrUnsupported, "provider %q (driver %q) cannot exec: it cannot run a command in an instance", provider, drv)
}

// CheckExecOptions reports the first field of opts that is malformed
// (driver.ExecOptions.Check) or beyond the bounds of an exec (MaxExecWords
// ...), or holds a NUL byte, as a *driver.FieldError.
func CheckExecOptions(opts *driver.ExecOptions) error {
	if err := opts.Check(); err != nil {
		return err
	}
	if len(opts.Cmd) > MaxExecWords {
		return &driver.FieldError{Path: "cmd", Reason: fmt.Sprintf("%d words: at most %d", len(opts.Cmd), MaxExecWords)}
	}
	if len(opts.Env) > MaxExecEnv {
		return &driver.FieldError{Path: "env", Reason: fmt.Sprintf("%d entries: at most %d", len(opts.Env), MaxExecEnv)}
	}
	total := 0
	for i, w := range opts.Cmd {
		total += len(w)
		if strings.IndexByte(w, 0) >= 0 {
			return &driver.FieldError{Path: fmt.Sprintf("cmd[%d]", i), Reason: "holds a NUL byte"}
		}
	}
	for i, kv := range opts.Env {
		total += len(kv)
		if strings.IndexByte(kv, 0) >= 0 {
			return &driver.FieldError{Path: fmt.Sprintf("env[%d]", i), Reason: "holds a NUL byte"}
		}
	}
	if total > MaxExecBytes {
		return &driver.FieldError{Path: "cmd", Reason: fmt.Sprintf("the command and environment are %d bytes: at most %d", total, MaxExecBytes)}
	}
	for _, f := range []struct {
		path, v string
		max     int
	}{{"user", opts.User, MaxExecUser}, {"workdir", opts.WorkDir, MaxExecWorkDir}} {
		if len(f.v) > f.max {
			return &driver.FieldError{Path: f.path, Reason: fmt.Sprintf("%d bytes: at most %d", len(f.v), f.max)}
		}
		if strings.IndexByte(f.v, 0) >= 0 {
			return &driver.FieldError{Path: f.path, Reason: "holds a NUL byte"}
		}
	}
	return nil
}
