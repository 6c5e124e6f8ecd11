package vm

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/digitalocean/go-libvirt"

	"github.com/berth-dev/berth/driver"
)

// classify turns a libvirt failure into Berth's vocabulary; what names the
// call and n the node, so that every message says where it failed.
//
//   - the daemon could not be reached: ErrRetryable (nothing was sent);
//   - the call's deadline passed or the connection broke during it:
//     ErrTimeout (the daemon may have acted);
//   - no such domain: ErrNotFound; a domain of that name exists:
//     ErrAlreadyExists;
//   - QEMU could not allocate the guest's memory: ErrInsufficientCapacity;
//   - any other answer of the daemon: ErrPermanent.
func (d *Driver) classify(n *node, what string, err error) error {
	if err == nil {
		return nil
	}
	if driver.ClassOf(err) != nil {
		return err
	}
	where := fmt.Sprintf("vm: node %s: %s", n.cfg.Name, what)
	var le libvirt.Error
	switch {
	case errors.Is(err, errUnreachable):
		return fmt.Errorf("%w: %s: %w", driver.ErrRetryable, where, err)
	case errors.Is(err, errConnLost), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return fmt.Errorf("%w: %s: %w", driver.ErrTimeout, where, err)
	case errors.As(err, &le):
		switch libvirt.ErrorNumber(le.Code) {
		case libvirt.ErrNoDomain:
			return fmt.Errorf("%w: %s: %w", driver.ErrNotFound, where, err)
		case libvirt.ErrDomExist:
			return fmt.Errorf("%w: %s: %w", driver.ErrAlreadyExists, where, err)
		}
		if outOfMemory(le.Message) {
			return fmt.Errorf("%w: %s: %w", driver.ErrInsufficientCapacity, where, err)
		}
		if strings.Contains(le.Message, "already exists") {
			return fmt.Errorf("%w: %s: %w", driver.ErrAlreadyExists, where, err)
		}
		return fmt.Errorf("%w: %s: %w", driver.ErrPermanent, where, err)
	}
	// No answer from the daemon: the connection broke after the request.
	return fmt.Errorf("%w: %s: outcome unknown: %w", driver.ErrTimeout, where, err)
}

// outOfMemory reports whether QEMU failed for want of memory.
func outOfMemory(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "cannot allocate memory") || strings.Contains(m, "cannot set up guest memory")
}
