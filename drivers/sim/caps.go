package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
)

// The environment variables whose values a sim instance writes, one line per
// start, to its stdout and stderr. Without EnvStdout it writes "started";
// without EnvStderr nothing.
const (
	EnvStdout = "SIM_STDOUT"
	EnvStderr = "SIM_STDERR"
)

// change runs fn on the live instance id with s.mu held, after recording the
// call. Instances on an offline node, and instances still being created or
// deleted, refuse with ErrRetryable.
func (s *Sim) change(op, id, detail string, fn func(now int64, slot uint32, in *inst) error) error {
	now, err := s.enter()
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	slot, in, err := s.lookup(id)
	if err == nil {
		node := s.nodes[in.node].name
		if st, reason := s.nodeStatus(in.node, now); st == driver.NodeOffline {
			err = driver.Errorf(driver.ErrRetryable, "sim: instance %s: node %s is %s", id, node, reason)
		} else if in.state == stCreating || in.state == stDeleting {
			err = driver.Errorf(driver.ErrRetryable, "sim: instance %s is %s", id, stateNames[in.state])
		} else {
			err = fn(now, slot, in)
		}
		s.calls.add(Call{Op: op, Node: node, Instance: id, Detail: detail, Time: time.Unix(0, now), Err: err})
		return err
	}
	s.calls.add(Call{Op: op, Instance: id, Detail: detail, Time: time.Unix(0, now), Err: err})
	return err
}

// Images lists the images present on node: its pool's images, the ones
// preloaded and, without strict_images, the ones fetched on first use.
func (s *Sim) Images(ctx context.Context, nodeName string) ([]driver.Image, error) {
	if _, err := s.enter(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	i, err := s.findNode(nodeName)
	if err != nil {
		return nil, err
	}
	var out []driver.Image
	for _, name := range s.nodeImages(i) {
		out = append(out, imageOf(name))
	}
	return out, nil
}

// imageOf describes image name with a size and id derived from the name.
func imageOf(name string) driver.Image {
	h := mix(hashString(name))
	return driver.Image{
		Name: name,
		ID:   fmt.Sprintf("sha256:%016x%016x", h, mix(h)),
		Size: driver.Bytes(20+h%480) * driver.MiB,
	}
}

func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// Preload makes image present on nodes (every node when nodes is empty),
// reporting "present" for a node that had it and "pulling" then "done" for
// one that did not. Unknown nodes are ErrNotFound before anything is done;
// offline nodes are skipped and reported with ErrRetryable.
func (s *Sim) Preload(ctx context.Context, image string, nodes []string, progress func(driver.PreloadProgress)) error {
	if image == "" || strings.ContainsAny(image, " \t\n") {
		return &driver.FieldError{Path: "image", Reason: fmt.Sprintf("%q: not an image reference", image)}
	}
	img := normImage(image)
	now, err := s.enter()
	if err != nil {
		return err
	}
	var idx []int32
	if len(nodes) == 0 {
		for i := range s.nodes {
			idx = append(idx, int32(i))
		}
	} else {
		for _, name := range nodes {
			i, err := s.findNode(name)
			if err != nil {
				s.mu.Unlock()
				return err
			}
			idx = append(idx, i)
		}
	}
	s.calls.add(Call{Op: "preload", Detail: img, Time: time.Unix(0, now)})
	var reports []driver.PreloadProgress
	var errs []error
	size := int64(imageOf(img).Size)
	for _, i := range idx {
		n := &s.nodes[i]
		switch st, reason := s.nodeStatus(i, now); {
		case st == driver.NodeOffline:
			err := driver.Errorf(driver.ErrRetryable, "sim: preload %s: node %s is %s", img, n.name, reason)
			errs = append(errs, err)
			reports = append(reports, driver.PreloadProgress{Node: n.name, Image: img, Status: "failed", Err: err.Error()})
		case s.hasImage(i, img):
			reports = append(reports, driver.PreloadProgress{Node: n.name, Image: img, Status: "present", Current: size, Total: size})
		default:
			if n.images == nil {
				n.images = map[string]bool{}
			}
			n.images[img] = true
			reports = append(reports,
				driver.PreloadProgress{Node: n.name, Image: img, Status: "pulling", Total: size},
				driver.PreloadProgress{Node: n.name, Image: img, Status: "done", Current: size, Total: size})
		}
	}
	s.mu.Unlock()
	if progress != nil {
		for _, r := range reports {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%w: sim: preload %s: %w", driver.ErrTimeout, img, err)
			}
			progress(r)
		}
	}
	return errors.Join(errs...)
}

// Resize sets the cpus and memory of an instance; zero fields are left
// unchanged. ErrInsufficientCapacity when the node has no room for the
// growth.
func (s *Sim) Resize(ctx context.Context, id string, r driver.Resources) error {
	if err := driver.ValidateResources("", r); err != nil {
		return fmt.Errorf("sim: resize: %w", err)
	}
	return s.change("resize", id, fmt.Sprintf("cpus=%s memory=%s", r.CPU, r.Memory), func(now int64, slot uint32, in *inst) error {
		old := s.resources(in)
		next := old
		if r.CPU != 0 {
			next.CPU = r.CPU
		}
		if r.Memory != 0 {
			next.Memory = r.Memory
		}
		n := &s.nodes[in.node]
		reserved := n.reserved.Sub(old).Add(next)
		if !reserved.Fits(s.pools[n.pool].Resources) {
			return driver.Errorf(driver.ErrInsufficientCapacity, "sim: resize %s: node %s has no room for cpus %s memory %s", id, n.name, next.CPU, next.Memory)
		}
		n.reserved = reserved
		if in.state == stRunning || in.state == stSuspended {
			n.active = n.active.Sub(old).Add(next)
		}
		lk := s.looks.at(in.look)
		in.look = s.lookID(lk.image, lk.kind, next)
		return nil
	})
}

// Start starts a stopped, exited or failed instance; a running or suspended
// one is left as it is.
func (s *Sim) Start(ctx context.Context, id string) error {
	return s.change("start", id, "", func(now int64, slot uint32, in *inst) error {
		if in.state != stRunning && in.state != stSuspended {
			s.setRunning(slot, in, now, driver.EventStart)
		}
		return nil
	})
}

// Stop stops an instance; it exits 0 at once, so grace is never needed.
// Stopping a stopped instance does nothing.
func (s *Sim) Stop(ctx context.Context, id string, grace time.Duration) error {
	return s.change("stop", id, "", func(now int64, slot uint32, in *inst) error {
		if in.state == stRunning || in.state == stSuspended {
			s.setEnded(slot, in, stStopped, 0, now, driver.EventStop)
		}
		return nil
	})
}

// Restart stops the instance if it runs and starts it again.
func (s *Sim) Restart(ctx context.Context, id string, grace time.Duration) error {
	return s.change("restart", id, "", func(now int64, slot uint32, in *inst) error {
		if in.state == stRunning || in.state == stSuspended {
			s.setEnded(slot, in, stStopped, 0, now, driver.EventDie)
		}
		s.setRunning(slot, in, now, driver.EventStart)
		return nil
	})
}

// signalCodes maps the signals Kill acts on to the exit code they cause; -1
// means the instance handles the signal and keeps running.
var signalCodes = map[string]int{
	"HUP": 129, "INT": 130, "QUIT": 131, "KILL": 137, "TERM": 0,
	"USR1": -1, "USR2": -1, "WINCH": -1,
}

// Kill sends signal to a running or suspended instance. KILL ends it with
// exit code 137, TERM with 0, HUP, INT and QUIT with 128 plus the signal;
// USR1, USR2 and WINCH are handled and it keeps running. A signal that
// driver.ParseSignal rejects, or another signal the sim does not act on, is
// ErrInvalid; an instance that is not running is ErrPermanent.
func (s *Sim) Kill(ctx context.Context, id string, signal string) error {
	name, _, err := driver.ParseSignal(signal)
	if err != nil {
		return fmt.Errorf("sim: kill: %w", err)
	}
	code, ok := signalCodes[name]
	if !ok {
		return fmt.Errorf("sim: kill: %w", &driver.FieldError{Path: "signal", Reason: fmt.Sprintf("%q: not a signal the sim acts on", signal)})
	}
	return s.change("kill", id, signal, func(now int64, slot uint32, in *inst) error {
		if in.state != stRunning && in.state != stSuspended {
			return driver.Errorf(driver.ErrPermanent, "sim: kill %s: instance is %s, not running; start it first", id, stateNames[in.state])
		}
		if code >= 0 {
			s.setEnded(slot, in, stExited, code, now, driver.EventDie)
		}
		return nil
	})
}

// Suspend pauses a running instance; a suspended one is left as it is and
// any other is ErrPermanent.
func (s *Sim) Suspend(ctx context.Context, id string) error {
	return s.change("suspend", id, "", func(now int64, slot uint32, in *inst) error {
		switch in.state {
		case stSuspended:
			return nil
		case stRunning:
			in.state = stSuspended
			s.emit(slot, in, driver.EventSuspend, now)
			return nil
		}
		return driver.Errorf(driver.ErrPermanent, "sim: suspend %s: instance is %s, not running; start it first", id, stateNames[in.state])
	})
}

// Resume unpauses a suspended instance; ErrNotSuspended otherwise.
func (s *Sim) Resume(ctx context.Context, id string) error {
	return s.change("resume", id, "", func(now int64, slot uint32, in *inst) error {
		if in.state != stSuspended {
			return driver.Errorf(driver.ErrNotSuspended, "sim: resume %s: instance is %s", id, stateNames[in.state])
		}
		in.state = stRunning
		s.emit(slot, in, driver.EventResume, now)
		return nil
	})
}

// output returns the instance's log lines: each start wrote one line to
// stdout and, with EnvStderr set, one to stderr.
func output(line string, starts uint32, tail int) string {
	if line == "" {
		return ""
	}
	n := int(starts)
	if tail > 0 && tail < n {
		n = tail
	}
	return strings.Repeat(line+"\n", n)
}

// Logs writes the instance's output. With Follow it then waits, writing the
// lines of each new start, until ctx ends (ctx's error), the instance stops
// or is deleted (nil), or the sim is closed.
func (s *Sim) Logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	if opts.Timestamps {
		return driver.Errorf(driver.ErrUnsupported, "sim: logs with time stamps: simulated output carries none")
	}
	if _, err := s.enter(); err != nil {
		return err
	}
	_, in, err := s.lookup(id)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	outLine, errLine := in.lines()
	starts, state := in.starts, in.state
	var wait chan struct{}
	if opts.Follow {
		wait = s.waitChan()
	}
	s.mu.Unlock()
	write := func(from, to uint32, tail int) error {
		if opts.Stdout {
			if _, err := io.WriteString(stdout, output(outLine, to-from, tail)); err != nil {
				return err
			}
		}
		if opts.Stderr {
			if _, err := io.WriteString(stderr, output(errLine, to-from, tail)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := write(0, starts, opts.Tail); err != nil {
		return err
	}
	ended := func(st uint8) bool { return st != stRunning && st != stSuspended && st != stCreating }
	for opts.Follow && !ended(state) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return nil
		case <-wait:
		}
		if _, err := s.enter(); err != nil {
			return nil
		}
		_, in, err := s.lookup(id)
		if err != nil {
			s.mu.Unlock()
			return nil
		}
		var now uint32
		now, state = in.starts, in.state
		wait = s.waitChan()
		s.mu.Unlock()
		if err := write(starts, now, 0); err != nil {
			return err
		}
		starts = now
	}
	return nil
}

// Usage reports a running instance's usage: a share of its cpus and memory
// drawn per minute from the seed; zero when it is not running.
func (s *Sim) Usage(ctx context.Context, id string) (*driver.Usage, error) {
	now, err := s.enter()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	slot, in, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	u := &driver.Usage{Time: time.Unix(0, now)}
	if in.state == stRunning {
		h := mix(s.opts.Seed, uint64(slot), uint64(in.gen), uint64(now/int64(time.Minute)))
		f := 0.05 + 0.9*unit(h)
		g := 0.1 + 0.8*unit(mix(h))
		z := s.looks.at(in.look).size
		u.CPU = driver.MilliCPU(float64(z.cpu) * f)
		u.Memory = driver.Bytes(float64(z.memory) * g)
	}
	return u, nil
}

// Console returns a boot banner followed by the instance's stdout.
func (s *Sim) Console(ctx context.Context, id string) (string, error) {
	now, err := s.enter()
	if err != nil {
		return "", err
	}
	defer s.mu.Unlock()
	slot, in, err := s.lookup(id)
	if err != nil {
		return "", err
	}
	inst := s.snapshot(slot, in, now)
	stdout, _ := in.lines()
	return fmt.Sprintf("sim console: %s (%s) on %s\n", inst.ID, inst.Name, inst.Node) + output(stdout, in.starts, 0), nil
}
