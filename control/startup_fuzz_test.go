package control_test

import (
	"context"
	"testing"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/memory"
)

// FuzzStartup starts a plane on a store that holds a good request and its
// instance, and two records of random bytes under keys of the plane's
// (instances, requests, groups, either copy of the cluster's identity):
// New never panics and never refuses to start (but when both copies of
// the identity are lost: see loadIdentity), the good instance is there unless a random record took its key,
// and the plane lists, reads and places what it took. The seed corpus is
// in testdata/fuzz/FuzzStartup.
func FuzzStartup(f *testing.F) {
	// The good records, as a plane stores them.
	var good []store.KV
	prefixes := []string{control.PrefixInstances, control.PrefixRequests, control.PrefixGroups}
	f.Add(uint8(0), "cut", []byte("\x01\x00\x05abc"), uint8(1), "r", []byte(`{"request":{"id":"r","image":"x","priority":4611686018427387904}}`))
	f.Add(uint8(0), "good", []byte(`{"id":"good","priority":1,"spec":{"image":"x"},"phase":"nonsense"}`), uint8(2), "g", []byte(`{"id":"g","services":[{"image":"x","count":-5}]}`))
	f.Add(uint8(3), "", []byte(`{"id":`), uint8(1), "r", []byte(`{}`))
	f.Add(uint8(0), "x", []byte(`{"n":"x","s":{"image":"x","cpus":-1},"ph":"running","p":"sim","nd":"nowhere"}`), uint8(1), "good", []byte(`{"request":{"id":"good","count":1000000000}}`))
	f.Fuzz(func(t *testing.T, k1 uint8, key1 string, v1 []byte, k2 uint8, key2 string, v2 []byte) {
		ctx := context.Background()
		_, prov := newSim(t, 2, nil)
		st := memory.New(memory.Options{})
		defer st.Close()
		cfg := config(st, prov)
		if good == nil {
			p, err := control.New(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Submit(ctx, req("good", 1), "alice"); err != nil {
				t.Fatal(err)
			}
			for _, prefix := range prefixes[:2] {
				kvs, _, err := st.List(ctx, prefix)
				if err != nil {
					t.Fatal(err)
				}
				good = append(good, kvs...)
			}
			for _, key := range []string{control.KeyCluster, control.KeyClusterCopy} {
				kv, err := st.Get(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				good = append(good, kv)
			}
		} else {
			for _, kv := range good {
				if _, err := st.Txn(ctx, nil, []store.Op{store.Put(kv.Key, kv.Value)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		took := map[string]bool{}
		for _, r := range []struct {
			kind  uint8
			key   string
			value []byte
		}{{k1, key1, v1}, {k2, key2, v2}} {
			// Kinds 3 and 4 are the two copies of the cluster's identity.
			key := map[int]string{3: control.KeyCluster, 4: control.KeyClusterCopy}[int(r.kind)%5]
			if key == "" {
				key = prefixes[int(r.kind)%5%len(prefixes)] + r.key
			}
			took[key] = true
			if _, err := st.Txn(ctx, nil, []store.Op{store.Put(key, r.value)}); err != nil {
				return // a key or value the store refuses
			}
		}
		p, err := control.New(ctx, cfg)
		if err != nil && took[control.KeyCluster] && took[control.KeyClusterCopy] {
			return // both copies of the identity lost, with instances stored: refused by design
		}
		if err != nil {
			t.Fatalf("start on records %q=%q and %q=%q: %v", key1, v1, key2, v2, err)
		}
		if !took[control.PrefixInstances+"good"] && !took[control.PrefixRequests+"good"] {
			if _, err := p.Instance(ctx, "good"); err != nil {
				t.Fatalf("start on records %q=%q and %q=%q lost the good instance: %v", key1, v1, key2, v2, err)
			}
		}
		ins, err := p.Instances(ctx, control.Filter{All: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range ins {
			if _, err := p.Instance(ctx, in.ID); err != nil {
				t.Fatalf("listed %s, which does not read: %v", in.ID, err)
			}
		}
		p.PlaceOnce(ctx)
		if _, err := p.Quarantined(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
