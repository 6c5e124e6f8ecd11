package local

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/internal/procfs"
)

// Usage measures the instance's process group: the cpus used since the
// previous Usage of the same run (or over a fresh 100 ms window) and the sum
// of the members' resident memory. An instance that is not running uses
// nothing.
func (d *Driver) Usage(ctx context.Context, id string) (*driver.Usage, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	unlock := d.locks.lock(id)
	rec, li, err := d.refresh(id)
	unlock()
	if err != nil {
		return nil, err
	}
	if !li.alive {
		return &driver.Usage{Time: time.Now()}, nil
	}
	pgid := rec.Run.PID
	var rss int64
	sample := func() (uint64, error) {
		members, err := groupMembers(pgid)
		if err != nil {
			return 0, err
		}
		var ticks uint64
		rss = 0
		for _, m := range members {
			ticks += m.Ticks
			rss += m.RSSPages
		}
		return ticks, nil
	}
	d.mu.Lock()
	m := d.usage[id]
	if m == nil {
		m = &meter{}
		d.usage[id] = m
	}
	d.mu.Unlock()
	cpu, err := m.read(ctx, pgid, sample)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", driver.ErrTimeout, err)
		}
		return nil, err
	}
	return &driver.Usage{CPU: cpu, Memory: driver.Bytes(rss * int64(os.Getpagesize())), Time: time.Now()}, nil
}

// meter turns readings of a cumulative tick counter into a rate in cpus.
type meter struct {
	mu    sync.Mutex
	key   int // what is measured (a pid); a new key restarts the meter
	at    time.Time
	ticks uint64
	last  driver.MilliCPU
	valid bool
}

// minWindow is the shortest interval a cpu reading is averaged over.
const minWindow = 100 * time.Millisecond

// read returns the cpus used since the previous reading, or over a fresh
// window of minWindow when there is no usable previous reading. Readings
// closer together than minWindow return the previous value.
func (m *meter) read(ctx context.Context, key int, sample func() (uint64, error)) (driver.MilliCPU, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	t, err := sample()
	if err != nil {
		return 0, err
	}
	if m.valid && m.key == key && t >= m.ticks {
		if now.Sub(m.at) < minWindow {
			return m.last, nil
		}
	} else {
		if err := sleep(ctx, minWindow); err != nil {
			return 0, err
		}
		m.at, m.ticks = now, t
		now = time.Now()
		if t, err = sample(); err != nil {
			return 0, err
		}
	}
	cpus := float64(t-m.ticks) / procfs.UserHZ / now.Sub(m.at).Seconds()
	m.key, m.at, m.ticks, m.valid = key, now, t, true
	m.last = driver.CPUs(cpus)
	return m.last, nil
}

// hostInUse measures the host: cpus busy since the previous reading and
// memory not available (MemTotal - MemAvailable).
func (d *Driver) hostInUse(ctx context.Context) (*driver.Resources, error) {
	cpu, err := d.hostCPU.read(ctx, 0, func() (uint64, error) {
		busy, _, err := procfs.HostTicks()
		return busy, err
	})
	if err != nil {
		return nil, err
	}
	total, avail, err := meminfo()
	if err != nil {
		return nil, err
	}
	return &driver.Resources{CPU: min(cpu, driver.MilliCPU(runtime.NumCPU()*1000)), Memory: driver.Bytes(total - avail)}, nil
}
