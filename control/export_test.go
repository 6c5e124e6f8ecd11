package control

import "context"

// RefreshNodes reads every provider's nodes again.
func (p *Plane) RefreshNodes(ctx context.Context) { p.refreshNodes(ctx) }

// PlaceOnce runs one placement round in the caller's goroutine, shared by
// the configured schedulers as the placer shares it. It needs no Run:
// what it places is stored creating, and the creates wait for Run.
func (p *Plane) PlaceOnce(ctx context.Context) { p.placePending(ctx, p.snapshots()) }
