package control

import (
	"context"
	"sync"
	"time"

	"github.com/berth-dev/berth/reconciler"
)

// victims are the instances evicted to make room for a group (scheduler
// Plan.Evicted) whose back-end copies may still hold that room: the ledger
// gave it to the group at once, the back-end frees it only when their
// deletes are done. The group's creates on their nodes wait until then
// (workCreate; at most until their launch deadline), rather than reach a
// back-end that would refuse them for lack of capacity and have their node
// excluded. mu is a leaf.
type victims struct {
	mu     sync.Mutex
	node   map[string]string // victim id → its node ("provider/node")
	onNode map[string]int    // victims per node
}

// victimPoll is how often a create that waits for victims looks again.
const victimPoll = 20 * time.Millisecond

// evict records ids, instances just evicted, as victims on their nodes,
// and returns what forgets them (when they are not to be deleted after
// all).
func (s placer) evict(ids []string) (forget func()) {
	if len(ids) == 0 {
		return func() {}
	}
	type victim struct{ id, node string }
	var vs []victim
	for _, id := range ids {
		if in, ok := s.get(id); ok && in.Phase.HoldsNode() && in.Node != "" {
			vs = append(vs, victim{id, reconciler.NodeID(in.Provider, in.Node)})
		}
	}
	v := &s.victims
	v.mu.Lock()
	if v.node == nil {
		v.node, v.onNode = map[string]string{}, map[string]int{}
	}
	for _, x := range vs {
		if _, dup := v.node[x.id]; !dup {
			v.node[x.id] = x.node
			v.onNode[x.node]++
		}
	}
	v.mu.Unlock()
	return func() {
		for _, x := range vs {
			s.victimGone(x.id)
		}
	}
}

// deleteVictims deletes the victims ids (recorded by evict); one whose
// delete cannot be asked for is forgotten, so that nothing waits for it.
func (s placer) deleteVictims(ctx context.Context, ids []string) {
	for _, id := range ids {
		if err := s.verbs.delete(ctx, id); err != nil {
			s.victimGone(id)
		}
	}
}

// victimGone forgets victim id: its back-end copy is gone, or it is not
// to be deleted.
func (s placer) victimGone(id string) {
	v := &s.victims
	v.mu.Lock()
	defer v.mu.Unlock()
	node, ok := v.node[id]
	if !ok {
		return
	}
	delete(v.node, id)
	if v.onNode[node]--; v.onNode[node] == 0 {
		delete(v.onNode, node)
	}
}

// victimsOn reports whether victims still hold room on node
// ("provider/node").
func (s placer) victimsOn(node string) bool {
	v := &s.victims
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.onNode[node] > 0
}
