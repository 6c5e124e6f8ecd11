package control

import (
	"context"
	"io"
	"slices"

	"github.com/berth-dev/berth/driver"
)

// Attach connects to the instance's standard streams through its provider
// (driver.Attacher): its output to stdout and stderr, stdin (when not nil)
// to its input, until its output ends or ctx ends. Input to an instance
// whose spec has no Stdin is driver.ErrInvalid naming the field, as is an
// instance with no back-end resource yet; a provider that cannot attach
// answers driver.ErrUnsupported.
func (p *Plane) Attach(ctx context.Context, ref string, opts driver.AttachOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	in, prov, err := p.verbs.live(ref)
	if err != nil {
		return err
	}
	if stdin != nil && (in.Spec == nil || !in.Spec.Stdin) {
		return &driver.FieldError{Path: "stdin", Reason: "instance " + in.ID + " was made without stdin: run it with stdin (-i) to send it input"}
	}
	return prov.Attach(ctx, in.BackendID, opts, stdin, stdout, stderr)
}

// ResizeTTY sets the size of the instance's terminal; an instance whose
// spec has no TTY is driver.ErrInvalid naming the field.
func (p *Plane) ResizeTTY(ctx context.Context, ref string, size driver.TTYSize) error {
	in, prov, err := p.verbs.live(ref)
	if err != nil {
		return err
	}
	if in.Spec == nil || !in.Spec.TTY {
		return &driver.FieldError{Path: "tty", Reason: "instance " + in.ID + " has no terminal: run it with one (-t)"}
	}
	return prov.ResizeTTY(ctx, in.BackendID, size)
}

// CanAttach reports whether the provider of the instance can attach to
// its streams (driver.Attacher), so that a caller may refuse before it
// commits to a stream. An instance not placed yet has no provider: false.
func (p *Plane) CanAttach(ref string) (bool, error) {
	in, err := p.find(ref)
	if err != nil || in.Provider == "" {
		return false, err
	}
	prov, err := p.verbs.provider(in.Provider)
	if err != nil {
		return false, err
	}
	return slices.Contains(prov.Capabilities(), driver.CapAttach), nil
}
