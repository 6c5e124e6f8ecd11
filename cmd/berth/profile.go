package main

import (
	"context"
	"fmt"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"sync"
	"time"
)

// heapWatchEvery is how often a heap watch reads the live heap.
const heapWatchEvery = time.Second

// startCPUProfile writes a CPU profile to path until stop is called.
func startCPUProfile(path string) (stop func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// watchHeap writes the heap profile to path each time the live heap (as
// the last collection measured it) is larger than it has been, reading it
// every heapWatchEvery, so that the file ends holding the profile of the
// largest live heap of the run, and once more when stop is called if the
// heap is larger then. The file is rewritten in place: its size stays that
// of one profile.
func watchHeap(ctx context.Context, path string) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg   sync.WaitGroup
		err  error
		most uint64
	)
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	write := func() {
		metrics.Read(sample)
		live := sample[0].Value.Uint64()
		if live <= most {
			return
		}
		most = live
		f, e := os.Create(path)
		if e == nil {
			e = pprof.Lookup("heap").WriteTo(f, 0)
			if ce := f.Close(); e == nil {
				e = ce
			}
		}
		if e != nil && err == nil {
			err = fmt.Errorf("--memprofile: %w", e)
		}
	}
	wg.Go(func() {
		t := time.NewTicker(heapWatchEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				write()
			}
		}
	})
	return func() error {
		cancel()
		wg.Wait()
		write()
		return err
	}
}
