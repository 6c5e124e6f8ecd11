package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Group commit. Concurrent calls of Txn are merged into fewer etcd
// transactions: a call sent while maxInFlight transactions are already on
// their way waits in a queue, and the next transaction to leave carries
// every queued call it can (within the cluster's --max-txn-ops and
// --max-request-bytes). One etcd transaction costs its round trip, a
// Raft entry and an apply whatever it holds, so at a high rate of small
// writes (one per submitted request) merging is what lets the cluster
// keep up. A call that finds a free slot leaves at once: merging adds no
// wait.
//
// A merged transaction is what the calls would have been one after the
// other: each call is a transaction nested in it, whose comparisons etcd
// evaluates on their own, and calls join only when no key one of them
// writes is compared or written by another, so each call's comparisons
// see exactly what they would have seen alone. Every call of a merged
// transaction gets its revision and whether its own comparisons held; an
// error (the outcome unknown) goes to every call of it.

// maxInFlight is how many etcd transactions one Store has on their way at
// once. One gave the lowest latency of 1, 2, 4 and 8 for submissions at
// 2,000 a second to three members (BenchmarkSubmitSim1000/etcd3,
// docs/benchmarks.md), and end to end runs of w3 took as long: etcd's Raft
// already pipelines what one transaction carries, and a transaction that
// waits gathers the calls that queue behind it.
const maxInFlight = 1

// call is one Txn waiting for its outcome.
type call struct {
	cmps []clientv3.Cmp
	ops  []clientv3.Op
	// cmpKeys and opKeys are the keys the call compares and writes.
	cmpKeys []string
	opKeys  []string
	size    int // bytes, as Txn counts them against MaxRequestBytes
	done    chan outcome
}

// outcome is what one etcd transaction answered for a call.
type outcome struct {
	resp *clientv3.TxnResponse
	err  error
}

// batcher is the queue of calls and the count of transactions on their
// way. Its lock is a leaf: nothing else is locked while it is held.
type batcher struct {
	mu      sync.Mutex
	queue   []*call
	sending int
}

// send sends c through etcd, merged with other calls when some are
// waiting, and returns its outcome.
func (s *Store) send(ctx context.Context, c *call) outcome {
	c.done = make(chan outcome, 1)
	b := &s.batch
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if b.sending < maxInFlight {
		b.sending++
		batch := b.takeLocked(s.opts)
		b.mu.Unlock()
		// A goroutine sends the batch and goes on with what queues up
		// meanwhile until nothing waits, so that no caller waits for
		// others' transactions once it has its outcome. Close waits
		// for it.
		s.drains.Go(func() { s.drain(context.WithoutCancel(ctx), batch) })
	} else {
		b.mu.Unlock()
	}
	return <-c.done
}

// drain sends batch, then every batch that queued meanwhile, until the
// queue is empty.
func (s *Store) drain(ctx context.Context, batch []*call) {
	b := &s.batch
	for {
		s.sendBatch(ctx, batch)
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.sending--
			b.mu.Unlock()
			return
		}
		batch = b.takeLocked(s.opts)
		b.mu.Unlock()
	}
}

// takeLocked takes the calls at the head of the queue that one
// transaction can carry together, at least one.
func (b *batcher) takeLocked(opts Options) []*call {
	first := b.queue[0]
	// n counts each call's nested transaction too: etcd gives a nested
	// transaction what its parent leaves of --max-txn-ops.
	n, size := len(first.cmps)+len(first.ops)+1, first.size
	taken := 1
	var writes, compares map[string]bool
	for _, c := range b.queue[1:] {
		if n+len(c.cmps)+len(c.ops)+1 > opts.MaxTxnOps || size+c.size > opts.MaxRequestBytes {
			break
		}
		if writes == nil {
			writes, compares = map[string]bool{}, map[string]bool{}
			for _, k := range first.opKeys {
				writes[k] = true
			}
			for _, kr := range first.cmpKeys {
				compares[kr] = true
			}
		}
		if !c.fits(writes, compares) {
			// Later calls wait too: calls on one key leave in the order
			// they came.
			break
		}
		for _, k := range c.opKeys {
			writes[k] = true
		}
		for _, kr := range c.cmpKeys {
			compares[kr] = true
		}
		n += len(c.cmps) + len(c.ops) + 1
		size += c.size
		taken++
	}
	batch := make([]*call, taken)
	copy(batch, b.queue)
	rest := copy(b.queue, b.queue[taken:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

// fits reports whether c can join a transaction that writes the keys
// writes and compares the keys compares: it writes none of them and
// compares none of the written ones. Keys both only compare are read by
// both, which the order of the two does not change.
func (c *call) fits(writes, compares map[string]bool) bool {
	for _, k := range c.opKeys {
		if compares[k] || writes[k] {
			return false
		}
	}
	for _, kr := range c.cmpKeys {
		if writes[kr] {
			return false
		}
	}
	return true
}

// sendBatch sends the calls of batch as one etcd transaction and gives
// each its outcome. Each call is a transaction nested in it: etcd
// evaluates every nested transaction's comparisons against the state before
// any of them writes, and applies those whose comparisons hold, at one
// revision.
func (s *Store) sendBatch(ctx context.Context, batch []*call) {
	if len(batch) == 1 {
		batch[0].done <- s.txn(ctx, batch[0].cmps, batch[0].ops)
		return
	}
	nested := make([]clientv3.Op, len(batch))
	for i, c := range batch {
		nested[i] = clientv3.OpTxn(c.cmps, c.ops, nil)
	}
	o := s.txn(ctx, nil, nested)
	if errors.Is(o.err, rpctypes.ErrRequestTooLarge) || status.Code(o.err) == codes.ResourceExhausted {
		// Too large for the cluster (its --max-request-bytes lower
		// than the Store was told) or for the client's gRPC messages:
		// nothing was written, and each call alone is judged against
		// the limits on its own. (etcd counts --max-txn-ops for each
		// nested transaction apart: merging never exceeds it.)
		for _, c := range batch {
			c.done <- s.txn(ctx, c.cmps, c.ops)
		}
		return
	}
	if o.err == nil && len(o.resp.Responses) != len(batch) {
		o.err = fmt.Errorf("etcd answered %d nested transactions of %d", len(o.resp.Responses), len(batch))
	}
	for i, c := range batch {
		if o.err != nil {
			c.done <- o
			continue
		}
		r := o.resp.Responses[i].GetResponseTxn()
		if r == nil {
			c.done <- outcome{err: fmt.Errorf("etcd answered nested transaction %d of %d with %T", i, len(batch), o.resp.Responses[i].Response)}
			continue
		}
		c.done <- outcome{resp: &clientv3.TxnResponse{Header: o.resp.Header, Succeeded: r.Succeeded, Responses: r.Responses}}
	}
}

// txn sends one etcd transaction. Once sent it runs to its end even if
// ctx ends (within callTimeout), so that its outcome is known.
func (s *Store) txn(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) outcome {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	resp, err := s.c.Txn(wctx).If(cmps...).Then(ops...).Commit()
	return outcome{resp: resp, err: err}
}
