package local

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"

	"github.com/berth-dev/berth/driver"
)

// credential returns the user and group a process of spec runs as, or nil
// to run as the server. A spec naming no user runs as Options.DefaultUser
// when the server runs as root and one is set. It refuses root (explicit,
// or implied by a server running as root with no user given and no
// default user) unless Options.AllowRoot, and a user a server not running
// as root cannot become. Every error names the field.
func (d *Driver) credential(spec *driver.Spec) (*syscall.Credential, error) {
	euid := os.Geteuid()
	name := spec.User
	if name == "" {
		if spec.Group != "" {
			return nil, &driver.FieldError{Path: "group", Reason: "needs a user"}
		}
		if euid != 0 {
			return nil, nil
		}
		if d.opts.DefaultUser == "" {
			if !d.opts.AllowRoot {
				return nil, fmt.Errorf("%w: %w", driver.ErrUnsupported, &driver.FieldError{Path: "user",
					Reason: fmt.Sprintf("node %q runs processes as root only when its provider sets allow_root: name a user", d.node)})
			}
			return nil, nil
		}
		name = d.opts.DefaultUser
	}
	uid, gid, err := lookupUser(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", driver.ErrUnsupported, &driver.FieldError{Path: "user", Reason: err.Error()})
	}
	if spec.Group != "" {
		if gid, err = lookupGroup(spec.Group); err != nil {
			return nil, fmt.Errorf("%w: %w", driver.ErrUnsupported, &driver.FieldError{Path: "group", Reason: err.Error()})
		}
	}
	if uid == 0 && !d.opts.AllowRoot {
		return nil, fmt.Errorf("%w: %w", driver.ErrUnsupported, &driver.FieldError{Path: "user",
			Reason: fmt.Sprintf("%q is root: node %q runs processes as root only when its provider sets allow_root", name, d.node)})
	}
	if euid != 0 && (uid != uint32(euid) || gid != uint32(os.Getegid())) {
		return nil, fmt.Errorf("%w: %w", driver.ErrUnsupported, &driver.FieldError{Path: "user",
			Reason: fmt.Sprintf("%s:%d: the server on node %q runs as uid %d, not root, and cannot become another user", name, gid, d.node, euid)})
	}
	return &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}, nil
}

// CheckSpec refuses, at submit, what this host can never run: another
// kind than process, the fields a process cannot honour, a user that does
// not exist or that the server cannot become, and root unless allowed.
func (d *Driver) CheckSpec(spec *driver.Spec) error {
	if _, err := d.checkSpec("", spec); err != nil && !errors.Is(err, driver.ErrInsufficientCapacity) {
		return err
	}
	_, err := d.credential(spec)
	return err
}

// Features are what the local back-end runs: processes, with ports and a
// user.
func (d *Driver) Features() []string {
	return []string{driver.CapKindProcess, driver.CapHostPorts, driver.CapRunAsUser}
}

var _ driver.FeatureReporter = (*Driver)(nil)

// lookupUser resolves a user name or numeric id to a uid and its primary
// group (for an id with no passwd entry, the group of the same number).
func lookupUser(name string) (uid, gid uint32, err error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		u, lerr := user.LookupId(name)
		if lerr != nil {
			return uint32(n), uint32(n), nil
		}
		g, _ := strconv.ParseUint(u.Gid, 10, 32)
		return uint32(n), uint32(g), nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return 0, 0, fmt.Errorf("%q: no such user on this host", name)
	}
	n, err1 := strconv.ParseUint(u.Uid, 10, 32)
	g, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("%q: uid %s, gid %s: not numeric", name, u.Uid, u.Gid)
	}
	return uint32(n), uint32(g), nil
}

// lookupGroup resolves a group name or numeric id to a gid.
func lookupGroup(name string) (uint32, error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(n), nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("%q: no such group on this host", name)
	}
	n, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q: gid %s: not numeric", name, g.Gid)
	}
	return uint32(n), nil
}

var _ driver.SpecChecker = (*Driver)(nil)
