package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/store"
)

// Error is the one error shape of the API. On the wire it is
//
//	{"error": {"code": "invalid", "message": "invalid cpus: -1: must not be negative", "field": "cpus"}}
//
// The client decodes it back into an *Error, which matches the driver
// sentinel of its Code under errors.Is and yields a *driver.FieldError under
// errors.As when Field is set, so callers test errors the same way on both
// sides of the wire.
type Error struct {
	// Status is the HTTP status (not on the wire; set by the client).
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

func (e *Error) Error() string { return e.Message }

// Is reports whether target is the sentinel named by e.Code: a driver
// sentinel, or store.ErrCompacted.
func (e *Error) Is(target error) bool {
	k, ok := kindOfCode[e.Code]
	return ok && k == target
}

// Unwrap returns the field error, so that errors.As finds a
// *driver.FieldError naming the field.
func (e *Error) Unwrap() error {
	if e.Field == "" {
		return nil
	}
	return &driver.FieldError{Path: e.Field, Reason: e.Message}
}

// envelope is the body of every error response.
type envelope struct {
	Error *Error `json:"error"`
}

// Error codes of the driver vocabulary that Berth's own code also answers.
const (
	CodeNotFound = "not_found"
	CodeTimeout  = "timeout"
)

// Error codes beyond the driver vocabulary.
const (
	CodeTooLarge = "too_large"
	// CodeBadBody: the request body was truncated or badly framed
	// (BodyError).
	CodeBadBody = "bad_body"
	// CodeRequestTimeout: the request body did not arrive within the
	// server's read timeout (BodyError).
	CodeRequestTimeout   = "request_timeout"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeUnavailable      = "unavailable"
	// CodeCompacted: the events asked for are older than the history the
	// server keeps; list again and follow events from now.
	CodeCompacted = "compacted"
	CodeCanceled  = "canceled"
	CodeInternal  = "internal"
	// CodeUpgradeRequired: the route is a two-way stream the request did
	// not ask to upgrade to (see AttachProtocol).
	CodeUpgradeRequired = "upgrade_required"
)

// codes maps each driver sentinel to its code and HTTP status, in the order
// they are tested. It is the one place where errors become statuses.
var codes = []struct {
	kind   error
	code   string
	status int
}{
	{driver.ErrNotFound, CodeNotFound, http.StatusNotFound},
	{driver.ErrAlreadyExists, "already_exists", http.StatusConflict},
	{driver.ErrNotSuspended, "not_suspended", http.StatusConflict},
	{driver.ErrInsufficientCapacity, "insufficient_capacity", http.StatusConflict},
	{driver.ErrUnsupported, "unsupported", http.StatusUnprocessableEntity},
	{driver.ErrPermanent, "permanent", http.StatusUnprocessableEntity},
	{driver.ErrQuotaExceeded, "quota_exceeded", http.StatusTooManyRequests},
	{driver.ErrRetryable, "retryable", http.StatusServiceUnavailable},
	{driver.ErrTimeout, CodeTimeout, http.StatusGatewayTimeout},
	{driver.ErrDeleteFailed, "delete_failed", http.StatusBadGateway},
	// Last: other kinds carry a *driver.FieldError to name the field (an id
	// that exists already), which matches ErrInvalid too.
	{driver.ErrInvalid, "invalid", http.StatusBadRequest},
}

var kindOfCode = func() map[string]error {
	m := map[string]error{}
	for _, c := range codes {
		m[c.code] = c.kind
	}
	m[CodeCompacted] = store.ErrCompacted
	return m
}()

// toError classifies err: the driver vocabulary first, then the store's and
// the standard library's errors. Anything else is an internal error whose
// message is kept (Berth's errors never carry secrets).
func toError(err error) *Error {
	var ae *Error
	if errors.As(err, &ae) {
		return ae
	}
	e := &Error{Message: err.Error()}
	var fe *driver.FieldError
	if errors.As(err, &fe) {
		e.Field = fe.Path
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		e.Code, e.Status = CodeTooLarge, http.StatusRequestEntityTooLarge
		return e
	}
	if errors.Is(err, auth.ErrForbidden) {
		// Before the codes: a refusal may name a field, which is ErrInvalid.
		e.Code, e.Status = CodeForbidden, http.StatusForbidden
		return e
	}
	// Before the sentinels and the context's errors: a body cut by the
	// read deadline is the client's delay, not the server's.
	var be *BodyError
	if errors.As(err, &be) {
		e.Code, e.Status = CodeBadBody, http.StatusBadRequest
		if be.Timeout() {
			e.Code, e.Status = CodeRequestTimeout, http.StatusRequestTimeout
		}
		return e
	}
	for _, c := range codes {
		if errors.Is(err, c.kind) {
			e.Code, e.Status = c.code, c.status
			return e
		}
	}
	switch {
	case errors.Is(err, auth.ErrNotVisible):
		// What the caller may not see does not exist, for it.
		e.Code, e.Status, e.Message = CodeNotFound, http.StatusNotFound, "not found"
	case errors.Is(err, store.ErrCompacted):
		e.Code, e.Status = CodeCompacted, http.StatusGone
	case errors.Is(err, store.ErrClosed):
		e.Code, e.Status = CodeUnavailable, http.StatusServiceUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		e.Code, e.Status = CodeTimeout, http.StatusGatewayTimeout
	case errors.Is(err, context.Canceled):
		e.Code, e.Status = CodeCanceled, http.StatusServiceUnavailable
	default:
		e.Code, e.Status = CodeInternal, http.StatusInternalServerError
	}
	return e
}

// ErrorOf classifies err as the API answers it: the code, the HTTP status
// and the message. It is the one mapping from errors to statuses, for
// other handlers of the server (the dashboard) too.
func ErrorOf(err error) *Error {
	e := *toError(err)
	if e.Status == 0 {
		e.Status = http.StatusInternalServerError
	}
	return &e
}

// WriteError answers err as the API does, for other handlers of the
// server: the status and the error envelope of ErrorOf.
func WriteError(w http.ResponseWriter, err error) { writeError(w, ErrorOf(err)) }

// StatusOf returns the HTTP status the API answers err with: the one
// mapping of errors to statuses, for other HTTP front ends of the plane.
func StatusOf(err error) int { return toError(err).Status }
