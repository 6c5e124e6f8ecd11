package control

import (
	"testing"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store"
)

// FuzzDecodeRecord reads random bytes as a stored instance: decodeRecord
// never panics, and what it reads the plane can keep (newRec), show
// (viewOf) and store again (encodeRecord), and that reads back. The seed
// corpus is in testdata/fuzz/FuzzDecodeRecord.
func FuzzDecodeRecord(f *testing.F) {
	shared := &driver.Spec{Image: "app:1", Resources: driver.Resources{CPU: 1000, Memory: driver.GiB}}
	lookup := func(req string) *driver.Spec {
		if req == "r" {
			return shared
		}
		return nil
	}
	in := &reconciler.Instance{ID: "r-0", Name: "r-0", Request: "r", Spec: shared, Phase: reconciler.Running, Provider: "sim", Node: "n1",
		Priority: 5, Attempts: 1, Observed: &reconciler.Seen{State: driver.StateRunning, Addresses: []string{"10.0.0.1"}}}
	for _, x := range []*reconciler.Instance{in, {ID: "r-1", Name: "web", Request: "r", Spec: shared, Message: "waits", Phase: reconciler.Pending}} {
		b, err := encodeRecord(x, shared)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"id":"x","priority":4611686018427387904,"spec":{"image":"x"}}`))
	f.Add([]byte(`{"n":"x","s":{"image":"x"},"pr":-9223372036854775808}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeRecord(store.KV{Key: PrefixInstances + "r-0", Value: b, ModRevision: 3}, lookup)
		if err != nil {
			return
		}
		r := newRec(got)
		back := r.instance()
		_ = viewOf(&back)
		again, err := encodeRecord(got, shared)
		if err != nil {
			t.Fatalf("decoded %q, then cannot store it: %v", b, err)
		}
		if _, err := decodeRecord(store.KV{Key: PrefixInstances + "r-0", Value: again, ModRevision: 4}, lookup); err != nil {
			t.Fatalf("decoded %q, stored it as %q, which does not read back: %v", b, again, err)
		}
	})
}
