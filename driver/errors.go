package driver

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The error vocabulary. Drivers wrap one of these with %w; callers test with
// errors.Is. Each rule says when a driver may return the error and what the
// caller does with it. Never match error strings outside the driver that owns
// them.
var (
	// ErrRetryable means the operation certainly did not take effect and may be
	// tried again later, on the same or another node. Never return it if the
	// back-end may have performed the operation; use ErrTimeout then.
	ErrRetryable = errors.New("retryable")

	// ErrPermanent means the operation failed and trying again with the same
	// spec will fail the same way (a build error, a missing image, a rejected
	// option). The message must say what to change.
	ErrPermanent = errors.New("permanent failure")

	// ErrNotFound means the instance, node or image does not exist. Deleting an
	// instance that is already gone returns ErrNotFound and callers count the
	// delete as done.
	ErrNotFound = errors.New("not found")

	// ErrAlreadyExists means a resource with the same name already exists in
	// the back-end. The caller looks it up by name and adopts it if its tags are
	// Berth's own, instead of creating a second copy.
	ErrAlreadyExists = errors.New("already exists")

	// ErrUnsupported means the driver does not implement the operation or the
	// spec asks for something this back-end cannot do (a VM on a container
	// back-end). It is permanent for this driver.
	ErrUnsupported = errors.New("unsupported")

	// ErrNotSuspended means Resume was called on an instance that is not
	// suspended. The instance is unchanged.
	ErrNotSuspended = errors.New("not suspended")

	// ErrQuotaExceeded means the back-end refused the request because an
	// account or project limit is reached. It is not a failure of the request:
	// the caller aborts the launch and requeues it until capacity frees up.
	ErrQuotaExceeded = errors.New("quota exceeded")

	// ErrInsufficientCapacity means the chosen node has not got the resources
	// the spec asks for. Nothing was created; the caller places the instance
	// again, excluding that node for a while.
	ErrInsufficientCapacity = errors.New("insufficient capacity")

	// ErrInvalid means the spec, the options or an argument is malformed. The
	// error is, or wraps, a *FieldError naming the field. Nothing was done.
	ErrInvalid = errors.New("invalid")

	// ErrTimeout means the back-end did not answer in time and the operation
	// may or may not have happened. The caller must look the instance up (by
	// tags or name) before trying again.
	ErrTimeout = errors.New("timeout")

	// ErrDeleteFailed means the back-end could not delete an instance that
	// still exists. The caller retries the delete later; the instance is never
	// forgotten while it may still exist.
	ErrDeleteFailed = errors.New("delete failed")
)

// Classes lists the sentinel errors, the classes every failure falls in, for
// code that maps each class to exactly one action or status code.
var Classes = []error{
	ErrRetryable, ErrPermanent, ErrNotFound, ErrAlreadyExists, ErrUnsupported,
	ErrNotSuspended, ErrQuotaExceeded, ErrInsufficientCapacity, ErrInvalid,
	ErrTimeout, ErrDeleteFailed,
}

// ClassOf returns the first sentinel in Classes that err wraps, or nil when
// err is nil or unclassified.
func ClassOf(err error) error {
	if err == nil {
		return nil
	}
	for _, k := range Classes {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}

// Errorf returns an error that wraps kind and reads "kind: message".
func Errorf(kind error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", kind, fmt.Sprintf(format, args...))
}

// FieldError reports one invalid field. Path is the field's location in
// dotted form with indexes, e.g. "ports[1].host_port" or "options.nodes".
// It matches ErrInvalid under errors.Is.
type FieldError struct {
	Path   string
	Reason string
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return "invalid: " + e.Reason
	}
	return "invalid " + e.Path + ": " + e.Reason
}

// Is reports whether target is ErrInvalid.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// FieldErrors is a list of field errors found in one validation pass. It
// matches ErrInvalid under errors.Is and errors.As finds each *FieldError.
type FieldErrors []*FieldError

func (es FieldErrors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

// Is reports whether target is ErrInvalid.
func (es FieldErrors) Is(target error) bool { return target == ErrInvalid }

// Unwrap returns the individual field errors.
func (es FieldErrors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Add appends a field error for path with a formatted reason.
func (es *FieldErrors) Add(path, format string, args ...any) {
	*es = append(*es, &FieldError{Path: path, Reason: fmt.Sprintf(format, args...)})
}

// AddErr appends err's field errors with prefix put before each path (joined
// with a dot when the path is not an index); an error that carries no
// *FieldError is added with prefix as its path. A nil err adds nothing.
func (es *FieldErrors) AddErr(prefix string, err error) {
	if err == nil {
		return
	}
	var found []*FieldError
	var list FieldErrors
	var one *FieldError
	switch {
	case errors.As(err, &list):
		found = list
	case errors.As(err, &one):
		found = []*FieldError{one}
	default:
		*es = append(*es, &FieldError{Path: prefix, Reason: err.Error()})
		return
	}
	for _, fe := range found {
		*es = append(*es, &FieldError{Path: JoinPath(prefix, fe.Path), Reason: fe.Reason})
	}
}

// JoinPath joins a field path and a sub-path: "ports" and "[1].host_port"
// make "ports[1].host_port"; "engines[0]" and "tls" make "engines[0].tls".
func JoinPath(prefix, path string) string {
	switch {
	case prefix == "":
		return path
	case path == "":
		return prefix
	case strings.HasPrefix(path, "["):
		return prefix + path
	}
	return prefix + "." + path
}

// Err returns nil for an empty list and the list otherwise.
func (es FieldErrors) Err() error {
	if len(es) == 0 {
		return nil
	}
	return es
}

// PartialListError is what List returns, together with the instances it
// did list, when some nodes could not be asked (an engine that is offline).
// Nodes names them, sorted; the listing of every other node is complete.
// It matches ErrRetryable under errors.Is, so a caller that does not look
// for it treats the listing as failed and tries again later, as before. A
// caller that finds it with errors.As may use the instances it got, but
// must not conclude from the listing that an instance on one of Nodes is
// gone, nor that one is absent there.
type PartialListError struct {
	Nodes []string
	// Err says why, node by node. It carries no kind of its own, so the
	// error is ErrRetryable and nothing else.
	Err error
}

func (e *PartialListError) Error() string {
	msg := "retryable: list is partial: nodes " + strings.Join(e.Nodes, ", ") + " could not be listed"
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrRetryable.
func (e *PartialListError) Is(target error) bool { return target == ErrRetryable }

// Unwrap returns the underlying error.
func (e *PartialListError) Unwrap() error { return e.Err }

// Missing reports whether node is one of the nodes that were not listed.
func (e *PartialListError) Missing(node string) bool {
	for _, n := range e.Nodes {
		if n == node {
			return true
		}
	}
	return false
}

// NotAttemptedError is what a layer in front of the back-end (the
// provider's circuit breaker) returns for a call it refused without passing
// it on: nothing reached the back-end, and no call will before Until. It
// matches ErrRetryable under errors.Is, so a caller that does not look for
// it treats the call as a retryable failure, as before. A caller that finds
// it with errors.As must not count the refusal as a failed attempt of the
// request (the request was never tried): it waits until Until, says why
// (Err), and tries again.
type NotAttemptedError struct {
	// Until is the earliest time a new call may get through.
	Until time.Time
	// Err says why the call was refused. It carries no kind of its own.
	Err error
}

func (e *NotAttemptedError) Error() string {
	msg := "retryable: not attempted"
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrRetryable.
func (e *NotAttemptedError) Is(target error) bool { return target == ErrRetryable }

// Unwrap returns the underlying error.
func (e *NotAttemptedError) Unwrap() error { return e.Err }
