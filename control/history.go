package control

import (
	"context"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
)

// The hour of use the plane keeps of every measured instance, of every
// node of a provider that can measure (up to NodeHistories nodes) and of
// the cluster: one point per HistoryStep, up to HistoryPoints of them and
// none older than HistoryWindow. The newest point is the latest
// measurement: a measurement within HistoryStep of the point that opened
// the step replaces it. Kept in memory only, like the samples.
const (
	HistoryStep   = 30 * time.Second
	HistoryPoints = 120
	HistoryWindow = HistoryStep * HistoryPoints
	NodeHistories = 5000
)

// UsagePoint is one point of the hour of use: what was measured in use
// and what was reserved, at Time. A node's use counts each instance at
// its latest sample (NodeUsage); the cluster's is the sum of its nodes'.
type UsagePoint struct {
	Time           time.Time       `json:"time"`
	CPU            driver.MilliCPU `json:"cpus"`
	Memory         driver.Bytes    `json:"memory_bytes"`
	ReservedCPU    driver.MilliCPU `json:"reserved_cpus"`
	ReservedMemory driver.Bytes    `json:"reserved_memory_bytes"`
}

// point is a UsagePoint kept small: unix nanoseconds, MilliCPU and bytes.
type point struct{ at, cpu, mem, rcpu, rmem int64 }

// hour is one series of points, oldest first. open is when the newest
// point's step began.
type hour struct {
	pts  []point
	open int64
}

// put adds p: it replaces the newest point within its step, else opens a
// step, dropping the points that fell out of the window (and the oldest
// beyond HistoryPoints). A point older than the newest is ignored.
func (h *hour) put(p point) {
	if n := len(h.pts); n > 0 {
		last := &h.pts[n-1]
		if p.at < last.at {
			return
		}
		if p.at < h.open+int64(HistoryStep) {
			*last = p
			return
		}
	}
	h.open = p.at
	keep := h.pts
	for len(keep) > 0 && (keep[0].at <= p.at-int64(HistoryWindow) || len(keep) >= HistoryPoints) {
		keep = keep[1:]
	}
	if len(keep) < len(h.pts) {
		h.pts = append(h.pts[:0], keep...)
	}
	h.pts = append(h.pts, p)
}

// latest returns the newest point, if any.
func (h *hour) latest() (point, bool) {
	if len(h.pts) == 0 {
		return point{}, false
	}
	return h.pts[len(h.pts)-1], true
}

// points returns the points no older than HistoryWindow before now,
// oldest first.
func (h *hour) points(now time.Time) []UsagePoint {
	out := make([]UsagePoint, 0, len(h.pts))
	from := now.Add(-HistoryWindow).UnixNano()
	for _, p := range h.pts {
		if p.at < from {
			continue
		}
		out = append(out, UsagePoint{Time: time.Unix(0, p.at), CPU: driver.MilliCPU(p.cpu), Memory: driver.Bytes(p.mem),
			ReservedCPU: driver.MilliCPU(p.rcpu), ReservedMemory: driver.Bytes(p.rmem)})
	}
	return out
}

// UsageHour returns the instance's hour of use (see HistoryStep), oldest
// first; none when its provider cannot measure or it was not measured
// in the last hour.
func (p *Plane) UsageHour(ctx context.Context, ref string) ([]UsagePoint, error) {
	if err := p.refuse(); err != nil {
		return nil, err
	}
	in, err := p.find(ref)
	if err != nil {
		return nil, err
	}
	m := &p.meter
	m.usageMu.Lock()
	defer m.usageMu.Unlock()
	if r := m.rings[in.ID]; r != nil {
		return r.hour.points(p.now()), nil
	}
	return []UsagePoint{}, nil
}

// NodeUsageHour returns the hour of use of provider's node, oldest first;
// none when the provider cannot measure, or the node is past
// NodeHistories.
func (p *Plane) NodeUsageHour(provider, node string) []UsagePoint {
	m := &p.meter
	m.usageMu.Lock()
	defer m.usageMu.Unlock()
	if h := m.nodeHours[reconciler.NodeID(provider, node)]; h != nil {
		return h.points(p.now())
	}
	return []UsagePoint{}
}

// ClusterUsageHour returns the hour of use of the measured nodes
// together (those with an hour of their own: up to NodeHistories), oldest
// first.
func (p *Plane) ClusterUsageHour() []UsagePoint {
	m := &p.meter
	m.usageMu.Lock()
	defer m.usageMu.Unlock()
	return m.cluster.points(p.now())
}

// UsageMeasured returns a channel that is closed when the usage loop next
// ends a provider's round, so that a watcher can draw the new points.
func (p *Plane) UsageMeasured() <-chan struct{} {
	m := &p.meter
	m.usageMu.Lock()
	defer m.usageMu.Unlock()
	return m.measured
}

// recordHours adds this round's points of provider prov's nodes (use in
// sums, reservations in reserved, by node) and then the cluster's, and
// tells the watchers. usageMu is held.
func (m *meter) recordHours(prov string, now time.Time, sums map[string]NodeUsage, reserved map[string][2]int64) {
	at := now.UnixNano()
	for key := range m.nodeHours {
		if p, _ := splitNodeID(key); p == prov {
			if _, ok := sums[key]; !ok {
				delete(m.nodeHours, key)
			}
		}
	}
	for key, n := range sums {
		h := m.nodeHours[key]
		if h == nil {
			if len(m.nodeHours) >= NodeHistories {
				continue
			}
			h = &hour{}
			m.nodeHours[key] = h
		}
		_, node := splitNodeID(key)
		r := reserved[node]
		h.put(point{at: at, cpu: int64(n.CPU), mem: n.MemoryBytes, rcpu: r[0], rmem: r[1]})
	}
	var total point
	for _, h := range m.nodeHours {
		if p, ok := h.latest(); ok {
			total.cpu, total.mem, total.rcpu, total.rmem = total.cpu+p.cpu, total.mem+p.mem, total.rcpu+p.rcpu, total.rmem+p.rmem
		}
	}
	total.at = at
	m.cluster.put(total)
	close(m.measured)
	m.measured = make(chan struct{})
}
