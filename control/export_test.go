package control

import (
	"context"

	"github.com/berth-dev/berth/reconciler"
)

// RefreshNodes reads every provider's nodes again.
func (p *Plane) RefreshNodes(ctx context.Context) { p.placer.refreshNodes(ctx) }

// PlaceOnce runs one placement round in the caller's goroutine, shared by
// the configured schedulers as the placer shares it. It needs no Run:
// what it places is stored creating, and the creates wait for Run.
func (p *Plane) PlaceOnce(ctx context.Context) { p.placer.placePending(ctx, p.placer.snapshots()) }

// Record returns the plane's reconciler.Instance of the instance named
// ref, as the lifecycle steps it.
func (p *Plane) Record(ref string) (reconciler.Instance, error) { return p.find(ref) }
