package sim

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
)

// Call is one change asked of the sim, as Calls reports it.
type Call struct {
	// Op is create, delete, resize, start, stop, restart, kill, suspend,
	// resume, preload, set_node_status or set_node_unlisted.
	Op string
	// Node is the node concerned, when known.
	Node string
	// Instance is the instance id; empty for a create that failed before an
	// instance existed.
	Instance string
	// Name is the instance name a create asked for.
	Name string
	// Detail holds the signal of a kill, the image of a preload, the
	// status of set_node_status or "unlisted" / "listed" for
	// set_node_unlisted.
	Detail string
	// Time is the sim clock's time of the call.
	Time time.Time
	// Err is the outcome known when the call was made (a create's injected
	// fault, a refusal), nil otherwise.
	Err error
}

// callLog keeps the last max calls in a ring. A call on a live instance
// keeps its slot and generation, and its id is formatted only when read.
type callLog struct {
	max   int
	buf   []callRec
	next  int
	total int
}

type callRec struct {
	Call
	slot, gen uint32
	ref       bool
}

func (l *callLog) add(c Call) { l.put(callRec{Call: c}) }

func (l *callLog) addRef(c Call, slot, gen uint32) {
	l.put(callRec{Call: c, slot: slot, gen: gen, ref: true})
}

func (l *callLog) put(r callRec) {
	if l.max == 0 {
		return
	}
	if len(l.buf) < l.max {
		l.buf = append(l.buf, r)
	} else {
		l.buf[l.next] = r
	}
	l.next = (l.next + 1) % l.max
	l.total++
}

// Calls returns the most recent calls (at most the call_log option), oldest
// first. Reads (State, Get, Find, List, Logs ...) are not recorded.
func (s *Sim) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := &s.calls
	recs := l.buf
	if len(l.buf) == l.max {
		recs = append(slices.Clone(l.buf[l.next:]), l.buf[:l.next]...)
	}
	out := make([]Call, len(recs))
	for i, r := range recs {
		out[i] = r.Call
		if r.ref {
			out[i].Instance = s.formatID(r.slot, r.gen)
		}
	}
	return out
}

// CallCount returns how many calls have been recorded in all, including
// those the ring has dropped.
func (s *Sim) CallCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls.total
}

// SetNodeStatus overrides the status of node name until called again;
// status "" returns the node to the offline_rate draw. While a node is
// offline, creates on it fail with ErrRetryable, deletes with
// ErrDeleteFailed, other instance calls with ErrRetryable, and its instances
// are reported in state unknown. Draining refuses creates only. Watchers
// see an EventNode; the changes offline_rate draws are not reported as
// events (they happen only when looked at), only in State.
func (s *Sim) SetNodeStatus(name string, status driver.NodeStatus, reason string) error {
	switch status {
	case "", driver.NodeOnline, driver.NodeOffline, driver.NodeDraining:
	default:
		return &driver.FieldError{Path: "status", Reason: string(status) + ": want online, offline, draining or empty"}
	}
	now, err := s.enter()
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	i, err := s.findNode(name)
	if err != nil {
		return err
	}
	n := &s.nodes[i]
	n.override, n.reason = status, reason
	if n.reason == "" && status != "" && status != driver.NodeOnline {
		n.reason = string(status)
	}
	s.calls.add(Call{Op: "set_node_status", Node: name, Detail: string(status), Time: time.Unix(0, now)})
	st, msg := s.nodeStatus(i, now)
	s.emitNode(name, st, msg, now)
	return nil
}

// SetNodeUnlisted makes List leave out the instances on node name until
// called again with false, as a back-end that cannot reach one of its
// engines does: List then returns the instances of the other nodes with a
// *driver.PartialListError naming every unlisted node. The node's status
// and every other call, Get included, are unchanged, and watchers see no
// event.
func (s *Sim) SetNodeUnlisted(name string, unlisted bool) error {
	now, err := s.enter()
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	i, err := s.findNode(name)
	if err != nil {
		return err
	}
	n := &s.nodes[i]
	detail := "listed"
	if unlisted {
		detail = "unlisted"
	}
	if n.unlisted != unlisted {
		n.unlisted = unlisted
		if unlisted {
			s.unlisted++
		} else {
			s.unlisted--
		}
	}
	s.calls.add(Call{Op: "set_node_unlisted", Node: name, Detail: detail, Time: time.Unix(0, now)})
	return nil
}

// partialLocked returns the error of a List that left out the unlisted
// nodes, named in sorted order.
func (s *Sim) partialLocked() error {
	var names []string
	for i := range s.nodes {
		if s.nodes[i].unlisted {
			names = append(names, s.nodes[i].name)
		}
	}
	slices.Sort(names)
	return &driver.PartialListError{Nodes: names, Err: errors.New("sim: " + strings.Join(names, ", ") + ": unlisted (SetNodeUnlisted)")}
}

// Timers: the sim's pending transitions, a binary min-heap on time.

const (
	dueReady uint8 = iota + 1 // a create finishes
	dueGone                   // a delete finishes
)

type timer struct {
	at        int64
	slot, gen uint32
	kind      uint8
}

type timers []timer

func (h *timers) push(t timer) {
	*h = append(*h, t)
	a := *h
	i := len(a) - 1
	for i > 0 {
		p := (i - 1) / 2
		if a[p].at <= a[i].at {
			break
		}
		a[p], a[i] = a[i], a[p]
		i = p
	}
}

// find returns when the timer of kind for slot and gen is due, 0 when
// there is none.
func (h timers) find(slot, gen uint32, kind uint8) int64 {
	for _, t := range h {
		if t.slot == slot && t.gen == gen && t.kind == kind {
			return t.at
		}
	}
	return 0
}

func (h *timers) pop() timer {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a = a[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(a) && a[l].at < a[m].at {
			m = l
		}
		if r < len(a) && a[r].at < a[m].at {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}

// Events.

// watcher is one Watch call's queue.
type watcher struct {
	queue  []driver.Event
	signal chan struct{} // holds one token when the queue has news
}

func (s *Sim) emit(slot uint32, in *inst, typ driver.EventType, at int64) {
	if len(s.watch) == 0 {
		s.changedLocked()
		return
	}
	e := driver.Event{
		Type:     typ,
		Instance: s.formatID(slot, in.gen),
		Node:     s.nodes[in.node].name,
		State:    stateNames[in.state],
		Message:  in.message(),
		Tags:     s.tagsOf(slot, in),
		Time:     time.Unix(0, at),
	}
	if typ == driver.EventDelete {
		e.State = ""
	}
	s.send(e)
}

func (s *Sim) emitNode(name string, st driver.NodeStatus, reason string, at int64) {
	s.send(driver.Event{Type: driver.EventNode, Node: name, Message: string(st) + " " + reason, Time: time.Unix(0, at)})
}

func (s *Sim) send(e driver.Event) {
	for _, w := range s.watch {
		w.queue = append(w.queue, e)
		select {
		case w.signal <- struct{}{}:
		default:
		}
	}
	s.changedLocked()
}

// Watch calls fn, in order, for every instance and node change from the
// moment it is called until ctx ends (it returns ctx's error) or the sim is
// closed (ErrPermanent). fn runs on the caller's goroutine and may call the
// sim.
func (s *Sim) Watch(ctx context.Context, fn func(driver.Event)) error {
	if _, err := s.enter(); err != nil {
		return err
	}
	w := &watcher{signal: make(chan struct{}, 1)}
	s.watch = append(s.watch, w)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for i, x := range s.watch {
			if x == w {
				s.watch = append(s.watch[:i], s.watch[i+1:]...)
				break
			}
		}
		s.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return driver.Errorf(driver.ErrPermanent, "sim: the driver is closed")
		case <-w.signal:
		}
		s.mu.Lock()
		batch := w.queue
		w.queue = nil
		s.mu.Unlock()
		for _, e := range batch {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fn(e)
		}
	}
}
