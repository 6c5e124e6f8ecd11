package control_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/memory"
)

// TestArchiveTopRefused: a provider whose driver cannot copy files or list
// processes (sim) refuses docker cp's and docker top's calls by name;
// paths and ps options out of bounds are refused before the provider.
func TestArchiveTopRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()
		if _, err := p.Submit(ctx, req("app", 1), ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "app", reconciler.Running)
		calls := map[string]func() error{
			"StatPath": func() error { _, err := p.StatPath(ctx, "app", "/x"); return err },
			"CopyFrom": func() error { _, err := p.CopyFrom(ctx, "app", "/x", io.Discard); return err },
			"CopyTo":   func() error { return p.CopyTo(ctx, "app", "/", strings.NewReader(""), driver.CopyToOptions{}) },
			"Top":      func() error { _, err := p.Top(ctx, "app", ""); return err },
		}
		for name, call := range calls {
			if err := call(); !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), `provider "sim" (driver "sim")`) {
				t.Errorf("%s on a sim instance: %v, want ErrUnsupported naming the provider and driver", name, err)
			}
		}
		var fe *driver.FieldError
		if _, err := p.StatPath(ctx, "app", strings.Repeat("a", control.MaxArchivePath+1)); !errors.As(err, &fe) || fe.Path != "path" {
			t.Errorf("StatPath of a long path: %v, want a field error on path", err)
		}
		if _, err := p.StatPath(ctx, "app", "/a\x00b"); !errors.As(err, &fe) || fe.Path != "path" {
			t.Errorf("StatPath of a path with NUL: %v, want a field error on path", err)
		}
		if _, err := p.Top(ctx, "app", strings.Repeat("a", control.MaxTopArgs+1)); !errors.As(err, &fe) || fe.Path != "ps_args" {
			t.Errorf("Top with long ps options: %v, want a field error on ps_args", err)
		}
	})
}

// TestEventsHeld: the changes held in the store's history come first,
// each record with the time it was written, then caughtUp, then the
// changes that follow.
func TestEventsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if _, err := p.Submit(ctx, req("early", 1), ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "early", reconciler.Running)
		caught := make(chan struct{})
		type seen struct {
			id     string
			phase  reconciler.Phase
			caught bool
		}
		evs := make(chan seen, 1000)
		done := make(chan error, 1)
		go func() {
			done <- p.EventsHeld(ctx, func() { close(caught) }, func(ev control.Event) {
				if ev.Kind != control.EventInstance || ev.Deleted {
					return
				}
				select {
				case <-caught:
					evs <- seen{ev.Instance.ID, ev.Instance.Phase, true}
				default:
					if ev.Instance.Updated.IsZero() {
						t.Errorf("held change of %s has no time", ev.Instance.ID)
					}
					evs <- seen{ev.Instance.ID, ev.Instance.Phase, false}
				}
			})
		}()
		select {
		case <-caught:
		case <-time.After(10 * time.Second):
			t.Fatal("EventsHeld never caught up")
		}
		if _, err := p.Submit(ctx, req("late", 1), ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "late", reconciler.Running)
		time.Sleep(100 * time.Millisecond)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("EventsHeld returned %v, want context.Canceled", err)
		}
		close(evs)
		var earlyRunning, lateLive, lateHeld bool
		for s := range evs {
			switch {
			case s.id == "early" && !s.caught && s.phase == reconciler.Running:
				earlyRunning = true
			case s.id == "late" && s.caught:
				lateLive = true
			case s.id == "late" && !s.caught:
				lateHeld = true
			}
		}
		if !earlyRunning || !lateLive || lateHeld {
			t.Errorf("held: early running %v; after caught up: late %v; late before caught up %v", earlyRunning, lateLive, lateHeld)
		}
	})
}
