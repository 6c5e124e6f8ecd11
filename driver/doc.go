// Package driver is the contract between Berth and its compute back-ends.
//
// It is what back-end authors implement and nothing else: it imports no other
// Berth package. Callers (the scheduler, the reconciler, the API) do not use a
// Driver directly; they go through package provider, which adds rate limits, a
// circuit breaker, timeouts, logging, metrics and the one fallback for every
// optional capability. This is the split of database/sql and database/sql/driver.
//
// # Required and optional
//
// Every back-end implements Driver: platform state, non-blocking create and
// delete, get, find by name, list by tags, close. Everything else is an
// optional interface discovered by type assertion (ImageLister, Preloader,
// Resizer, Starter, Stopper, Restarter, Killer, Suspender, LogReader,
// Attacher, Execer, EventWatcher, UsageReporter, ConsoleReader). Each one's doc comment states
// the fallback that package provider applies when a driver lacks it.
// Callers find them with As, which also honours a Forwarder (a plugin's
// host side) that has a capability's methods but not the capability.
//
// # Non-blocking operations
//
// Create and Delete return an Operation at once. The caller drives it by
// calling Advance, which must never block: each call does at most one short
// step (well under 200 ms) and reports whether the operation has finished.
// A few goroutines can drive thousands of operations this way. Back-ends whose
// create is a single blocking call wrap it with Async.
//
// # Errors
//
// Drivers classify every failure with one of the sentinel errors in errors.go,
// wrapped with %w so that errors.Is works through any number of layers. The
// Octavia compute-driver exceptions map onto them as follows:
//
//	NotImplementedError     -> ErrUnsupported
//	AmphoraComputeError     -> ErrPermanent (the catch-all; ErrRetryable when
//	                           the operation certainly did not happen)
//	AmphoraBuildError       -> ErrPermanent (wrapped with the build message)
//	DeleteFailed            -> ErrDeleteFailed
//	InstanceNotFoundError   -> ErrNotFound
//	NotSuspendedError       -> ErrNotSuspended
//
// Zoe's ZoeStartExecutionRetryException is ErrRetryable and its
// ZoeStartExecutionFatalException is ErrPermanent. Nodepool's quota exceptions
// are ErrQuotaExceeded.
//
// # Registration
//
// A driver registers a Definition from an init function. Configuration picks
// it by name with Lookup; tests and embedders may call a Definition's Open, or
// construct a Driver value, without going through the registry at all.
package driver
