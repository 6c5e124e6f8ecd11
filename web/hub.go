package web

import (
	"sync"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/reconciler"
)

// Bounds of the hub.
const (
	// subscriberBuffer is how many events a stream may lag behind; a
	// stream further behind is ended (the browser reconnects and renders
	// afresh).
	subscriberBuffer = 256
	// historyPerInstance is how many changes are kept per instance.
	historyPerInstance = 32
	// maxHistories caps the instances with a history; past it, the
	// histories of deleted instances go first, then any.
	maxHistories = 100_000
)

// change is one change of an instance as the dashboard shows it: no spec.
type change struct {
	At       time.Time     `json:"at"`
	Revision int64         `json:"revision"`
	Phase    control.Phase `json:"phase"`
	Node     string        `json:"node,omitempty"`
	Message  string        `json:"message,omitempty"`
}

// hub fans the plane's events out to the open streams and keeps each
// instance's recent changes.
type hub struct {
	mu   sync.Mutex // guards subs and hist
	subs map[chan control.Event]struct{}
	hist map[string][]change
}

func newHub() *hub {
	return &hub{subs: map[chan control.Event]struct{}{}, hist: map[string][]change{}}
}

// subscribe returns a channel of events; the hub closes it when the
// subscriber falls behind. cancel ends the subscription.
func (h *hub) subscribe() (ch chan control.Event, cancel func()) {
	ch = make(chan control.Event, subscriberBuffer)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := h.subs[ch]; ok {
			delete(h.subs, ch)
			close(ch)
		}
	}
}

// publish records ev and hands it to every subscriber.
func (h *hub) publish(ev control.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ev.Kind == control.EventInstance && ev.Instance != nil {
		h.record(ev)
		// Subscribers get the event without the spec: they never need it.
		in := *ev.Instance
		in.Spec = nil
		ev.Instance = &in
	}
	for ch := range h.subs {
		select {
		case ch <- ev:
		default:
			delete(h.subs, ch)
			close(ch)
		}
	}
}

// record adds ev to its instance's history when the phase, node or message
// changed. h.mu is held.
func (h *hub) record(ev control.Event) {
	in := ev.Instance
	if ev.Deleted {
		delete(h.hist, in.ID)
		return
	}
	list := h.hist[in.ID]
	if n := len(list); n > 0 && list[n-1].Phase == in.Phase && list[n-1].Message == in.Message && list[n-1].Node == in.Node {
		return
	}
	if list == nil && len(h.hist) >= maxHistories {
		h.evict()
	}
	at := in.Updated
	if at.IsZero() {
		at = time.Now()
	}
	list = append(list, change{At: at, Revision: ev.Revision, Phase: in.Phase, Node: in.Node, Message: in.Message})
	if len(list) > historyPerInstance {
		list = append(list[:0:0], list[len(list)-historyPerInstance:]...)
	}
	h.hist[in.ID] = list
}

// evict forgets a tenth of the histories, deleted instances first.
// h.mu is held.
func (h *hub) evict() {
	n := maxHistories / 10
	for id, l := range h.hist {
		if n == 0 {
			return
		}
		if l[len(l)-1].Phase == reconciler.Deleted {
			delete(h.hist, id)
			n--
		}
	}
	for id := range h.hist {
		if n == 0 {
			return
		}
		delete(h.hist, id)
		n--
	}
}

// history returns a copy of the instance's recorded changes, oldest first.
func (h *hub) history(id string) []change {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]change(nil), h.hist[id]...)
}

// reset ends every subscription (their browsers reconnect and render
// afresh) after the event watch broke.
func (h *hub) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		delete(h.subs, ch)
		close(ch)
	}
}
