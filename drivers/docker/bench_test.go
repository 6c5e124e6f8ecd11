package docker

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// benchConcurrency is how many launches are in flight at once, for Berth
// and for the docker CLI alike.
const (
	benchContainers  = 200
	benchConcurrency = 8
)

// BenchmarkLaunch200 launches 200 containers of the test image through the
// driver (create, start, inspect each, driven by 8 workers) and then the
// same 200 with `docker run -d` from 8 parallel loops, and reports both
// times and their ratio (berth/cli). The containers are removed between the
// two runs and after them, outside the measured time. Run it with
// -benchtime=1x:
//
//	go test -run '^$' -bench Launch200 -benchtime 1x ./drivers/docker/
func BenchmarkLaunch200(b *testing.B) {
	if _, err := exec.LookPath("docker"); err != nil {
		b.Skip("the docker CLI is not installed: ", err)
	}
	o := testOptions(DefaultHost)
	ctx := context.Background()
	d, err := Open(ctx, o, driver.Env{Provider: "bench", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close(ctx)
	var berthTotal, cliTotal time.Duration
	for i := 0; i < b.N; i++ {
		run := randomID()
		berthTotal += measure(b, run, func(_ int) error {
			s := &driver.Spec{Image: helloImage, Tags: map[string]string{"berth.bench": run}}
			op, err := d.Create(ctx, "e1", s)
			if err != nil {
				return err
			}
			_, err = driver.Drive(ctx, op)
			return err
		})
		cliTotal += measure(b, run, func(_ int) error {
			out, err := exec.CommandContext(ctx, "docker", "run", "-d", "--label", "berth.bench="+run, helloImage).CombinedOutput()
			if err != nil {
				return fmt.Errorf("docker run: %v: %s", err, out)
			}
			return nil
		})
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(berthTotal.Seconds()/n, "berth-s/op")
	b.ReportMetric(cliTotal.Seconds()/n, "cli-s/op")
	b.ReportMetric(berthTotal.Seconds()/cliTotal.Seconds(), "ratio")
	b.Logf("%d containers, %d at a time: berth %.2fs, docker run -d %.2fs, ratio %.3f",
		benchContainers, benchConcurrency, berthTotal.Seconds()/n, cliTotal.Seconds()/n, berthTotal.Seconds()/cliTotal.Seconds())
}

// measure runs launch benchContainers times from benchConcurrency workers,
// returns the wall time, and removes the containers labelled berth.bench=run
// afterwards without counting that time.
func measure(b *testing.B, run string, launch func(i int) error) time.Duration {
	b.Helper()
	jobs := make(chan int)
	errs := make(chan error, benchContainers)
	var wg sync.WaitGroup
	b.StartTimer()
	start := time.Now()
	for range benchConcurrency {
		wg.Go(func() {
			for i := range jobs {
				if err := launch(i); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range benchContainers {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Error(err)
	}
	cleanupBench(b, run)
	return took
}

func cleanupBench(b *testing.B, run string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	list, err := mainCli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", "berth.bench="+run)})
	if err != nil {
		b.Errorf("cleanup: %v", err)
		return
	}
	ids := make(chan string)
	var wg sync.WaitGroup
	for range benchConcurrency {
		wg.Go(func() {
			for id := range ids {
				if _, err := mainCli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
					b.Errorf("cleanup: remove %s: %v", id, err)
				}
			}
		})
	}
	for _, c := range list.Items {
		ids <- c.ID
	}
	close(ids)
	wg.Wait()
}
