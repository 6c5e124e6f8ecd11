package scheduler

import (
	"fmt"
	"slices"

	"github.com/berth-dev/berth/driver"
)

// Quota limits what one scope holds at once: the instances of an owner (a
// namespace), of a pool, or on a provider. Exactly one of Provider, Pool
// and Owner names the scope; zero limits are no limit. Placement treats a
// quota as a filter: a node is rejected, with the quota named, when one
// more instance there would go over a quota that covers it.
type Quota struct {
	Provider string `json:"provider,omitempty" yaml:"provider"`
	Pool     string `json:"pool,omitempty" yaml:"pool"`
	// Owner is the namespace the quota limits.
	Owner     string          `json:"namespace,omitempty" yaml:"namespace"`
	Instances int             `json:"instances,omitempty" yaml:"instances"`
	CPU       driver.MilliCPU `json:"cpus,omitempty" yaml:"cpus"`
	Memory    driver.Bytes    `json:"memory,omitempty" yaml:"memory"`
}

// QuotaUse is a quota with what its scope holds now.
type QuotaUse struct {
	Quota
	UsedInstances int             `json:"used_instances"`
	UsedCPU       driver.MilliCPU `json:"used_cpus"`
	UsedMemory    driver.Bytes    `json:"used_memory"`
}

// Scope names the quota's scope in words: "owner bob", "pool ci",
// "provider docker".
func (q *Quota) Scope() string {
	switch {
	case q.Owner != "":
		return "owner " + q.Owner
	case q.Pool != "":
		return "pool " + q.Pool
	}
	return "provider " + q.Provider
}

// Check checks q's own fields; field is its path in the errors.
func (q *Quota) Check(field string) driver.FieldErrors {
	var es driver.FieldErrors
	n := 0
	for _, v := range []string{q.Provider, q.Pool, q.Owner} {
		if v != "" {
			n++
		}
	}
	if n != 1 {
		es = append(es, &driver.FieldError{Path: field, Reason: "name exactly one of provider, pool and namespace"})
	}
	if q.Instances < 0 {
		es = append(es, &driver.FieldError{Path: field + ".instances", Reason: "must not be negative"})
	}
	if q.CPU < 0 {
		es = append(es, &driver.FieldError{Path: field + ".cpus", Reason: "must not be negative"})
	}
	if q.Memory < 0 {
		es = append(es, &driver.FieldError{Path: field + ".memory", Reason: "must not be negative"})
	}
	return es
}

// Covers reports whether q limits an instance of owner and pool placed on
// provider (any provider when empty: a provider quota then covers it).
func (q *Quota) Covers(owner, pool, provider string) bool {
	switch {
	case q.Owner != "":
		return q.Owner == owner
	case q.Pool != "":
		return q.Pool == pool
	case q.Provider != "":
		return provider == "" || q.Provider == provider
	}
	return false
}

// Blocks says why one more instance of r would go over u, or "".
func (u *QuotaUse) Blocks(r driver.Resources) string {
	switch {
	case u.Instances > 0 && u.UsedInstances+1 > u.Instances:
		return fmt.Sprintf("quota %s: %d of %d instances in use", u.Scope(), u.UsedInstances, u.Instances)
	case u.CPU > 0 && u.UsedCPU+r.CPU > u.CPU:
		return fmt.Sprintf("quota %s: %s of %s cpus in use, %s more asked", u.Scope(), u.UsedCPU, u.CPU, r.CPU)
	case u.Memory > 0 && u.UsedMemory+r.Memory > u.Memory:
		return fmt.Sprintf("quota %s: %s of %s memory in use, %s more asked", u.Scope(), u.UsedMemory, u.Memory, r.Memory)
	}
	return ""
}

// Never says why n instances of r could never fit q even with nothing
// else held, or "".
func (q *Quota) Never(r driver.Resources, n int) string {
	switch {
	case q.CPU > 0 && r.CPU > q.CPU:
		return fmt.Sprintf("quota %s allows %s cpus; one instance asks for %s", q.Scope(), q.CPU, r.CPU)
	case q.Memory > 0 && r.Memory > q.Memory:
		return fmt.Sprintf("quota %s allows %s memory; one instance asks for %s", q.Scope(), q.Memory, r.Memory)
	}
	return ""
}

// quotaUsed is what one quota's scope holds.
type quotaUsed struct {
	n   int
	cpu driver.MilliCPU
	mem driver.Bytes
}

// countQuotas adds (sign 1) or removes (-1) allocation a from the use of
// every quota that covers it.
func (s *state) countQuotas(a *alloc, sign int) {
	if len(s.quotas) == 0 {
		return
	}
	prov := s.t.providers[s.t.prov[a.node]]
	for k := range s.quotas {
		if s.quotas[k].Covers(a.info.owner, a.info.pool, prov) {
			u := &s.qused[k]
			u.n += sign
			u.cpu += driver.MilliCPU(sign) * a.info.res.CPU
			u.mem += driver.Bytes(sign) * a.info.res.Memory
		}
	}
}

// quotaRoom returns the index of the first quota one more instance of c on
// node i would go over, or -1.
func (s *state) quotaRoom(c *compiled, i int32) int {
	if len(s.quotas) == 0 {
		return -1
	}
	prov := s.t.providers[s.t.prov[i]]
	for k := range s.quotas {
		q := &s.quotas[k]
		if !q.Covers(c.info.owner, c.info.pool, prov) {
			continue
		}
		u := &s.qused[k]
		if (q.Instances > 0 && u.n+1 > q.Instances) ||
			(q.CPU > 0 && u.cpu+c.req.CPU > q.CPU) ||
			(q.Memory > 0 && u.mem+c.req.Memory > q.Memory) {
			return k
		}
	}
	return -1
}

// quotaFits reports whether allocation a fits every quota that covers it.
func (s *state) quotaFits(a *alloc) bool {
	if len(s.quotas) == 0 {
		return true
	}
	prov := s.t.providers[s.t.prov[a.node]]
	for k := range s.quotas {
		q := &s.quotas[k]
		if !q.Covers(a.info.owner, a.info.pool, prov) {
			continue
		}
		u := &s.qused[k]
		if (q.Instances > 0 && u.n+1 > q.Instances) ||
			(q.CPU > 0 && u.cpu+a.info.res.CPU > q.CPU) ||
			(q.Memory > 0 && u.mem+a.info.res.Memory > q.Memory) {
			return false
		}
	}
	return true
}

// use returns quota k with its use.
func (s *state) use(k int) QuotaUse {
	u := s.qused[k]
	return QuotaUse{Quota: s.quotas[k], UsedInstances: u.n, UsedCPU: u.cpu, UsedMemory: u.mem}
}

// SetQuotas replaces the quotas placement keeps to, and counts what every
// allocation holds against them. Allocations already over a new quota
// stay; only new placements are held back.
func (c *Cluster) SetQuotas(qs []Quota) error {
	var es driver.FieldErrors
	for k := range qs {
		es = append(es, qs[k].Check(fmt.Sprintf("quotas[%d]", k))...)
	}
	if err := es.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.quotas = slices.Clone(qs)
	c.st.qused = make([]quotaUsed, len(qs))
	for a := range c.allocs.all() {
		c.st.countQuotas(a, 1)
	}
	return nil
}

// QuotaUse returns every quota with what its scope holds now, in the
// order given to SetQuotas.
func (c *Cluster) QuotaUse() []QuotaUse {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]QuotaUse, len(c.st.quotas))
	for k := range out {
		out[k] = c.st.use(k)
	}
	return out
}
