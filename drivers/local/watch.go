package local

import (
	"context"
	"time"

	"github.com/berth-dev/berth/driver"
)

// Watch looks at every instance each poll_interval (which also reaps the
// processes Berth is the parent of) and calls fn for each change since the
// previous look: start, die (with the exit code in Message), stop (after
// die, when the end was asked for), pause, unpause and delete. The first
// look only sets the baseline. It returns ctx's error when ctx ends.
func (d *Driver) Watch(ctx context.Context, fn func(driver.Event)) error {
	prev, err := d.snapshot(ctx)
	if err != nil {
		return err
	}
	t := time.NewTicker(d.opts.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		cur, err := d.snapshot(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		for _, ev := range driver.DiffListings(prev, cur, time.Now()) {
			fn(ev)
		}
		prev = cur
	}
}

func (d *Driver) snapshot(ctx context.Context) (map[string]*driver.Instance, error) {
	insts, err := d.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	m := make(map[string]*driver.Instance, len(insts))
	for _, in := range insts {
		m[in.ID] = in
	}
	return m, nil
}
