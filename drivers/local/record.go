package local

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
)

// phase is where an instance's record says it is. The live state of a
// started process comes from /proc; the phase only says what Berth did.
type phase string

const (
	phaseCreating phase = "creating" // intent written, process not started yet
	phaseStarted  phase = "started"  // a process was started; /proc tells the rest
	phaseExited   phase = "exited"   // the process ended by itself
	phaseStopped  phase = "stopped"  // the process ended after Stop
	phaseDeleting phase = "deleting" // Delete is removing the instance
	phaseFailed   phase = "failed"   // the create was interrupted before the process started
)

// record is the JSON file <data_dir>/instances/<id>/record.json. It is
// written before the process starts and after every change Berth makes or
// sees, each time by an atomic rename.
type record struct {
	ID      string               `json:"id"`
	Name    string               `json:"name,omitempty"`
	Node    string               `json:"node"`
	Spec    *driver.Spec         `json:"spec"`
	Tags    map[string]string    `json:"tags"`
	Created time.Time            `json:"created"`
	Phase   phase                `json:"phase"`
	Message string               `json:"message,omitempty"`
	Ports   []driver.PortMapping `json:"ports,omitempty"`
	// Stopping is set by Stop and Delete: the end of the current run was
	// asked for, so it counts as stopped rather than exited.
	Stopping bool `json:"stopping,omitempty"`
	Run      run  `json:"run"`
}

// run is one execution of the instance's process.
type run struct {
	PID int `json:"pid,omitempty"`
	// StartTicks is field 22 of /proc/<pid>/stat and BootID the boot it
	// belongs to: together with the pid they identify the process, so that a
	// recycled pid is never taken for it.
	StartTicks uint64    `json:"start_ticks,omitempty"`
	BootID     string    `json:"boot_id,omitempty"`
	Started    time.Time `json:"started,omitzero"`
	Finished   time.Time `json:"finished,omitzero"`
	ExitCode   *int      `json:"exit_code,omitempty"`
}

var idRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

func newID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

func (d *Driver) instDir(id string) string { return filepath.Join(d.dir, "instances", id) }

func (d *Driver) recordPath(id string) string {
	return filepath.Join(d.instDir(id), "record.json")
}

// load reads the record of id, or returns ErrNotFound.
func (d *Driver) load(id string) (*record, error) {
	if !idRE.MatchString(id) {
		return nil, driver.Errorf(driver.ErrNotFound, "instance %q", id)
	}
	b, err := os.ReadFile(d.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, driver.Errorf(driver.ErrNotFound, "instance %q", id)
	}
	if err != nil {
		return nil, fmt.Errorf("read record of %s: %w", id, err)
	}
	rec := new(record)
	if err := json.Unmarshal(b, rec); err != nil {
		return nil, fmt.Errorf("%w: record of %s is corrupt: %v", driver.ErrPermanent, id, err)
	}
	if rec.Spec == nil {
		rec.Spec = &driver.Spec{}
	}
	return rec, nil
}

// save writes rec atomically and durably: a temporary file, fsync, rename.
func (d *Driver) save(rec *record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	p := d.recordPath(rec.ID)
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write record of %s: %w", rec.ID, err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write record of %s: %w", rec.ID, err)
	}
	return nil
}

// ids lists the instance directories.
func (d *Driver) ids() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(d.dir, "instances"))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		if e.IsDir() && idRE.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func (d *Driver) namePath(name string) string { return filepath.Join(d.dir, "names", name) }

// reserveName claims name for id with an exclusive create of
// <data_dir>/names/<name>. A claim whose instance no longer exists is
// taken over.
func (d *Driver) reserveName(name, id string) error {
	p := d.namePath(name)
	for range 2 {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			_, err = f.WriteString(id)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			return err
		}
		if !errors.Is(err, os.ErrExist) {
			return err
		}
		owner, _ := os.ReadFile(p)
		if _, err := os.Stat(d.instDir(strings.TrimSpace(string(owner)))); err == nil || len(owner) == 0 {
			return driver.Errorf(driver.ErrAlreadyExists, "an instance named %q exists (%s)", name, owner)
		}
		os.Remove(p) // stale: its instance is gone
	}
	return driver.Errorf(driver.ErrAlreadyExists, "an instance named %q exists", name)
}

// releaseName drops the claim on name if id holds it.
func (d *Driver) releaseName(name, id string) {
	if name == "" {
		return
	}
	p := d.namePath(name)
	if owner, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(owner)) == id {
		os.Remove(p)
	}
}

// nameOwner returns the id holding name, or "".
func (d *Driver) nameOwner(name string) string {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return ""
	}
	owner, err := os.ReadFile(d.namePath(name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(owner))
}

// locks serialises the changes to one instance's record.
type locks struct {
	mu sync.Mutex
	m  map[string]*idLock
}

type idLock struct {
	sync.Mutex
	refs int
}

// lock locks id and returns the unlock function.
func (l *locks) lock(id string) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*idLock{}
	}
	k := l.m[id]
	if k == nil {
		k = &idLock{}
		l.m[id] = k
	}
	k.refs++
	l.mu.Unlock()
	k.Lock()
	return func() {
		k.Unlock()
		l.mu.Lock()
		if k.refs--; k.refs == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
}
