package memory

import (
	"context"
	"fmt"
	"testing"

	"github.com/berth-dev/berth/store"
)

// benchTxnFullHistory measures one-key Txns on a store whose change history
// is already full, so every Txn moves the compact revision.
func benchTxnFullHistory(b *testing.B, history int) {
	s := New(Options{History: history})
	defer s.Close()
	ctx := context.Background()
	value := make([]byte, 256)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("/bench/%04d", i)
	}
	for i := range 2 * history {
		if _, err := s.Txn(ctx, nil, []store.Op{store.Put(keys[i%len(keys)], value)}); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; b.Loop(); i++ {
		if _, err := s.Txn(ctx, nil, []store.Op{store.Put(keys[i%len(keys)], value)}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTxnFullHistory1k(b *testing.B)   { benchTxnFullHistory(b, 1000) }
func BenchmarkTxnFullHistory10k(b *testing.B)  { benchTxnFullHistory(b, DefaultHistory) }
func BenchmarkTxnFullHistory100k(b *testing.B) { benchTxnFullHistory(b, 100_000) }
