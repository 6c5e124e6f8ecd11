package sim

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
)

func init() {
	driver.Register(driver.Define("sim", "an in-memory cluster of 1 to 100,000 simulated nodes, with latency and failure injection",
		DefaultOptions, func(_ context.Context, opts *Options, _ driver.Env) (driver.Driver, error) {
			return New(*opts)
		}))
}

// Interface guards: the sim implements every optional capability.
var (
	_ driver.Driver        = (*Sim)(nil)
	_ driver.ImageLister   = (*Sim)(nil)
	_ driver.Preloader     = (*Sim)(nil)
	_ driver.Resizer       = (*Sim)(nil)
	_ driver.Starter       = (*Sim)(nil)
	_ driver.Stopper       = (*Sim)(nil)
	_ driver.Restarter     = (*Sim)(nil)
	_ driver.Killer        = (*Sim)(nil)
	_ driver.Suspender     = (*Sim)(nil)
	_ driver.LogReader     = (*Sim)(nil)
	_ driver.EventWatcher  = (*Sim)(nil)
	_ driver.UsageReporter = (*Sim)(nil)
	_ driver.ConsoleReader = (*Sim)(nil)
	_ driver.Walker        = (*Sim)(nil)
	_ driver.Skimmer       = (*Sim)(nil)
)

// Sim is a simulated back-end: a cluster held in memory. It starts no
// goroutines; time moves with its Clock and whatever is due (a create or
// delete whose latency has passed) happens on the next call. It is safe for
// concurrent use.
type Sim struct {
	opts  Options
	clock Clock
	pools []Pool
	// epoch is random per Sim and part of every id it makes, so that the
	// ids of a sim started again (a restarted server's) never repeat
	// those of the last one.
	epoch string

	mu     sync.Mutex
	rng    *rand.Rand
	nodes  []node
	byNode map[string]int32
	chunks []*chunk
	free   []uint32 // free instance slots, reused last in first out
	live   int
	names  nameTable // instance name -> slot
	// looks are the images, kinds and sizes instances have: few, where
	// instances are many.
	looks interned[look]
	// tagSets are the tags instances share, encoded (see splitTags); 0
	// is none. tagSetID indexes them by their encoding.
	tagSets  [][]byte
	tagSetID map[string]uint16
	due      timers
	calls    callLog
	watch    []*watcher
	changed  chan struct{} // closed and cleared on every change, when someone waits
	pending  map[*createOp]func() bool
	closed   bool
	done     chan struct{} // closed by Close

	unlisted int // how many nodes List leaves out (SetNodeUnlisted)
}

// node is one simulated node.
type node struct {
	name      string
	pool      int32
	zone      string
	rack      string
	reserved  driver.Resources
	active    driver.Resources // reserved by running instances
	instances int
	images    map[string]bool // present beyond the pool's images
	ports     map[int]bool    // bound host ports
	override  driver.NodeStatus
	reason    string
	unlisted  bool // List leaves its instances out (SetNodeUnlisted)
}

// New builds a sim from opts, which must be valid.
func New(opts Options) (*Sim, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Sim{
		epoch:   newEpoch(),
		opts:    opts,
		clock:   opts.Clock,
		pools:   opts.pools(),
		rng:     rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		byNode:  map[string]int32{},
		looks:   newInterned[look](),
		tagSets: [][]byte{nil}, tagSetID: map[string]uint16{"": 0},
		pending: map[*createOp]func() bool{},
		done:    make(chan struct{}),
	}
	if s.clock == nil {
		s.clock = wallClock{}
	}
	s.calls.max = opts.CallLog
	for pi, p := range s.pools {
		width := len(strconv.Itoa(p.Count))
		for i := range p.Count {
			n := node{
				name: fmt.Sprintf("%s%0*d", p.NamePrefix, width, i+1),
				pool: int32(pi),
			}
			if len(p.Zones) > 0 {
				n.zone = p.Zones[i%len(p.Zones)]
			}
			if len(p.Racks) > 0 {
				n.rack = p.Racks[(i/max(len(p.Zones), 1))%len(p.Racks)]
			}
			if _, dup := s.byNode[n.name]; dup {
				return nil, &driver.FieldError{Path: fmt.Sprintf("pools[%d].name_prefix", pi), Reason: fmt.Sprintf("node name %q is also made by another pool", n.name)}
			}
			s.byNode[n.name] = int32(len(s.nodes))
			s.nodes = append(s.nodes, n)
		}
	}
	return s, nil
}

// chunkBits sets how many instance slots share one allocation.
const chunkBits = 14

func (s *Sim) slot(i uint32) *inst {
	return &s.chunks[i>>chunkBits].slots[i&(1<<chunkBits-1)]
}

func (s *Sim) chunkOf(i uint32) *chunk { return s.chunks[i>>chunkBits] }

// interned is a table of distinct values, each known by the index it was
// first added at; index 0 is the zero value.
type interned[T comparable] struct {
	vals []T
	ids  map[T]uint32
}

func newInterned[T comparable]() interned[T] {
	var zero T
	return interned[T]{vals: []T{zero}, ids: map[T]uint32{zero: 0}}
}

// id returns the index of v, adding it if new.
func (t *interned[T]) id(v T) uint32 {
	if id, ok := t.ids[v]; ok {
		return id
	}
	id := uint32(len(t.vals))
	t.vals = append(t.vals, v)
	t.ids[v] = id
	return id
}

// at returns the value at index id.
func (t *interned[T]) at(id uint32) T { return t.vals[id] }

// size is an instance's resources but Other (kept in its extra).
type size struct {
	cpu    driver.MilliCPU
	memory driver.Bytes
	disk   driver.Bytes
	gpus   int64
}

// look is what an instance shares with many others: its image
// (normalised), its kind and its size.
type look struct {
	image string
	kind  driver.Kind
	size  size
}

// lookID returns the index in s.looks of an instance of image, kind and
// resources r (but Other).
func (s *Sim) lookID(image string, kind driver.Kind, r driver.Resources) uint32 {
	return s.looks.id(look{image: image, kind: kind, size: size{cpu: r.CPU, memory: r.Memory, disk: r.Disk, gpus: r.GPUs}})
}

// splitTags tells whether the tags of an instance being created split into
// a set it shares with others (every tag but driver.TagInstance, which a
// Berth plane writes with the same cluster and provider tags on thousands
// of instances), kept once in tagSets, and its instance tag, kept in its
// chunk's arena; it returns the index of the set. Tags without an instance
// tag, and any once tagSets is full, do not split: they are all the
// instance's own.
func (s *Sim) splitTags(tags map[string]string) (set uint16, ok bool) {
	if _, ok := tags[driver.TagInstance]; !ok || len(tags) < 2 {
		return 0, false
	}
	var few [8]string
	keys := few[:0]
	for k := range tags {
		if k != driver.TagInstance {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var stack [256]byte
	enc := stack[:0]
	for _, k := range keys {
		enc = appendPair(enc, k, tags[k])
	}
	if i, ok := s.tagSetID[string(enc)]; ok {
		return i, true
	}
	if len(s.tagSets) > math.MaxUint16 {
		return 0, false
	}
	i := uint16(len(s.tagSets))
	s.tagSets = append(s.tagSets, slices.Clone(enc))
	s.tagSetID[string(enc)] = i
	return i, true
}

// newSlot returns a free slot, growing the table when none is free.
func (s *Sim) newSlot() uint32 {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		return i
	}
	n := uint32(len(s.chunks)) << chunkBits
	s.chunks = append(s.chunks, new(chunk))
	for i := n + 1<<chunkBits - 1; i > n; i-- {
		s.free = append(s.free, i)
	}
	return n
}

// lookup returns the slot of the live instance with id id.
func (s *Sim) lookup(id string) (uint32, *inst, error) {
	slot, gen, ok := s.parseID(id)
	if ok && int(slot>>chunkBits) < len(s.chunks) {
		in := s.slot(slot)
		if in.state != stFree && in.gen == gen {
			return slot, in, nil
		}
	}
	return 0, nil, driver.Errorf(driver.ErrNotFound, "sim: no instance %q", id)
}

// formatID and parseID turn a slot and its generation into an id such as
// "sim-k3x9q1-2a.1" (the sim's epoch, the slot, the generation) and back.
// Ids are never reused: a freed slot gets a new generation, and another
// sim (a restarted one) another epoch.
func (s *Sim) formatID(slot, gen uint32) string {
	var b [40]byte
	buf := append(b[:0], "sim-"...)
	buf = append(buf, s.epoch...)
	buf = append(buf, '-')
	buf = strconv.AppendUint(buf, uint64(slot), 36)
	buf = append(buf, '.')
	buf = strconv.AppendUint(buf, uint64(gen), 36)
	return string(buf)
}

func (s *Sim) parseID(id string) (slot, gen uint32, ok bool) {
	rest, ok := strings.CutPrefix(id, "sim-")
	if !ok {
		return 0, 0, false
	}
	if rest, ok = strings.CutPrefix(rest, s.epoch+"-"); !ok {
		return 0, 0, false
	}
	a, b, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, 0, false
	}
	sl, err1 := strconv.ParseUint(a, 36, 32)
	g, err2 := strconv.ParseUint(b, 36, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uint32(sl), uint32(g), true
}

// enter locks the sim and brings it up to the clock's time. It returns the
// time, or an error when the sim is closed.
func (s *Sim) enter() (int64, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, driver.Errorf(driver.ErrPermanent, "sim: the driver is closed")
	}
	now := s.clock.Now().UnixNano()
	s.settle(now)
	return now, nil
}

// settle performs every transition due by now.
func (s *Sim) settle(now int64) {
	for len(s.due) > 0 && s.due[0].at <= now {
		t := s.due.pop()
		in := s.slot(t.slot)
		if in.gen != t.gen {
			continue
		}
		switch {
		case t.kind == dueReady && in.state == stCreating:
			s.setRunning(t.slot, in, t.at, driver.EventStart)
		case t.kind == dueGone && in.state == stDeleting:
			s.release(t.slot, in, t.at)
		}
	}
}

// changedLocked wakes everyone waiting for a change.
func (s *Sim) changedLocked() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// waitChan returns a channel closed at the next change.
func (s *Sim) waitChan() chan struct{} {
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// nodeStatus returns the status of node i at time now: an override set by
// SetNodeStatus, else the outcome of offline_rate for the current flap
// period.
func (s *Sim) nodeStatus(i int32, now int64) (driver.NodeStatus, string) {
	n := &s.nodes[i]
	if n.override != "" {
		return n.override, n.reason
	}
	if s.opts.OfflineRate > 0 {
		epoch := uint64(0)
		if s.opts.Flap > 0 {
			epoch = uint64(now / int64(s.opts.Flap))
		}
		if unit(mix(s.opts.Seed, uint64(i), epoch)) < s.opts.OfflineRate {
			return driver.NodeOffline, "offline (offline_rate)"
		}
	}
	return driver.NodeOnline, ""
}

// mix hashes its arguments with SplitMix64 steps.
func mix(xs ...uint64) uint64 {
	h := uint64(0x243f6a8885a308d3)
	for _, x := range xs {
		h ^= x
		h += 0x9e3779b97f4a7c15
		h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9
		h = (h ^ (h >> 27)) * 0x94d049bb133111eb
		h ^= h >> 31
	}
	return h
}

// unit maps a hash to [0, 1).
func unit(h uint64) float64 { return float64(h>>11) / (1 << 53) }

// normImage reads a reference without a tag as tag "latest".
func normImage(ref string) string {
	if ref == "" || strings.Contains(ref, "@") {
		return ref
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref
	}
	return ref + ":latest"
}

// hasImage reports whether image (normalised) is present on node i.
func (s *Sim) hasImage(i int32, image string) bool {
	n := &s.nodes[i]
	if n.images[image] {
		return true
	}
	return slices.Contains(s.pools[n.pool].Images, image)
}

// nodeImages returns the sorted images present on node i.
func (s *Sim) nodeImages(i int32) []string {
	n := &s.nodes[i]
	out := slices.Clone(s.pools[n.pool].Images)
	for img := range n.images {
		if !slices.Contains(out, img) {
			out = append(out, img)
		}
	}
	slices.Sort(out)
	return out
}

func (s *Sim) findNode(name string) (int32, error) {
	i, ok := s.byNode[name]
	if !ok {
		return 0, driver.Errorf(driver.ErrNotFound, "sim: no node %q", name)
	}
	return i, nil
}

// State returns every node's capacity, reservations, usage and images.
func (s *Sim) State(ctx context.Context) (*driver.PlatformState, error) {
	now, err := s.enter()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	st := &driver.PlatformState{Nodes: make([]driver.Node, len(s.nodes)), Time: time.Unix(0, now)}
	for i := range s.nodes {
		n := &s.nodes[i]
		p := &s.pools[n.pool]
		status, reason := s.nodeStatus(int32(i), now)
		attrs := map[string]string{"pool": strings.TrimRight(p.NamePrefix, "-_."), "driver": "sim"}
		if n.zone != "" {
			attrs["zone"] = n.zone
		}
		if n.rack != "" {
			attrs["rack"] = n.rack
		}
		inUse := s.nodeUsage(int32(i), now)
		out := driver.Node{
			Name:         n.name,
			Status:       status,
			Reason:       reason,
			Labels:       cloneMap(p.Labels),
			Attributes:   attrs,
			Capacity:     p.Resources.Add(driver.Resources{}),
			Reserved:     n.reserved.Add(driver.Resources{}),
			InUse:        &inUse,
			Images:       s.nodeImages(int32(i)),
			MaxInstances: p.MaxInstances,
			Instances:    n.instances,
		}
		for port := range n.ports {
			out.Ports = append(out.Ports, port)
		}
		slices.Sort(out.Ports)
		st.Nodes[i] = out
	}
	return st, nil
}

// nodeUsage is the live usage of node i: a share, drawn per minute, of what
// its running instances reserve.
func (s *Sim) nodeUsage(i int32, now int64) driver.Resources {
	a := s.nodes[i].active
	f := 0.2 + 0.6*unit(mix(s.opts.Seed, uint64(i), uint64(now/int64(time.Minute)), 1))
	return driver.Resources{
		CPU:    driver.MilliCPU(float64(a.CPU) * f),
		Memory: driver.Bytes(float64(a.Memory) * f),
		Disk:   a.Disk,
		GPUs:   a.GPUs,
	}
}

// cloneMap returns a copy of m, nil when m is empty.
func cloneMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}

// Close ends every Watch and followed Logs call and makes further calls
// fail. The sim holds no goroutines or connections.
func (s *Sim) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for op, stop := range s.pending {
		stop()
		delete(s.pending, op)
	}
	close(s.done)
	s.changedLocked()
	return nil
}

// newEpoch returns 40 random bits in base 36.
func newEpoch() string {
	var b [5]byte
	_, _ = crand.Read(b[:])
	n := uint64(b[0])<<32 | uint64(b[1])<<24 | uint64(b[2])<<16 | uint64(b[3])<<8 | uint64(b[4])
	return strconv.FormatUint(n, 36)
}
