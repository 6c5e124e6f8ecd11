package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/berth-dev/berth/driver"
)

// classify turns an API server answer into Berth's vocabulary. what names
// the request ("create pod web-1"); mutating says whether it may change
// something, which decides what an unclear failure means.
//
//   - the server could not be reached (refused, no route): ErrRetryable;
//   - the request's deadline passed, the connection broke, or 504:
//     ErrTimeout, because the server may have acted;
//   - 404: ErrNotFound; 409 AlreadyExists: ErrAlreadyExists;
//   - 403 naming an exceeded ResourceQuota: ErrQuotaExceeded;
//   - 429 and 503: ErrRetryable (the server refused before acting);
//   - 500 and other 5xx: ErrRetryable for a read, ErrTimeout for a request
//     that may have changed something;
//   - 409 Conflict, 422 Invalid, 400, 401, 403, 405, 413: ErrPermanent,
//     with the server's message (for 422 the fields it names).
func classify(err error, what string, mutating bool) error {
	if err == nil {
		return nil
	}
	where := "kubernetes: " + what
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		switch {
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
			return fmt.Errorf("%w: %s: %w", driver.ErrTimeout, where, err)
		case unreachable(err):
			return fmt.Errorf("%w: %s: API server unreachable: %w", driver.ErrRetryable, where, err)
		}
		return fmt.Errorf("%w: %s: outcome unknown: %w", driver.ErrTimeout, where, err)
	}
	code := status.Status().Code
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %s: %w", driver.ErrNotFound, where, err)
	case apierrors.IsAlreadyExists(err):
		return fmt.Errorf("%w: %s: %w", driver.ErrAlreadyExists, where, err)
	case quotaExceeded(err):
		return fmt.Errorf("%w: %s: %w", driver.ErrQuotaExceeded, where, err)
	case apierrors.IsTooManyRequests(err), apierrors.IsServiceUnavailable(err):
		return fmt.Errorf("%w: %s: %w", driver.ErrRetryable, where, err)
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err):
		return fmt.Errorf("%w: %s: %w", driver.ErrTimeout, where, err)
	case code >= 500 && mutating:
		return fmt.Errorf("%w: %s: the server failed and may have acted: %w", driver.ErrTimeout, where, err)
	case code >= 500:
		return fmt.Errorf("%w: %s: %w", driver.ErrRetryable, where, err)
	case apierrors.IsInvalid(err):
		return fmt.Errorf("%w: %s: the server refused the object (%s): %w", driver.ErrPermanent, where, invalidFields(status), err)
	}
	return fmt.Errorf("%w: %s: %w", driver.ErrPermanent, where, err)
}

// quotaExceeded recognises the ResourceQuota admission's refusal. It comes
// as 403 Forbidden with no reason of its own, so its text is all there is
// to go on; a pod that merely lacks the limits a quota requires ("failed
// quota: ... must specify") is a permanent failure, not this.
func quotaExceeded(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota")
}

// invalidFields lists the fields a 422 names.
func invalidFields(status apierrors.APIStatus) string {
	var out []string
	if d := status.Status().Details; d != nil {
		for _, c := range d.Causes {
			out = append(out, c.Field+": "+c.Message)
		}
	}
	if len(out) == 0 {
		return "no field named"
	}
	return strings.Join(out, "; ")
}

// unreachable reports whether the request never reached the server.
func unreachable(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}
