package scheduler

import (
	"math"
	"strconv"

	"github.com/berth-dev/berth/driver"
)

// Overcommit policies.
const (
	// PolicyReservations admits an instance on a node when the node's
	// reservations plus the instance's fit its capacity. The default.
	PolicyReservations = "reservations"
	// PolicyUsage admits an instance on a node when what the node's
	// instances were measured using, plus a headroom, plus the instance's
	// reservation fit the capacity, and the reservations stay within a
	// ratio of the capacity.
	PolicyUsage = "usage"
)

// MaxOvercommitRatio bounds Overcommit.Ratio.
const MaxOvercommitRatio = 10

// nMeasured is how many resource columns are measured: cpu and memory
// (resCPU and resMem come first). Disk, GPUs and named resources are
// always admitted by reservations.
const nMeasured = 2

// Overcommit is how a provider's nodes admit new instances, for cpu and
// memory; disk, GPUs, named resources, ports and the instance cap are
// always counted by reservation.
//
// Under PolicyReservations (or an empty Policy) a node takes an instance
// when, per resource, the larger of what the back-end reports reserved and
// what Berth allocated, plus the instance's reservation, fits the capacity.
//
// Under PolicyUsage a node takes an instance when, for cpu and for memory,
// both hold:
//
//	measured + Headroom × capacity + reservation ≤ capacity
//	reserved + reservation ≤ Ratio × capacity
//
// where measured is what the node's instances were last measured using
// (Cluster.SetMeasured) plus the reservations of the instances placed there
// since, and reserved is counted as under PolicyReservations.
type Overcommit struct {
	// Policy is PolicyReservations (the default when empty) or
	// PolicyUsage.
	Policy string `json:"policy,omitempty" yaml:"policy"`
	// Ratio caps the reservations at Ratio × capacity under PolicyUsage:
	// 1 to MaxOvercommitRatio; 0 means 1.
	Ratio float64 `json:"ratio,omitempty" yaml:"ratio"`
	// Headroom is the share of the capacity kept free of measured use
	// under PolicyUsage: 0 (none) up to, not including, 1.
	Headroom float64 `json:"headroom,omitempty" yaml:"headroom"`
}

// Check checks o's fields; field is its path in the errors.
func (o *Overcommit) Check(field string) driver.FieldErrors {
	var es driver.FieldErrors
	switch o.Policy {
	case "", PolicyReservations:
		if o.Ratio != 0 {
			es.Add(field+".ratio", "applies to policy usage only")
		}
		if o.Headroom != 0 {
			es.Add(field+".headroom", "applies to policy usage only")
		}
		return es
	case PolicyUsage:
	default:
		es.Add(field+".policy", "%q: want reservations (the default) or usage", o.Policy)
		return es
	}
	if math.IsNaN(o.Ratio) || o.Ratio != 0 && (o.Ratio < 1 || o.Ratio > MaxOvercommitRatio) {
		es.Add(field+".ratio", "%v: want 1 to %d (0 means 1)", o.Ratio, MaxOvercommitRatio)
	}
	if math.IsNaN(o.Headroom) || o.Headroom < 0 || o.Headroom >= 1 {
		es.Add(field+".headroom", "%v: want 0 or more and less than 1", o.Headroom)
	}
	return es
}

// Usage reports whether o admits by measured usage.
func (o *Overcommit) Usage() bool { return o.Policy == PolicyUsage }

// ratio is Ratio with its default.
func (o *Overcommit) ratio() float64 {
	if o.Ratio == 0 {
		return 1
	}
	return o.Ratio
}

// String names the policy as rejection reasons do: "reservations" or
// "usage, ratio 2, headroom 0.1".
func (o *Overcommit) String() string {
	if !o.Usage() {
		return PolicyReservations
	}
	return "usage, ratio " + fmtFloat(o.ratio()) + ", headroom " + fmtFloat(o.Headroom)
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// ratioLimit is how much may be reserved of capacity c.
func (o *Overcommit) ratioLimit(c int64) int64 { return int64(o.ratio() * float64(c)) }

// useLimit is how much of capacity c measured use plus new reservations
// may take.
func (o *Overcommit) useLimit(c int64) int64 { return c - int64(math.Ceil(o.Headroom*float64(c))) }

// free is what a node under o has free for new reservations of one
// resource: capacity c, reserved as counted by reservations, measured the
// measured use plus the reservations placed since.
func (o *Overcommit) free(c, reserved, measured int64) int64 {
	return min(o.ratioLimit(c)-reserved, o.useLimit(c)-measured)
}

// measure is what was measured on one node: the latest figure handed to
// SetMeasured and the reservations of the instances placed there since,
// which the figure cannot include yet.
type measure struct {
	used [nMeasured]int64
	pend [nMeasured]int64
}

// load is the use the usage policy counts for resource r.
func (m *measure) load(r int) int64 { return m.used[r] + m.pend[r] }

// policyOf returns the overcommit policy of node i's provider, nil for
// the default.
func (t *topo) policyOf(i int32) *Overcommit {
	if t.oc == nil {
		return nil
	}
	return t.oc[t.prov[i]]
}

// refusal names the rule by which node i has too little of resource r for
// need: "reservations", or under the usage policy "usage, ratio 2" when
// the reservations would go over the ratio and "usage, measured +
// headroom 0.1" when measured use would.
func (s *state) refusal(i int32, r int, need int64) string {
	t := s.t
	oc := t.policyOf(i)
	if oc == nil || r >= nMeasured {
		return PolicyReservations
	}
	c := resVec(t.capacity[i])[r]
	e, _ := s.reported(i)
	reserved := max(e[r], s.sum[i].res[r])
	if need > oc.ratioLimit(c)-reserved {
		return "usage, ratio " + fmtFloat(oc.ratio())
	}
	return "usage, measured + headroom " + fmtFloat(oc.Headroom)
}

// SetOvercommit sets the overcommit policy of provider's nodes; the zero
// Overcommit restores the default (PolicyReservations). Allocations a
// stricter policy leaves over the limits stay; only new placements are
// held back.
func (c *Cluster) SetOvercommit(provider string, o Overcommit) error {
	if provider == "" {
		return &driver.FieldError{Path: "provider", Reason: "required"}
	}
	if err := o.Check("overcommit").Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.provLocked(provider)
	if o.Usage() {
		c.oc[provider] = o
	} else {
		delete(c.oc, provider)
	}
	c.rebuildLocked()
	return nil
}

// SetMeasured records what the instances on provider's node were measured
// using (the sum of their latest samples; cpu and memory are read). Under
// PolicyUsage it replaces the node's measured use, and the reservations
// of instances placed there since the previous call stop counting as
// measured: the caller counts, in used, the reservation of every instance
// it could not measure yet. A node the cluster does not know is an error
// wrapping driver.ErrNotFound.
func (c *Cluster) SetMeasured(provider, node string, used driver.Resources) error {
	if used.CPU < 0 || used.Memory < 0 {
		return &driver.FieldError{Path: "used", Reason: "must not be negative"}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.st.t.index[nodeKey{provider, node}]
	if !ok {
		return driver.Errorf(driver.ErrNotFound, "node %s/%s", provider, node)
	}
	m := &c.st.meas[i]
	m.used = [nMeasured]int64{int64(used.CPU), int64(used.Memory)}
	m.pend = [nMeasured]int64{}
	if c.st.t.policyOf(i) != nil {
		// The node fits differently now: snapshots copy it again and
		// Commit checks it with the new figure.
		c.st.touch(i)
		c.compactLocked()
	}
	return nil
}
