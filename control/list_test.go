package control_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/store/memory"
)

// pages lists f page by page (pages of limit) until a page comes back
// short, checking that every page holds at most limit instances.
func pages(t *testing.T, p *control.Plane, f control.Filter, limit int) []control.Instance {
	t.Helper()
	var all []control.Instance
	f.Limit = limit
	for n := 0; ; n++ {
		page, err := p.Instances(context.Background(), f)
		if err != nil {
			t.Fatalf("page %d: %v", n, err)
		}
		if len(page) > limit {
			t.Fatalf("page %d holds %d instances, more than the limit %d", n, len(page), limit)
		}
		all = append(all, page...)
		if len(page) < limit {
			return all
		}
		f.After = page[len(page)-1].ID
	}
}

// TestInstancesPages pages through 2,500 instances of two owners: every
// instance comes exactly once, in id order, and the filters hold on every
// page.
func TestInstancesPages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 50, nil)
		p, err := control.New(context.Background(), config(memory.New(memory.Options{}), prov))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for _, sub := range []struct {
			id, owner string
			count     int
		}{{"a", "alice", 1500}, {"b", "bob", 1000}} {
			r := req(sub.id, sub.count)
			r.CPU, r.Memory = driver.CPUs(0.01), driver.MiB
			if _, err := p.Submit(ctx, r, sub.owner); err != nil {
				t.Fatal(err)
			}
		}

		whole, err := p.Instances(ctx, control.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(whole) != 2500 {
			t.Fatalf("%d instances without a limit, want 2500", len(whole))
		}
		if !slices.IsSortedFunc(whole, func(a, b control.Instance) int { return strings.Compare(a.ID, b.ID) }) {
			t.Fatal("the unlimited list is not sorted by id")
		}
		for _, c := range []struct {
			name  string
			f     control.Filter
			owner string
			want  int
		}{
			{"all", control.Filter{}, "", 2500},
			{"alice", control.Filter{Owner: "alice"}, "alice", 1500},
			{"bob", control.Filter{Owner: "bob"}, "bob", 1000},
			{"request b", control.Filter{Request: "b"}, "bob", 1000},
			{"nobody", control.Filter{Owner: "nobody"}, "", 0},
		} {
			for _, limit := range []int{1000, 7} {
				got := pages(t, p, c.f, limit)
				seen := map[string]bool{}
				for i, in := range got {
					if seen[in.ID] {
						t.Fatalf("%s, pages of %d: %s listed twice", c.name, limit, in.ID)
					}
					seen[in.ID] = true
					if i > 0 && got[i-1].ID >= in.ID {
						t.Fatalf("%s, pages of %d: %s after %s, not in id order", c.name, limit, in.ID, got[i-1].ID)
					}
					if c.owner != "" && in.Owner != c.owner {
						t.Fatalf("%s, pages of %d: %s of owner %q listed", c.name, limit, in.ID, in.Owner)
					}
				}
				if len(got) != c.want {
					t.Fatalf("%s, pages of %d: %d instances, want %d", c.name, limit, len(got), c.want)
				}
				if c.name == "all" && !slices.EqualFunc(got, whole, func(a, b control.Instance) bool { return a.ID == b.ID }) {
					t.Fatalf("pages of %d differ from the unlimited list", limit)
				}
			}
		}

		if got, err := p.Instances(ctx, control.Filter{After: whole[len(whole)-1].ID}); err != nil || len(got) != 0 {
			t.Fatalf("after the last id: %d instances, %v; want none", len(got), err)
		}
		if got, err := p.Instances(ctx, control.Filter{After: whole[9].ID, Limit: 3}); err != nil || len(got) != 3 || got[0].ID != whole[10].ID || got[2].ID != whole[12].ID {
			t.Fatalf("3 after the 10th: %v %v", ids(got), err)
		}
		_, err = p.Instances(ctx, control.Filter{Limit: -1})
		var fe *driver.FieldError
		if !errors.As(err, &fe) || fe.Path != "limit" || !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("limit -1: %v, want a FieldError on limit", err)
		}
	})
}
