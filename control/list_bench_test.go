package control_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store"
)

// BenchmarkInstancesPage lists pages out of 1,000,000 cached instances
// (random ids, ten owners, one in ten deleted): the first page, a page in
// the middle, a filtered page, and, to compare, everything at once.
func BenchmarkInstancesPage(b *testing.B) {
	const total = 1_000_000
	ctx := context.Background()
	_, prov := newSim(&testing.T{}, 1, nil)
	defer prov.Close(ctx)
	st := newMemory()
	defer st.Close()
	rnd := rand.New(rand.NewPCG(1, 2))
	created := time.Now()
	var mid string
	ops := make([]store.Op, 0, 1000)
	for i := range total {
		var id [8]byte
		for j := range id {
			id[j] = byte(rnd.Uint32())
		}
		in := reconciler.Instance{ID: hex.EncodeToString(id[:]), Owner: fmt.Sprintf("owner%d", i%10), Phase: reconciler.Failed, Created: created}
		if i%10 == 9 {
			in.Phase = reconciler.Deleted
		}
		if i == total/2 {
			mid = in.ID
		}
		v, err := json.Marshal(in)
		if err != nil {
			b.Fatal(err)
		}
		ops = append(ops, store.Put(control.PrefixInstances+in.ID, v))
		if len(ops) == cap(ops) {
			if _, err := st.Txn(ctx, nil, ops); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	p, err := control.New(ctx, config(st, prov))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		f    control.Filter
		want int
	}{
		{"first1000", control.Filter{Limit: 1000}, 1000},
		{"middle1000", control.Filter{Limit: 1000, After: mid}, 1000},
		{"owner1000", control.Filter{Limit: 1000, Owner: "owner3"}, 1000},
		{"first10000", control.Filter{Limit: 10000}, 10000},
		{"all", control.Filter{}, total * 9 / 10},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				list, err := p.Instances(ctx, c.f)
				if err != nil || len(list) != c.want {
					b.Fatalf("%d instances, %v; want %d", len(list), err, c.want)
				}
			}
		})
	}
}
