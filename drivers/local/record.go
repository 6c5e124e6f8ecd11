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
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	if err == nil {
		err = writeAtomic(d.recordPath(rec.ID), b)
	}
	if err != nil {
		return fmt.Errorf("write record of %s: %w", rec.ID, err)
	}
	return nil
}

// writeAtomic replaces the file p with b: a temporary file, fsync, rename.
func writeAtomic(p string, b []byte) error {
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
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
	}
	return err
}

// The instance directories and name claims change only by renames and
// links out of <data_dir>/tmp, so that a Berth killed at any moment leaves
// every directory in instances/ with its record, and every claim in names/
// naming an instance whose record exists:
//
//   - a new instance directory is built as tmp/new-<pid>-<id> with its
//     record and renamed into instances/;
//   - a claim is written as tmp/claim-<pid>-<id> and hard-linked to
//     names/<name>, which fails if the name is taken; the claim is made
//     after the instance's record exists;
//   - an instance directory is renamed to tmp/del-<id>-<random> before it
//     is removed, after its claim was dropped.
//
// Open removes what a killed Berth left in tmp/ (see sweep).
func (d *Driver) tmpDir() string { return filepath.Join(d.dir, "tmp") }

// tmpPrefix starts the names of this process's files in tmp/.
func tmpPrefix(kind string) string { return kind + "-" + strconv.Itoa(os.Getpid()) + "-" }

// createRecord makes the instance directory of rec, holding its record,
// in one rename.
func (d *Driver) createRecord(rec *record) error {
	stage := filepath.Join(d.tmpDir(), tmpPrefix("new")+rec.ID)
	b, err := json.MarshalIndent(rec, "", "  ")
	if err == nil {
		err = os.Mkdir(stage, 0o700)
	}
	if err == nil {
		err = writeAtomic(filepath.Join(stage, "record.json"), b)
		if err == nil {
			err = os.Rename(stage, d.instDir(rec.ID))
		}
		if err != nil {
			os.RemoveAll(stage)
		}
	}
	if err != nil {
		return fmt.Errorf("write record of %s: %w", rec.ID, err)
	}
	return nil
}

// removeInstDir removes the directory of id: first out of instances/ in one
// rename, then its files. The caller has dropped id's name claim.
func (d *Driver) removeInstDir(id string) error {
	trash := filepath.Join(d.tmpDir(), "del-"+id+"-"+newID())
	if err := os.Rename(d.instDir(id), trash); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	return os.RemoveAll(trash)
}

// sweep removes what a Berth killed in the middle of a create or delete
// left in tmp/: the directories of deleted instances, and the staged
// directories and claims of Berth processes that no longer run. It also
// removes the directories in instances/ that have no record, which only a
// Berth that built them in place (before tmp/ existed) could leave. It
// returns the first error and goes on past it.
func (d *Driver) sweep() error {
	var first error
	keep := func(err error) {
		if first == nil && err != nil {
			first = err
		}
	}
	ents, err := os.ReadDir(d.tmpDir())
	keep(err)
	for _, e := range ents {
		kind, rest, _ := strings.Cut(e.Name(), "-")
		pid, _, _ := strings.Cut(rest, "-")
		switch kind {
		case "del":
		case "new", "claim":
			if n, err := strconv.Atoi(pid); err == nil && processExists(n) {
				continue
			}
		default:
			continue
		}
		keep(os.RemoveAll(filepath.Join(d.tmpDir(), e.Name())))
	}
	ids, err := d.ids()
	keep(err)
	for _, id := range ids {
		if _, err := os.Stat(d.recordPath(id)); errors.Is(err, os.ErrNotExist) {
			keep(d.removeInstDir(id))
		}
	}
	return first
}

// processExists reports whether a process with pid exists.
func processExists(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
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

// reserveName claims name for id by hard-linking a file holding id to
// <data_dir>/names/<name>; the link fails when the name is taken. The
// caller has written id's record. A claim whose instance has no record, or
// a record of another name and no change under way (a rename a killed
// Berth left half done), is stale and taken over.
func (d *Driver) reserveName(name, id string) error {
	tmp := filepath.Join(d.tmpDir(), tmpPrefix("claim")+id)
	if err := writeAtomic(tmp, []byte(id)); err != nil {
		return fmt.Errorf("claim name %q: %w", name, err)
	}
	defer os.Remove(tmp)
	p := d.namePath(name)
	for range 2 {
		err := os.Link(tmp, p)
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("claim name %q: %w", name, err)
		}
		owner := d.nameOwner(name)
		if owner == id {
			return nil // a claim of its own a cut-short rename left
		}
		if idRE.MatchString(owner) {
			rec, err := d.load(owner)
			// A record of another name is a rename cut short, unless the
			// rename is under way (it claims, then writes the record).
			renamed := err == nil && rec.Name != "" && rec.Name != name && !d.locks.busy(owner)
			if !renamed && !errors.Is(err, driver.ErrNotFound) {
				return driver.Errorf(driver.ErrAlreadyExists, "an instance named %q exists (%s)", name, owner)
			}
		}
		os.Remove(p) // stale: its instance is gone, or was renamed
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

// busy reports whether a change of id is under way or waiting.
func (l *locks) busy(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[id] != nil
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
