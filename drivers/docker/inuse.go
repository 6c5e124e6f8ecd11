package docker

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// measureConcurrency bounds the stats calls in flight on one engine.
const measureConcurrency = 4

// measureLoop measures e's use every usage interval while e is online,
// until ctx ends.
func (d *Driver) measureLoop(ctx context.Context, e *engine) {
	t := time.NewTicker(d.opts.UsageInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !e.online() {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, d.opts.CallTimeout)
		if err := d.measure(cctx, e); err != nil && ctx.Err() == nil {
			d.noteErr(e, err)
			d.log.Debug("docker: measuring use", "engine", e.cfg.Name, "err", err)
		}
		cancel()
	}
}

// measure reads the stats of every running Berth container on e and
// records their summed memory and, against the previous measurement, the
// cpus they used.
func (d *Driver) measure(ctx context.Context, e *engine) error {
	cl, err := e.cli.ContainerList(ctx, client.ContainerListOptions{Filters: make(client.Filters).Add("label", driver.TagManaged+"=true").Add("status", "running")})
	if err != nil {
		return err
	}
	var (
		mu     sync.Mutex
		memory driver.Bytes
		cpu    = make(map[string]uint64, len(cl.Items))
		sem    = make(chan struct{}, measureConcurrency)
		wg     sync.WaitGroup
	)
	for _, c := range cl.Items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s, err := oneStats(ctx, e.cli, c.ID)
			if err != nil {
				return // gone since the listing, or the engine is failing
			}
			mu.Lock()
			memory += memoryInUse(s)
			cpu[c.ID] = s.CPUStats.CPUUsage.TotalUsage
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cpuTime != nil {
		var used uint64
		for id, total := range cpu {
			if before, ok := e.cpuTime[id]; ok && total >= before {
				used += total - before
			}
		}
		elapsed := now.Sub(e.measuredAt)
		u := driver.Resources{Memory: memory}
		if elapsed > 0 {
			u.CPU = driver.CPUs(float64(used) / float64(elapsed.Nanoseconds()))
		}
		e.inUse = &u
	}
	e.cpuTime, e.measuredAt = cpu, now
	return nil
}

// oneStats reads one sample of container id's stats without waiting for a
// second one.
func oneStats(ctx context.Context, cli *client.Client, id string) (*container.StatsResponse, error) {
	res, err := cli.ContainerStats(ctx, id, client.ContainerStatsOptions{})
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var s container.StatsResponse
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		return nil, err
	}
	return &s, nil
}

// memoryInUse is a container's memory use without its page cache, as
// `docker stats` shows it.
func memoryInUse(s *container.StatsResponse) driver.Bytes {
	mem := s.MemoryStats.Usage
	cache := s.MemoryStats.Stats["total_inactive_file"]
	if c, ok := s.MemoryStats.Stats["inactive_file"]; ok {
		cache = c
	}
	if cache < mem {
		mem -= cache
	}
	return driver.Bytes(mem)
}
