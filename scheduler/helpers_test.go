package scheduler

import (
	"fmt"

	"github.com/berth-dev/berth/driver"
)

// nodes returns n online nodes named prefix0..prefixN-1 with cpus and GiB.
func mkNodes(prefix string, n int, cpus float64, gib int64, labels map[string]string) []driver.Node {
	out := make([]driver.Node, n)
	for i := range out {
		out[i] = driver.Node{
			Name: fmt.Sprintf("%s%d", prefix, i), Status: driver.NodeOnline, Labels: labels,
			Capacity: driver.Resources{CPU: driver.CPUs(cpus), Memory: driver.Bytes(gib) * driver.GiB},
		}
	}
	return out
}

func newTestCluster(t interface{ Fatal(...any) }, provider string, nodes []driver.Node, opts ...ClusterOption) *Cluster {
	c := NewCluster(opts...)
	if err := c.UpdateNodes(provider, nodes); err != nil {
		t.Fatal(err)
	}
	return c
}

func req(id string, cpus float64, mib int64) *Request {
	return &Request{ID: id, Spec: driver.Spec{Image: "app", Resources: driver.Resources{CPU: driver.CPUs(cpus), Memory: driver.Bytes(mib) * driver.MiB}}}
}

func nodesOf(p *Plan) []string {
	var out []string
	for _, pl := range p.Placements {
		out = append(out, pl.Node)
	}
	return out
}
