package scheduler

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/berth-dev/berth/driver"
)

// Policy orders groups of the same priority class in a Queue (Zoe).
type Policy string

// Queue policies.
const (
	// PolicyFIFO serves groups in arrival order.
	PolicyFIFO Policy = "fifo"
	// PolicySize serves the smallest group first (size: the essential
	// instances' share of the cluster's cpu plus their share of its memory).
	PolicySize Policy = "size"
	// PolicyDynSize is SIZE with aging: a group's size is divided by
	// 1 + waited/Aging, so big groups are not passed over for ever.
	PolicyDynSize Policy = "dynsize"
)

// Policies lists the queue policies.
var Policies = []Policy{PolicyFIFO, PolicySize, PolicyDynSize}

// Check returns a field error at path unless p is one of Policies or
// empty (the default, fifo).
func (p Policy) Check(path string) error {
	if p == "" || slices.Contains(Policies, p) {
		return nil
	}
	return &driver.FieldError{Path: path, Reason: fmt.Sprintf("%q: want fifo, size or dynsize", p)}
}

// DefaultAging is the DYNSIZE aging period when Queue.Aging is zero.
const DefaultAging = time.Minute

// Queue holds groups waiting for room. Higher priority classes go first;
// within a class Policy decides. A pass (Cluster.Schedule) tries every group
// in order and places each that fits, so a big group at the head does not
// starve small ones behind it that fit (backfill), unless Strict is set.
// The clock is the caller's: every method that needs the time takes it.
// A Queue is not safe for concurrent use.
type Queue struct {
	Policy Policy
	// Aging is the DYNSIZE aging period; 0 means DefaultAging.
	Aging time.Duration
	// Strict stops a pass at the first group that does not fit.
	Strict bool

	items []*QueueItem
	seq   uint64
}

// QueueItem is one waiting group.
type QueueItem struct {
	Group   *Group
	Arrived time.Time
	seq     uint64
}

// Push adds g, which must be valid, as arrived at now.
func (q *Queue) Push(g *Group, now time.Time) error {
	if err := g.Validate(); err != nil {
		return err
	}
	if err := q.Policy.Check("policy"); err != nil {
		return err
	}
	q.seq++
	q.items = append(q.items, &QueueItem{Group: g, Arrived: now, seq: q.seq})
	return nil
}

// Len returns how many groups wait.
func (q *Queue) Len() int { return len(q.items) }

// IDs returns the ids of the waiting groups, in arrival order.
func (q *Queue) IDs() []string {
	out := make([]string, len(q.items))
	for k, it := range q.items {
		out[k] = it.Group.ID
	}
	return out
}

// Remove drops the group with id; it reports whether it was queued.
func (q *Queue) Remove(id string) bool {
	for k, it := range q.items {
		if it.Group.ID == id {
			q.items = slices.Delete(q.items, k, k+1)
			return true
		}
	}
	return false
}

// groupPriority is the group's priority class: its own, else the highest of
// its services'.
func groupPriority(g *Group) int {
	if g.Priority != 0 {
		return g.Priority
	}
	p := 0
	for k, s := range g.Services {
		if k == 0 || s.Priority > p {
			p = s.Priority
		}
	}
	return p
}

// groupSize is the essential instances' share of total cpu plus share of
// total memory.
func groupSize(g *Group, total driver.Resources) float64 {
	var cpu, mem float64
	for k := range g.Services {
		s := &g.Services[k]
		n := float64(s.EssentialCount())
		cpu += n * float64(s.CPU)
		mem += n * float64(s.Memory)
	}
	var sz float64
	if total.CPU > 0 {
		sz += cpu / float64(total.CPU)
	}
	if total.Memory > 0 {
		sz += mem / float64(total.Memory)
	}
	return sz
}

// Order returns the waiting groups in the order a pass at now tries them,
// given the cluster's total capacity (for sizes).
func (q *Queue) Order(now time.Time, total driver.Resources) []*QueueItem {
	aging := q.Aging
	if aging <= 0 {
		aging = DefaultAging
	}
	size := func(it *QueueItem) float64 {
		s := groupSize(it.Group, total)
		if q.Policy == PolicyDynSize {
			waited := max(now.Sub(it.Arrived), 0)
			s /= 1 + float64(waited)/float64(aging)
		}
		return s
	}
	out := slices.Clone(q.items)
	sizes := make(map[*QueueItem]float64, len(out))
	if q.Policy == PolicySize || q.Policy == PolicyDynSize {
		for _, it := range out {
			sizes[it] = size(it)
		}
	}
	slices.SortStableFunc(out, func(a, b *QueueItem) int {
		if c := cmp.Compare(groupPriority(b.Group), groupPriority(a.Group)); c != 0 {
			return c
		}
		if c := cmp.Compare(sizes[a], sizes[b]); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	return out
}

// Scheduled is one group a pass placed.
type Scheduled struct {
	Group *Group
	Plan  *Plan
}

// Schedule makes one pass over q at now: it tries each group in order with
// PlaceGroup and removes those whose essential instances were placed. It
// returns what it placed; the rest stay queued. Invalid groups cannot be
// queued, so PlaceGroup errors do not occur here except for an instance id
// already allocated, which drops that group from the queue and returns its
// error (joined with any others).
func (c *Cluster) Schedule(q *Queue, now time.Time) ([]Scheduled, error) {
	return c.ScheduleQueues([]*Queue{q}, now)
}

// ScheduleQueues makes one pass over several queues, as Schedule does over
// one: priority classes go first across the queues, highest first; within
// a class each queue keeps its own order (its policy) and the queues take
// their turns in the order given, the first queue's groups of a class
// before the second's. A Strict queue stops at its first group that does
// not fit; the others go on.
func (c *Cluster) ScheduleQueues(qs []*Queue, now time.Time) ([]Scheduled, error) {
	// The groups are compiled first; the pass itself holds the lock
	// throughout, so that what frees up meanwhile (a release) waits for
	// the next pass rather than reaching the groups behind one that was
	// tried before it: the order of the queues holds.
	type compiledGroup struct {
		gg  *gang
		err error
	}
	compiled := map[*Group]compiledGroup{}
	for _, q := range qs {
		for _, it := range q.items {
			cg := compiledGroup{err: it.Group.Validate()}
			if cg.err == nil {
				cg.gg, cg.err = compileGroup(it.Group)
			}
			compiled[it.Group] = cg
		}
	}
	var errs []error
	c.mu.Lock()
	defer c.mu.Unlock()
	total := c.totalCapacityLocked()
	orders := make([][]*QueueItem, len(qs))
	for k, q := range qs {
		orders[k] = q.Order(now, total)
	}
	var out []Scheduled
	for {
		// The queue whose next group has the highest class.
		k := -1
		for j := range orders {
			if len(orders[j]) == 0 {
				continue
			}
			if k < 0 || groupPriority(orders[j][0].Group) > groupPriority(orders[k][0].Group) {
				k = j
			}
		}
		if k < 0 {
			break
		}
		it, q := orders[k][0], qs[k]
		orders[k] = orders[k][1:]
		cg := compiled[it.Group]
		plan, err := (*Plan)(nil), cg.err
		if err == nil {
			plan, err = c.placeGroupLocked(it.Group, cg.gg)
		}
		if err != nil {
			q.Remove(it.Group.ID)
			errs = append(errs, fmt.Errorf("group %q: %w", it.Group.ID, err))
			continue
		}
		if c.essentialMissing(plan) {
			if q.Strict {
				orders[k] = nil
			}
			continue
		}
		q.Remove(it.Group.ID)
		out = append(out, Scheduled{Group: it.Group, Plan: plan})
	}
	return out, errors.Join(errs...)
}

// totalCapacityLocked is the capacity of every node, with c.mu held.
func (c *Cluster) totalCapacityLocked() driver.Resources {
	t := c.st.totCap
	return driver.Resources{CPU: driver.MilliCPU(t[resCPU]), Memory: driver.Bytes(t[resMem]), Disk: driver.Bytes(t[resDisk]), GPUs: t[resGPU]}
}
