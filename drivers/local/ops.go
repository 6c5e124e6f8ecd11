package local

import (
	"context"
	"fmt"
	"maps"
	"syscall"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/internal/procfs"
)

// Create records the instance (its intent) in data_dir before anything
// else, then claims its name, and returns an operation of two steps: write
// the instance's files and choose its ports, then start the process. Each
// step takes a few milliseconds. A failure before the process starts
// removes the record again; nothing is left behind. A name that is taken
// gives ErrAlreadyExists. A Berth killed at any point leaves every claimed
// name held by an instance that List returns, with its tags.
func (d *Driver) Create(ctx context.Context, node string, spec *driver.Spec) (driver.Operation, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	sp, err := d.checkSpec(node, spec)
	if err != nil {
		return nil, err
	}
	tags := maps.Clone(sp.Tags)
	if tags == nil {
		tags = map[string]string{}
	}
	tags[driver.TagManaged] = "true"
	rec := &record{ID: newID(), Name: sp.Name, Node: d.node, Spec: sp, Tags: tags, Created: time.Now(), Phase: phaseCreating}
	d.inflight.Store(rec.ID, struct{}{}) // before the record is visible
	// The lock keeps a Delete of the instance (found by List) from running
	// between the record and the claim.
	unlock := d.locks.lock(rec.ID)
	if err := d.createRecord(rec); err != nil {
		d.inflight.Delete(rec.ID)
		unlock()
		return nil, fmt.Errorf("%w: %w", driver.ErrRetryable, err)
	}
	// The name is claimed once the record exists, so that every claim
	// names an instance that List returns, whenever Berth stops.
	if rec.Name != "" {
		if err := d.reserveName(rec.Name, rec.ID); err != nil {
			d.discard(rec)
			unlock()
			if driver.ClassOf(err) == nil {
				err = fmt.Errorf("%w: %w", driver.ErrRetryable, err)
			}
			return nil, err
		}
	}
	unlock()
	step := func(do func() error) func(context.Context) (bool, *driver.Instance, error) {
		return func(context.Context) (bool, *driver.Instance, error) {
			unlock := d.locks.lock(rec.ID)
			defer unlock()
			if _, ok := d.inflight.Load(rec.ID); !ok {
				return false, nil, driver.Errorf(driver.ErrNotFound, "instance %s was deleted while being created", rec.ID)
			}
			err := ctx.Err()
			if err != nil {
				err = fmt.Errorf("%w: create abandoned before the process started: %w", driver.ErrTimeout, err)
			} else {
				err = do()
			}
			if err != nil {
				d.discard(rec)
				return false, nil, err
			}
			return true, d.instance(rec, liveInfo{}), nil
		}
	}
	return driver.Steps(
		step(func() error {
			if err := d.prepare(ctx, rec); err != nil {
				return err
			}
			return d.save(rec)
		}),
		step(func() error {
			if err := d.launch(rec); err != nil {
				return err
			}
			d.inflight.Delete(rec.ID)
			return nil
		}),
	), nil
}

// discard removes everything of an instance whose process never started:
// its name claim, then its directory.
func (d *Driver) discard(rec *record) {
	d.inflight.Delete(rec.ID)
	d.releaseName(rec.Name, rec.ID)
	if err := d.removeInstDir(rec.ID); err != nil {
		d.log.Warn("local: cannot remove the directory of a failed create", "id", rec.ID, "err", err)
	}
}

// Delete returns an operation that stops the process group (SIGTERM, then
// SIGKILL after the stop_grace option) and then removes the instance's
// directory, cgroup and name. An unknown id finishes with ErrNotFound.
func (d *Driver) Delete(ctx context.Context, id string) (driver.Operation, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	unlock := d.locks.lock(id)
	rec, li, err := d.refresh(id)
	if err != nil {
		unlock()
		if driver.ClassOf(err) == driver.ErrNotFound {
			return driver.Finished(nil, err), nil
		}
		return nil, err
	}
	d.inflight.Delete(id) // a create in progress fails at its next step
	rec.Phase = phaseDeleting
	rec.Stopping = true
	if err := d.save(rec); err != nil {
		unlock()
		return nil, fmt.Errorf("%w: %w", driver.ErrRetryable, err)
	}
	if li.alive {
		signalGroup(rec.Run.PID, syscall.SIGTERM)
	}
	unlock()
	w := &ender{d: d, id: id, pgid: rec.Run.PID, deadline: time.Now().Add(d.opts.StopGrace)}
	return driver.Steps(
		func(context.Context) (bool, *driver.Instance, error) {
			if err := ctx.Err(); err != nil {
				return false, nil, fmt.Errorf("%w: delete of %s abandoned: %w", driver.ErrTimeout, id, err)
			}
			done, err := w.step()
			if err != nil && driver.ClassOf(err) != driver.ErrNotFound {
				err = fmt.Errorf("%w: %w", driver.ErrDeleteFailed, err)
			}
			return done, nil, err
		},
		func(context.Context) (bool, *driver.Instance, error) {
			unlock := d.locks.lock(id)
			defer unlock()
			rec, err := d.load(id)
			if err != nil {
				return false, nil, err
			}
			d.cg.remove(id)
			// The claim goes first: a claim never outlives its record.
			d.releaseName(rec.Name, id)
			if err := d.removeInstDir(id); err != nil {
				return false, nil, fmt.Errorf("%w: %w", driver.ErrDeleteFailed, err)
			}
			d.mu.Lock()
			delete(d.usage, id)
			d.mu.Unlock()
			return true, nil, nil
		},
	), nil
}

// signalGroup sends sig to the process group pgid, and SIGCONT after it so
// that a suspended group handles it.
func signalGroup(pgid int, sig syscall.Signal) {
	syscall.Kill(-pgid, sig)
	if sig != syscall.SIGKILL && sig != syscall.SIGSTOP && sig != syscall.SIGCONT {
		syscall.Kill(-pgid, syscall.SIGCONT)
	}
}

// ender waits, one non-blocking step at a time, for an instance's process
// group to end after SIGTERM, and sends SIGKILL at the deadline. Once the
// leader has ended, the members left behind (see stragglers) get SIGTERM,
// and SIGKILL at the deadline.
type ender struct {
	d        *Driver
	id       string
	pgid     int // 0: no group to wait for
	deadline time.Time
	termed   bool // the stragglers have had SIGTERM
}

// step reports whether the group has ended.
func (w *ender) step() (bool, error) {
	if w.pgid == 0 {
		return true, nil
	}
	unlock := w.d.locks.lock(w.id)
	_, li, err := w.d.refresh(w.id) // reaps the leader when it is Berth's child
	unlock()
	if err != nil {
		return false, err
	}
	late := !time.Now().Before(w.deadline)
	if li.alive {
		if late {
			syscall.Kill(-w.pgid, syscall.SIGKILL)
		}
		return false, nil
	}
	left, err := stragglers(w.pgid, envInstanceID+"="+w.id)
	if err != nil || len(left) == 0 {
		return err == nil, err
	}
	for _, pid := range left {
		switch {
		case late:
			syscall.Kill(pid, syscall.SIGKILL)
		case !w.termed:
			syscall.Kill(pid, syscall.SIGTERM)
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	w.termed = true
	return false, nil
}

// Start runs a stopped, exited or failed instance again with the same
// record: same command, environment and files, the same host ports when
// still free. Its logs are appended to. Starting a running instance does
// nothing.
func (d *Driver) Start(ctx context.Context, id string) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	unlock := d.locks.lock(id)
	defer unlock()
	rec, li, err := d.refresh(id)
	if err != nil {
		return err
	}
	switch {
	case li.alive:
		return nil
	case rec.Phase == phaseDeleting:
		return driver.Errorf(driver.ErrNotFound, "instance %s is being deleted", id)
	case rec.Phase == phaseCreating:
		return driver.Errorf(driver.ErrRetryable, "instance %s is being created", id)
	}
	if err := d.prepare(ctx, rec); err != nil {
		return err
	}
	return d.launch(rec)
}

// Stop sends SIGTERM to the instance's process group and SIGKILL after
// grace, and returns once the group has ended (or ctx ends, with
// ErrTimeout). The instance is then stopped. Stopping an instance that is
// not running does nothing.
func (d *Driver) Stop(ctx context.Context, id string, grace time.Duration) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	unlock := d.locks.lock(id)
	rec, li, err := d.refresh(id)
	if err != nil || !li.alive {
		unlock()
		return err
	}
	rec.Stopping = true
	if err := d.save(rec); err != nil {
		unlock()
		return err
	}
	signalGroup(rec.Run.PID, syscall.SIGTERM)
	unlock()
	w := &ender{d: d, id: id, pgid: rec.Run.PID, deadline: time.Now().Add(grace)}
	for {
		done, err := w.step()
		if err != nil || done {
			return err
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return fmt.Errorf("%w: stop of %s: %w", driver.ErrTimeout, id, err)
		}
	}
}

// Restart stops the instance (as Stop) and starts it again.
func (d *Driver) Restart(ctx context.Context, id string, grace time.Duration) error {
	if err := d.Stop(ctx, id, grace); err != nil {
		return err
	}
	return d.Start(ctx, id)
}

// Kill sends signal ("TERM", "SIGKILL", "9", ...) to the instance's process
// group. An unknown signal is ErrInvalid; an instance that is not running
// gives ErrPermanent. A process that dies of it counts as exited.
func (d *Driver) Kill(ctx context.Context, id string, signal string) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	sig, ok := parseSignal(signal)
	if !ok {
		return &driver.FieldError{Path: "signal", Reason: fmt.Sprintf("%q: want a name such as TERM or SIGKILL, or a number from 1 to 64", signal)}
	}
	unlock := d.locks.lock(id)
	defer unlock()
	rec, li, err := d.refresh(id)
	if err != nil {
		return err
	}
	if !li.alive {
		return driver.Errorf(driver.ErrPermanent, "instance %s is not running", id)
	}
	if err := syscall.Kill(-rec.Run.PID, sig); err != nil {
		return driver.Errorf(driver.ErrPermanent, "signal %s to instance %s: %v", signal, id, err)
	}
	return nil
}

// Suspend stops the instance's process group with SIGSTOP and returns once
// the process shows as stopped. Suspending a suspended instance does
// nothing; one that is not running gives ErrPermanent.
func (d *Driver) Suspend(ctx context.Context, id string) error {
	return d.pause(ctx, id, true)
}

// Resume continues a suspended instance with SIGCONT, or returns
// ErrNotSuspended.
func (d *Driver) Resume(ctx context.Context, id string) error {
	return d.pause(ctx, id, false)
}

func (d *Driver) pause(ctx context.Context, id string, stop bool) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	unlock := d.locks.lock(id)
	rec, li, err := d.refresh(id)
	suspended := li.alive && li.state == 'T'
	switch {
	case err != nil:
	case stop && !li.alive:
		err = driver.Errorf(driver.ErrPermanent, "instance %s is not running", id)
	case !stop && !suspended:
		err = driver.Errorf(driver.ErrNotSuspended, "instance %s", id)
	case stop && !suspended:
		syscall.Kill(-rec.Run.PID, syscall.SIGSTOP)
	case !stop:
		syscall.Kill(-rec.Run.PID, syscall.SIGCONT)
	}
	unlock()
	if err != nil {
		return err
	}
	for {
		st, err := procfs.ReadStat(rec.Run.PID)
		if err != nil || (st.State == 'T') == stop {
			return nil // changed, or ended
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return fmt.Errorf("%w: %w", driver.ErrTimeout, err)
		}
	}
}

// Resize sets the instance's cpu and memory limits through its cgroup and
// records them, so that a later Start applies them too. Zero fields are left
// unchanged; disk, GPUs and other resources cannot be resized
// (ErrUnsupported). Without usable cgroups (see the cgroup_root option) it
// returns ErrUnsupported with the reason.
func (d *Driver) Resize(ctx context.Context, id string, r driver.Resources) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	if err := driver.ValidateResources("", r); err != nil {
		return err
	}
	unlock := d.locks.lock(id)
	defer unlock()
	rec, li, err := d.refresh(id)
	if err != nil {
		return err
	}
	if r.Disk != 0 || r.GPUs != 0 || len(r.Other) > 0 {
		return driver.Errorf(driver.ErrUnsupported, "only cpus and memory of a process can be resized")
	}
	if !d.cg.usable() {
		return d.cg.unsupported()
	}
	if r.CPU == 0 && r.Memory == 0 {
		return nil
	}
	want := driver.Resources{CPU: r.CPU, Memory: r.Memory}
	if !want.Fits(d.cap) {
		return driver.Errorf(driver.ErrInsufficientCapacity, "node %q has cpus %s and memory %s", d.node, d.cap.CPU, d.cap.Memory)
	}
	pgid := 0
	if li.alive {
		pgid = rec.Run.PID
	}
	if err := d.cg.apply(id, pgid, want); err != nil {
		return err
	}
	if r.CPU > 0 {
		rec.Spec.CPU = r.CPU
	}
	if r.Memory > 0 {
		rec.Spec.Memory = r.Memory
	}
	return d.save(rec)
}

// Rename gives instance id the name name: it claims name (names/<name>),
// writes the record with it, then drops the claim on the old name. A Berth
// killed in between leaves a claim on the old name whose record names
// another: reserveName takes such a claim over as stale.
func (d *Driver) Rename(ctx context.Context, id, name string) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	if err := driver.CheckName("name", name, driver.MaxNameLength); err != nil {
		return err
	}
	unlock := d.locks.lock(id)
	defer unlock()
	rec, err := d.load(id)
	if err != nil {
		return err
	}
	old := rec.Name
	if old == name {
		return nil
	}
	if err := d.reserveName(name, id); err != nil {
		return err
	}
	rec.Name = name
	if err := d.save(rec); err != nil {
		d.releaseName(name, id)
		return err
	}
	d.releaseName(old, id)
	return nil
}

var _ driver.Renamer = (*Driver)(nil)
