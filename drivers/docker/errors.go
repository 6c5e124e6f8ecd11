package docker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// classify turns an Engine API error into Berth's vocabulary. what names the
// call ("create container web-1") and e the engine, so that every message
// says where it failed.
//
//   - the engine could not be reached (dial failed, refused, TLS handshake
//     failed): ErrRetryable, because the request never arrived;
//   - the call's deadline passed or the connection broke mid-call:
//     ErrTimeout, because the engine may have acted;
//   - 404: ErrNotFound; 409: ErrAlreadyExists; 503: ErrRetryable;
//   - the kernel refused memory (ENOMEM): ErrInsufficientCapacity;
//   - any other answer from the engine (400, 500): ErrPermanent.
//
// Calls made while an engine may be going away use Driver.callErr, which
// settles a 500 by looking at the engine.
func classify(err error, e *engine, what string) error {
	if err == nil {
		return nil
	}
	where := fmt.Sprintf("engine %s: %s", e.cfg.Name, what)
	switch {
	case client.IsErrConnectionFailed(err):
		return fmt.Errorf("%w: %s: engine unreachable: %w", driver.ErrRetryable, where, err)
	case tlsRefused(err):
		return fmt.Errorf("%w: %s: TLS handshake failed (check the engine's tls settings): %w", driver.ErrRetryable, where, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return fmt.Errorf("%w: %s: %w", driver.ErrTimeout, where, err)
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%w: %s: %w", driver.ErrNotFound, where, err)
	case cerrdefs.IsConflict(err):
		return fmt.Errorf("%w: %s: %w", driver.ErrAlreadyExists, where, err)
	case cerrdefs.IsUnavailable(err):
		return fmt.Errorf("%w: %s: %w", driver.ErrRetryable, where, err)
	case outOfMemory(err):
		return fmt.Errorf("%w: %s: %w", driver.ErrInsufficientCapacity, where, err)
	case answered(err):
		return fmt.Errorf("%w: %s: %w", driver.ErrPermanent, where, err)
	}
	// No status code: the connection broke after the request was sent.
	return fmt.Errorf("%w: %s: outcome unknown: %w", driver.ErrTimeout, where, err)
}

// tlsRefused reports whether the TLS handshake failed, on either side, so
// that no request was sent. An alert from the engine (it refused Berth's
// certificate) reaches crypto/tls callers over TCP only as an unexported
// type whose text starts "remote error: tls:", hence the one string test.
func tlsRefused(err error) bool {
	var cve *tls.CertificateVerificationError
	var alert tls.AlertError
	return errors.As(err, &cve) || errors.As(err, &alert) || strings.Contains(err.Error(), "remote error: tls:")
}

// answered reports whether err carries an HTTP status from the engine.
func answered(err error) bool {
	return cerrdefs.IsInvalidArgument(err) || cerrdefs.IsInternal(err) || cerrdefs.IsUnknown(err) ||
		cerrdefs.IsPermissionDenied(err) || cerrdefs.IsUnauthorized(err) || cerrdefs.IsFailedPrecondition(err) ||
		cerrdefs.IsNotImplemented(err) || cerrdefs.IsAlreadyExists(err) || cerrdefs.IsResourceExhausted(err) ||
		cerrdefs.IsDataLoss(err) || cerrdefs.IsAborted(err) || cerrdefs.IsOutOfRange(err) || cerrdefs.IsCanceled(err) ||
		cerrdefs.IsDeadlineExceeded(err)
}

// outOfMemory recognises the engine's report of the kernel refusing memory.
// The engine sends it as text only (the runtime's ENOMEM), so the text is
// all there is to go on.
func outOfMemory(err error) bool {
	msg := err.Error()
	return cerrdefs.IsResourceExhausted(err) || strings.Contains(msg, "cannot allocate memory") || strings.Contains(msg, "out of memory")
}

// missingImage turns the not-found answer of a container create into the
// permanent error the contract asks for, naming the image and the engine.
func missingImage(err error, e *engine, image string) error {
	return fmt.Errorf("%w: image %q is not present on engine %s; preload it or fix the name: %w", driver.ErrPermanent, image, e.cfg.Name, err)
}

// serverError reports whether err is an answer 500 from the engine:
// something failed inside it. An engine that is shutting down gives it for
// calls its own shutdown cut off (its runtime already gone), so a 500 alone
// does not say whether the request was wrong.
func serverError(err error) bool {
	return !client.IsErrConnectionFailed(err) && (cerrdefs.IsInternal(err) || cerrdefs.IsUnknown(err))
}

// Evidence that an engine is going away: after a 500 it is pinged up to
// awayPings times, awayGap apart, each ping bounded by awayWait.
const (
	awayPings = 3
	awayGap   = 100 * time.Millisecond
	awayWait  = 2 * time.Second
)

// callErr classifies err from a call on e as classify does, and marks e
// offline when err says it cannot be reached. A 500 is settled by evidence,
// not by its text: when e is offline (or not yet trusted again after being
// offline), or fails one of the pings made right after, the engine is going
// away and cut the call off (the pings use new connections, which an engine
// that is shutting down refuses while it still answers on old ones); what the call did is unknown, so it is
// ErrTimeout (a create's cleanup then removes what the create made). When
// the engine keeps answering, the 500 is its answer: ErrPermanent.
func (d *Driver) callErr(ctx context.Context, e *engine, err error, what string) error {
	if err == nil {
		return nil
	}
	d.noteErr(e, err)
	if !serverError(err) {
		return classify(err, e, what)
	}
	if why := d.goingAway(ctx, e); why != "" {
		return fmt.Errorf("%w: engine %s: %s: the engine is going away (%s), the outcome is unknown: %w", driver.ErrTimeout, e.cfg.Name, what, why, err)
	}
	return classify(err, e, what)
}

// goingAway says why e looks like an engine that is shutting down, or ""
// when it answers normally. A failed ping marks it offline.
func (d *Driver) goingAway(ctx context.Context, e *engine) string {
	for i := range awayPings {
		if st, reason, _ := e.snapshot(); st == driver.NodeOffline {
			return "offline: " + reason
		}
		if i > 0 {
			t := time.NewTimer(awayGap)
			select {
			case <-ctx.Done():
				t.Stop()
				return ""
			case <-t.C:
			}
		}
		pctx, cancel := context.WithTimeout(ctx, min(awayWait, d.opts.CallTimeout))
		_, err := e.ping.Ping(pctx, client.PingOptions{})
		cancel()
		if ctx.Err() != nil {
			return ""
		}
		if err != nil {
			d.markOffline(e, err.Error())
			e.probeSoon()
			return "ping failed: " + err.Error()
		}
	}
	return ""
}
