package sim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/berth-dev/berth/driver"
)

// Instance states as the sim keeps them. stFree marks an unused slot.
const (
	stFree uint8 = iota
	stCreating
	stRunning
	stSuspended
	stStopped
	stExited
	stFailed
	stDeleting
)

var stateNames = [...]driver.State{
	stFree:      driver.StateUnknown,
	stCreating:  driver.StateCreating,
	stRunning:   driver.StateRunning,
	stSuspended: driver.StateSuspended,
	stStopped:   driver.StateStopped,
	stExited:    driver.StateExited,
	stFailed:    driver.StateFailed,
	stDeleting:  driver.StateDeleting,
}

// inst is one simulated instance, kept compact and free of pointers but
// for the rare extra: a million of them must fit in well under a gigabyte
// and cost the garbage collector next to nothing. Its name and tags live in
// its chunk's arena, its image, kind and size in Sim.looks, and when a
// create or delete will be over in the operation and the timer that wait
// for it. It is 64 bytes.
type inst struct {
	x       *extra
	gen     uint32
	node    int32
	starts  uint32 // how many times it has started: one log line each
	off     uint32 // where its name, then its tags, start in the arena
	tagsLen uint32
	look    uint32 // index into Sim.looks
	nameLen uint8  // 0: the name is the id
	state   uint8
	hasExit bool
	// nameTag: its driver.TagInstance tag, not among those in the arena,
	// has its name for value.
	nameTag  bool
	exitCode int16
	tagSet   uint16 // the tags it shares with others: index into Sim.tagSets
	created  int64
	started  int64
	finished int64
}

// extra holds what most instances do not have.
type extra struct {
	other   map[string]int64
	labels  string // encoded key, value pairs
	stdout  string
	stderr  string
	message string
	ports   []driver.PortMapping
}

// resources returns what the instance reserves. Other is shared: callers
// that hand it out clone it.
func (s *Sim) resources(in *inst) driver.Resources {
	z := s.looks.at(in.look).size
	r := driver.Resources{CPU: z.cpu, Memory: z.memory, Disk: z.disk, GPUs: z.gpus}
	if in.x != nil {
		r.Other = in.x.other
	}
	return r
}

func (in *inst) message() string {
	if in.x == nil {
		return ""
	}
	return in.x.message
}

func (in *inst) setMessage(m string) {
	if in.x == nil {
		if m == "" {
			return
		}
		in.x = &extra{}
	}
	in.x.message = m
}

// lines returns what each start writes to stdout and stderr.
func (in *inst) lines() (stdout, stderr string) {
	if in.x == nil || in.x.stdout == "" {
		stdout = "started"
	} else {
		stdout = in.x.stdout
	}
	if in.x != nil {
		stderr = in.x.stderr
	}
	return stdout, stderr
}

// address returns the instance's made-up address, 10.x.y.z from its slot.
func address(slot uint32) string {
	b := make([]byte, 0, 16)
	b = append(b, "10."...)
	b = strconv.AppendUint(b, uint64(slot>>16&0xff), 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, uint64(slot>>8&0xff), 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, uint64(slot&0xff), 10)
	return string(b)
}

// nameIs reports whether the instance in slot is named name.
func (s *Sim) nameIs(slot uint32, name string) bool {
	return string(s.chunkOf(slot).name(s.slot(slot))) == name
}

// nameOf returns the name of the instance in slot; id, its id, if it has
// none.
func (s *Sim) nameOf(slot uint32, in *inst, id string) string {
	if in.nameLen == 0 {
		return id
	}
	return string(s.chunkOf(slot).name(in))
}

// tagsOf decodes the tags of the instance in slot.
func (s *Sim) tagsOf(slot uint32, in *inst) map[string]string {
	c := s.chunkOf(slot)
	own := string(c.tags(in))
	set := s.tagSets[in.tagSet]
	if len(set) == 0 && !in.nameTag {
		return pairMap(own)
	}
	m := addPairs(pairMap(string(set)), own)
	if in.nameTag {
		if m == nil {
			m = map[string]string{}
		}
		m[driver.TagInstance] = string(c.name(in))
	}
	return m
}

// lookupTag returns the value of the tag key of the instance in, in
// chunk c.
func (s *Sim) lookupTag(c *chunk, in *inst, key string) ([]byte, bool) {
	if in.nameTag && key == driver.TagInstance {
		return c.name(in), true
	}
	if v, ok := lookupBytes(c.tags(in), key); ok {
		return v, true
	}
	return lookupBytes(s.tagSets[in.tagSet], key)
}

// snapshot returns the instance as the driver contract describes it.
func (s *Sim) snapshot(slot uint32, in *inst, now int64) *driver.Instance {
	out := s.snapshotNoTags(slot, in, now, "")
	out.Tags = s.tagsOf(slot, in)
	return out
}

// snapshotNoTags is snapshot without Tags, for a caller that has them;
// name is the instance's name when the caller has it too, else "".
func (s *Sim) snapshotNoTags(slot uint32, in *inst, now int64, name string) *driver.Instance {
	lk := s.looks.at(in.look)
	id := s.formatID(slot, in.gen)
	if name == "" {
		name = s.nameOf(slot, in, id)
	}
	out := &driver.Instance{
		ID:        id,
		Name:      name,
		Node:      s.nodes[in.node].name,
		Kind:      lk.kind,
		Image:     lk.image,
		State:     stateNames[in.state],
		RawState:  string(stateNames[in.state]),
		Message:   in.message(),
		Addresses: []string{address(slot)},
		Resources: s.resources(in),
		Created:   time.Unix(0, in.created),
	}
	if len(out.Resources.Other) > 0 {
		out.Resources.Other = maps.Clone(out.Resources.Other)
	}
	if in.x != nil {
		out.Ports = slices.Clone(in.x.ports)
		out.Labels = pairMap(in.x.labels)
	}
	if in.started != 0 {
		out.Started = time.Unix(0, in.started)
	}
	if in.finished != 0 {
		out.Finished = time.Unix(0, in.finished)
	}
	if in.hasExit {
		code := int(in.exitCode)
		out.ExitCode = &code
	}
	if st, reason := s.nodeStatus(in.node, now); st == driver.NodeOffline {
		out.State = driver.StateUnknown
		out.Message = "node " + s.nodes[in.node].name + ": " + reason
	}
	return out
}

// stateOf is the state snapshot shows for in.
func (s *Sim) stateOf(in *inst, now int64) driver.State {
	if st, _ := s.nodeStatus(in.node, now); st == driver.NodeOffline {
		return driver.StateUnknown
	}
	return stateNames[in.state]
}

// setRunning starts the instance at time at and reports ev.
func (s *Sim) setRunning(slot uint32, in *inst, at int64, ev driver.EventType) {
	if in.state != stRunning && in.state != stSuspended {
		n := &s.nodes[in.node]
		n.active = n.active.Add(s.resources(in))
	}
	in.state = stRunning
	in.starts++
	in.started = at
	in.finished = 0
	in.hasExit = false
	in.setMessage("")
	s.emit(slot, in, ev, at)
}

// setEnded moves a running or suspended instance to state st.
func (s *Sim) setEnded(slot uint32, in *inst, st uint8, code int, at int64, ev driver.EventType) {
	if in.state == stRunning || in.state == stSuspended {
		n := &s.nodes[in.node]
		n.active = n.active.Sub(s.resources(in))
	}
	in.state = st
	in.finished = at
	in.hasExit = true
	in.exitCode = int16(code)
	s.emit(slot, in, ev, at)
}

// release frees the instance's slot and everything it held on its node.
func (s *Sim) release(slot uint32, in *inst, at int64) {
	n := &s.nodes[in.node]
	r := s.resources(in)
	n.reserved = n.reserved.Sub(r)
	if in.state == stRunning || in.state == stSuspended {
		n.active = n.active.Sub(r)
	}
	n.instances--
	if in.x != nil {
		for _, p := range in.x.ports {
			delete(n.ports, p.HostPort)
		}
	}
	c := s.chunkOf(slot)
	if in.nameLen > 0 {
		s.names.remove(string(c.name(in)), slot)
	}
	c.dead += int(in.nameLen) + int(in.tagsLen)
	in.state = stDeleting
	s.emit(slot, in, driver.EventDelete, at)
	*in = inst{gen: in.gen + 1}
	s.free = append(s.free, slot)
	s.live--
}

// Create validates spec and starts building the instance on node. It returns
// ErrInvalid (bad spec) or ErrNotFound (unknown node) at once; every other
// outcome is reported by the operation: ErrRetryable for an offline or
// draining node, ErrPermanent for a missing image, ErrAlreadyExists for a
// taken name, ErrInsufficientCapacity when the node has no room, and the
// injected faults. An instance with no name is named after its id. The
// caller must not change spec.Tags until the operation is over: the
// finished instance reports them.
func (s *Sim) Create(ctx context.Context, nodeName string, spec *driver.Spec) (driver.Operation, error) {
	if spec == nil {
		return nil, &driver.FieldError{Path: "spec", Reason: "required"}
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("sim: create: %w", err)
	}
	if _, _, isID := s.parseID(spec.Name); isID {
		return nil, fmt.Errorf("sim: create: %w", &driver.FieldError{Path: "name", Reason: fmt.Sprintf("%q has the form of a sim instance id", spec.Name)})
	}
	now, err := s.enter()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	ni, err := s.findNode(nodeName)
	if err != nil {
		return nil, err
	}
	u := s.rng.Float64()
	var jitter int64
	if s.opts.LatencyJitter > 0 {
		jitter = s.rng.Int64N(int64(s.opts.LatencyJitter))
	}
	hang := false
	image := normImage(spec.Image)
	fail := func(err error) (driver.Operation, error) {
		s.calls.add(Call{Op: "create", Node: nodeName, Name: spec.Name, Time: time.Unix(0, now), Err: err})
		return driver.Finished(nil, err), nil
	}
	n := &s.nodes[ni]
	p := &s.pools[n.pool]
	if st, reason := s.nodeStatus(ni, now); st != driver.NodeOnline {
		return fail(driver.Errorf(driver.ErrRetryable, "sim: node %s is %s", nodeName, reason))
	}
	if spec.Flavor != "" {
		return fail(driver.Errorf(driver.ErrUnsupported, "sim: flavor %q: the sim has no flavors; give resources", spec.Flavor))
	}
	if spec.Name != "" {
		if _, taken := s.names.get(spec.Name, s.nameIs); taken {
			return fail(driver.Errorf(driver.ErrAlreadyExists, "sim: an instance named %q exists", spec.Name))
		}
	}
	if image != "" && !s.hasImage(ni, image) && s.opts.StrictImages {
		return fail(driver.Errorf(driver.ErrPermanent, "sim: image %s is not present on node %s (preload it, or unset strict_images)", spec.Image, nodeName))
	}
	switch o := &s.opts; {
	case u < o.FailRetryable:
		return fail(driver.Errorf(driver.ErrRetryable, "sim: injected retryable failure (fail_retryable)"))
	case u < o.FailRetryable+o.FailPermanent:
		return fail(driver.Errorf(driver.ErrPermanent, "sim: injected permanent failure (fail_permanent)"))
	case u < o.FailRetryable+o.FailPermanent+o.FailQuota:
		return fail(driver.Errorf(driver.ErrQuotaExceeded, "sim: injected quota refusal (fail_quota)"))
	case u < o.FailRetryable+o.FailPermanent+o.FailQuota+o.HangRate:
		hang = true
	}
	admits := p.Resources
	if f := s.opts.Overcommit; f > 1 {
		admits.CPU = driver.MilliCPU(f * float64(admits.CPU))
		admits.Memory = driver.Bytes(f * float64(admits.Memory))
	}
	if !spec.Resources.Add(n.reserved).Fits(admits) {
		return fail(driver.Errorf(driver.ErrInsufficientCapacity, "sim: node %s: %+v reserved of %+v, cannot add %+v", nodeName, n.reserved, p.Resources, spec.Resources))
	}
	if p.MaxInstances > 0 && n.instances >= p.MaxInstances {
		return fail(driver.Errorf(driver.ErrInsufficientCapacity, "sim: node %s runs its maximum of %d instances", nodeName, p.MaxInstances))
	}
	ports, err := s.bindPorts(ni, spec.Ports)
	if err != nil {
		return fail(err)
	}

	slot := s.newSlot()
	in := s.slot(slot)
	// The tags kept in the arena: all of them, or when they split the
	// instance tag alone, and not even that when its value is the name.
	var stack [256]byte
	own := stack[:0]
	set, split := s.splitTags(spec.Tags)
	instTag := spec.Tags[driver.TagInstance]
	nameTag := split && spec.Name != "" && instTag == spec.Name
	switch {
	case nameTag:
	case split:
		own = appendPair(own, driver.TagInstance, instTag)
	default:
		own = appendPairs(own, spec.Tags)
	}
	off := s.chunkOf(slot).store(spec.Name, own)
	*in = inst{
		tagSet:  set,
		nameTag: nameTag,
		gen:     in.gen,
		state:   stCreating,
		node:    ni,
		off:     off,
		tagsLen: uint32(len(own)),
		nameLen: uint8(len(spec.Name)),
		look:    s.lookID(image, spec.KindOrDefault(), spec.Resources),
		created: now,
	}
	if len(spec.Other) > 0 || len(spec.Labels) > 0 || len(ports) > 0 || spec.Env[EnvStdout] != "" || spec.Env[EnvStderr] != "" {
		in.x = &extra{labels: encodePairs(spec.Labels), ports: ports, stdout: spec.Env[EnvStdout], stderr: spec.Env[EnvStderr]}
		if len(spec.Other) > 0 {
			in.x.other = maps.Clone(spec.Other)
		}
	}
	if image != "" && !s.hasImage(ni, image) {
		if n.images == nil {
			n.images = map[string]bool{}
		}
		n.images[image] = true
	}
	n.reserved = n.reserved.Add(s.resources(in))
	n.instances++
	s.live++
	if spec.Name != "" {
		s.names.put(spec.Name, slot)
	}
	s.calls.addRef(Call{Op: "create", Node: nodeName, Name: spec.Name, Time: time.Unix(0, now)}, slot, in.gen)
	op := &createOp{s: s, slot: slot, gen: in.gen, hang: hang, name: spec.Name, tags: spec.Tags}
	switch latency := int64(s.opts.CreateLatency) + jitter; {
	case hang:
	case latency <= 0:
		s.setRunning(slot, in, now, driver.EventStart)
	default:
		op.due = now + latency
		s.due.push(timer{at: op.due, slot: slot, gen: in.gen, kind: dueReady})
	}
	if in.state == stCreating && ctx.Done() != nil {
		s.pending[op] = context.AfterFunc(ctx, op.abandon)
	}
	return op, nil
}

// bindPorts binds the spec's host ports on node i: fixed ports must be free
// (ErrInsufficientCapacity otherwise) and published ports without a host
// port get a free one from 30000 up.
func (s *Sim) bindPorts(i int32, ports []driver.Port) ([]driver.PortMapping, error) {
	if len(ports) == 0 {
		return nil, nil
	}
	n := &s.nodes[i]
	taken := func(p int) bool { return n.ports[p] }
	var out []driver.PortMapping
	var bound []int
	for _, p := range ports {
		hp := p.HostPort
		if hp == 0 && !p.Publish {
			continue
		}
		if hp == 0 {
			for hp = 30000; hp <= 65535 && (taken(hp) || slices.Contains(bound, hp)); hp++ {
			}
			if hp > 65535 {
				return nil, driver.Errorf(driver.ErrInsufficientCapacity, "sim: node %s has no free host port", n.name)
			}
		} else if taken(hp) || slices.Contains(bound, hp) {
			return nil, driver.Errorf(driver.ErrInsufficientCapacity, "sim: node %s: host port %d is in use", n.name, hp)
		}
		bound = append(bound, hp)
		proto := p.Protocol
		if proto == "" {
			proto = "tcp"
		}
		out = append(out, driver.PortMapping{ContainerPort: p.ContainerPort, HostPort: hp, Protocol: proto, HostIP: p.HostIP})
	}
	if n.ports == nil && len(bound) > 0 {
		n.ports = map[int]bool{}
	}
	for _, hp := range bound {
		n.ports[hp] = true
	}
	return out, nil
}

// createOp is a create in progress.
type createOp struct {
	s         *Sim
	slot, gen uint32
	hang      bool
	due       int64             // when the create is over, unless it hangs
	name      string            // the spec's name
	tags      map[string]string // the spec's tags, copied into the result
	abandoned bool
	over      bool
	inst      *driver.Instance
	err       error
}

// hangWait is the Wait hint of a create that hangs.
const hangWait = 100 * time.Millisecond

func (op *createOp) Advance(ctx context.Context) (driver.Progress, error) {
	s := op.s
	now, err := s.enter()
	if err != nil {
		return driver.Progress{}, err
	}
	defer s.mu.Unlock()
	if op.over {
		return driver.Progress{Done: op.err == nil, Instance: op.inst}, op.err
	}
	in := s.slot(op.slot)
	switch {
	case op.abandoned:
		op.finish(nil, driver.Errorf(driver.ErrTimeout, "sim: create of %s abandoned: its context ended", s.formatID(op.slot, op.gen)))
	case in.gen != op.gen || in.state == stFree:
		op.finish(nil, driver.Errorf(driver.ErrNotFound, "sim: instance %s was deleted before its create finished", s.formatID(op.slot, op.gen)))
	case in.state == stCreating:
		id := s.formatID(op.slot, op.gen)
		name := op.name
		if name == "" {
			name = id
		}
		p := driver.Progress{Instance: &driver.Instance{ID: id, Name: name, Node: s.nodes[in.node].name, State: driver.StateCreating}, Wait: hangWait}
		if !op.hang {
			p.Wait = time.Duration(op.due - now)
		}
		return p, nil
	case in.state == stDeleting:
		op.finish(nil, driver.Errorf(driver.ErrNotFound, "sim: instance %s is being deleted", s.formatID(op.slot, op.gen)))
	default:
		inst := s.snapshotNoTags(op.slot, in, now, op.name)
		inst.Tags = cloneMap(op.tags)
		op.finish(inst, nil)
	}
	return driver.Progress{Done: op.err == nil, Instance: op.inst}, op.err
}

// finish records the operation's result; s.mu is held.
func (op *createOp) finish(inst *driver.Instance, err error) {
	op.over, op.inst, op.err = true, inst, err
	op.name, op.tags = "", nil
	if stop, ok := op.s.pending[op]; ok {
		stop()
		delete(op.s.pending, op)
	}
}

// abandon runs when the create's context ends first: the operation reports
// ErrTimeout and an instance still being built is left failed, listed, for
// the caller to find and delete.
func (op *createOp) abandon() {
	s := op.s
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pending, op)
	if op.over || s.closed {
		return
	}
	op.abandoned = true
	in := s.slot(op.slot)
	if in.gen == op.gen && in.state == stCreating {
		now := s.clock.Now().UnixNano()
		in.state = stFailed
		in.setMessage("create abandoned: its context ended")
		in.finished = now
		s.emit(op.slot, in, driver.EventDie, now)
	}
}

// Delete starts removing the instance. An unknown id makes the operation
// finish with ErrNotFound; an instance on an offline node with
// ErrDeleteFailed. A create still in progress is cut short.
func (s *Sim) Delete(ctx context.Context, id string) (driver.Operation, error) {
	now, err := s.enter()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	slot, in, err := s.lookup(id)
	if err != nil {
		s.calls.add(Call{Op: "delete", Instance: id, Time: time.Unix(0, now), Err: err})
		return driver.Finished(nil, err), nil
	}
	nodeName := s.nodes[in.node].name
	if st, reason := s.nodeStatus(in.node, now); st == driver.NodeOffline {
		err := driver.Errorf(driver.ErrDeleteFailed, "sim: instance %s: node %s is %s", id, nodeName, reason)
		s.calls.add(Call{Op: "delete", Node: nodeName, Instance: id, Time: time.Unix(0, now), Err: err})
		return driver.Finished(nil, err), nil
	}
	s.calls.add(Call{Op: "delete", Node: nodeName, Instance: id, Time: time.Unix(0, now)})
	op := &deleteOp{s: s, slot: slot, gen: in.gen}
	if in.state == stDeleting {
		op.due = s.due.find(slot, in.gen, dueGone)
	} else {
		if in.state == stRunning || in.state == stSuspended {
			s.setEnded(slot, in, stDeleting, 137, now, driver.EventDie)
		} else {
			in.state = stDeleting
		}
		latency := int64(s.opts.DeleteLatency)
		if s.opts.LatencyJitter > 0 {
			latency += s.rng.Int64N(int64(s.opts.LatencyJitter))
		}
		if latency <= 0 {
			s.release(slot, in, now)
			return driver.Finished(nil, nil), nil
		}
		op.due = now + latency
		s.due.push(timer{at: op.due, slot: slot, gen: in.gen, kind: dueGone})
	}
	return op, nil
}

// deleteOp is a delete in progress.
type deleteOp struct {
	s         *Sim
	slot, gen uint32
	due       int64 // when the delete is over
}

func (op *deleteOp) Advance(ctx context.Context) (driver.Progress, error) {
	s := op.s
	now, err := s.enter()
	if err != nil {
		return driver.Progress{}, err
	}
	defer s.mu.Unlock()
	in := s.slot(op.slot)
	if in.gen != op.gen {
		return driver.Progress{Done: true}, nil
	}
	return driver.Progress{Wait: time.Duration(op.due - now)}, nil
}

// Get returns the instance with id id. An instance on an offline node is
// reported in state unknown.
func (s *Sim) Get(ctx context.Context, id string) (*driver.Instance, error) {
	now, err := s.enter()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	slot, in, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	return s.snapshot(slot, in, now), nil
}

// Find returns the instance named name; an instance created without a name
// is found by its id.
func (s *Sim) Find(ctx context.Context, name string) (*driver.Instance, error) {
	now, err := s.enter()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if slot, ok := s.names.get(name, s.nameIs); ok {
		return s.snapshot(slot, s.slot(slot), now), nil
	}
	if slot, in, err := s.lookup(name); err == nil && in.nameLen == 0 {
		return s.snapshot(slot, in, now), nil
	}
	return nil, driver.Errorf(driver.ErrNotFound, "sim: no instance named %q", name)
}

// List returns the instances carrying TagManaged and all of tags, in slot
// order. While nodes are unlisted (SetNodeUnlisted) it leaves out their
// instances and returns a *driver.PartialListError naming them.
func (s *Sim) List(ctx context.Context, tags map[string]string) ([]*driver.Instance, error) {
	var out []*driver.Instance
	err := s.Walk(ctx, tags, func(in *driver.Instance) error {
		out = append(out, in)
		return nil
	})
	var partial *driver.PartialListError
	if err != nil && !errors.As(err, &partial) {
		return nil, err
	}
	return out, err
}

// Walk is List one instance at a time (driver.Walker), under the sim's
// lock.
func (s *Sim) Walk(ctx context.Context, tags map[string]string, fn func(*driver.Instance) error) error {
	return s.walk(tags, func(slot uint32, in *inst, now int64) error {
		return fn(s.snapshot(slot, in, now))
	})
}

// Skim is Walk at a glance (driver.Skimmer), under the sim's lock: an
// instance's glance costs its id and its instance tag, where its snapshot
// costs about 850 bytes.
func (s *Sim) Skim(ctx context.Context, tags map[string]string, skim func(*driver.Glance) bool, fn func(*driver.Instance) error) error {
	var g driver.Glance
	return s.walk(tags, func(slot uint32, in *inst, now int64) error {
		g = driver.Glance{ID: s.formatID(slot, in.gen), State: s.stateOf(in, now)}
		if v, ok := s.lookupTag(s.chunkOf(slot), in, driver.TagInstance); ok {
			g.Instance = string(v)
		}
		if in.hasExit {
			code := int(in.exitCode)
			g.ExitCode = &code
		}
		if !skim(&g) {
			return nil
		}
		return fn(s.snapshot(slot, in, now))
	})
}

// Placement is where an instance is and what it holds there, as the sim
// really has it.
type Placement struct {
	Node      string
	Resources driver.Resources
	// Instance is the value of the instance's driver.TagInstance tag,
	// empty when it has none: a copy that the walk reuses.
	Instance []byte
}

// Placements calls fn with the placement of each instance List(ctx, nil)
// would return, under the sim's lock, for checks made on what the back-end
// really holds (no node over its capacity, none breaking a constraint):
// a placement costs nothing but its named resources, where a snapshot
// costs about 850 bytes. The placement, its Instance bytes included, is
// valid only during fn; an error from fn ends the walk and Placements
// returns it.
func (s *Sim) Placements(ctx context.Context, fn func(*Placement) error) error {
	var p Placement
	var id []byte
	return s.walk(nil, func(slot uint32, in *inst, now int64) error {
		p = Placement{Node: s.nodes[in.node].name, Resources: s.resources(in)}
		if len(p.Resources.Other) > 0 {
			p.Resources.Other = maps.Clone(p.Resources.Other)
		}
		id = id[:0]
		if v, ok := s.lookupTag(s.chunkOf(slot), in, driver.TagInstance); ok {
			id = append(id, v...)
		}
		p.Instance = id
		return fn(&p)
	})
}

// walk calls visit for each instance List(ctx, tags) would return, under
// the sim's lock, and returns what List would.
func (s *Sim) walk(tags map[string]string, visit func(slot uint32, in *inst, now int64) error) error {
	now, err := s.enter()
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	for ci, c := range s.chunks {
		for j := range c.slots {
			in := &c.slots[j]
			if in.state == stFree || (s.unlisted > 0 && s.nodes[in.node].unlisted) {
				continue
			}
			if _, ok := s.lookupTag(c, in, driver.TagManaged); !ok {
				continue
			}
			match := true
			for k, want := range tags {
				if v, ok := s.lookupTag(c, in, k); !ok || string(v) != want {
					match = false
					break
				}
			}
			if !match {
				continue
			}
			if err := visit(uint32(ci)<<chunkBits|uint32(j), in, now); err != nil {
				return err
			}
		}
	}
	if s.unlisted > 0 {
		return s.partialLocked()
	}
	return nil
}
