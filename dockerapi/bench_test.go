package dockerapi_test

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/drivers/docker/dockertest"
	"github.com/berth-dev/berth/reconciler"
)

const (
	benchContainers  = 200
	benchConcurrency = 8
)

// BenchmarkDockerRun200 runs 200 `docker run -d` from 8 parallel loops
// through Berth's Docker endpoint, then the same 200 straight against the
// engine, and reports both times and their ratio (berth/engine). Berth's
// time runs until all 200 are running as Berth sees them, not only until
// the CLI returns (Berth starts containers after it answers); the CLI's
// own time is reported too. Containers are removed between the runs,
// outside the measured time. Run it with -benchtime=1x:
//
//	go test -run '^$' -bench DockerRun200 -benchtime 1x ./dockerapi/
func BenchmarkDockerRun200(b *testing.B) {
	e := setup(b)
	ctx := context.Background()
	var berthTotal, berthCLI, engineTotal time.Duration
	for i := 0; i < b.N; i++ {
		run := dockertest.RandomID()
		b.StartTimer()
		start := time.Now()
		parallel(b, func(_ int) error {
			cmd := exec.Command("docker", "run", "-d", "-l", "bench="+run, helloImage)
			cmd.Env = append(cleanEnv(), "DOCKER_HOST=unix://"+e.sock, "DOCKER_CONFIG="+e.config)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("docker run through Berth: %v: %s", err, out)
			}
			return nil
		})
		berthCLI += time.Since(start)
		for {
			list, err := e.plane.Instances(ctx, control.Filter{Phases: []reconciler.Phase{reconciler.Running}})
			if err != nil {
				b.Fatal(err)
			}
			if len(list) >= benchContainers {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		berthTotal += time.Since(start)
		b.StopTimer()
		list, _ := e.plane.Instances(ctx, control.Filter{})
		for _, in := range list {
			_ = e.plane.Delete(ctx, in.ID)
		}
		for len(list) > 0 {
			time.Sleep(50 * time.Millisecond)
			list, _ = e.plane.Instances(ctx, control.Filter{})
		}

		b.StartTimer()
		start = time.Now()
		parallel(b, func(_ int) error {
			out, err := exec.Command("docker", "-H", dockertest.MainHost, "run", "-d", "-l", "bench="+run, helloImage).CombinedOutput()
			if err != nil {
				return fmt.Errorf("docker run: %v: %s", err, out)
			}
			return nil
		})
		engineTotal += time.Since(start)
		b.StopTimer()
		if _, err := removeByLabel(ctx, "bench", run); err != nil {
			b.Fatal(err)
		}
	}
	n := float64(b.N)
	b.ReportMetric(berthTotal.Seconds()/n, "berth-s/op")
	b.ReportMetric(berthCLI.Seconds()/n, "berth-cli-s/op")
	b.ReportMetric(engineTotal.Seconds()/n, "engine-s/op")
	b.ReportMetric(berthTotal.Seconds()/engineTotal.Seconds(), "ratio")
	b.Logf("%d docker run -d, %d at a time: through Berth %.2fs until all run (the CLI returned after %.2fs), straight to the engine %.2fs, ratio %.3f",
		benchContainers, benchConcurrency, berthTotal.Seconds()/n, berthCLI.Seconds()/n, engineTotal.Seconds()/n, berthTotal.Seconds()/engineTotal.Seconds())
}

// parallel runs launch benchContainers times from benchConcurrency workers.
func parallel(b *testing.B, launch func(i int) error) {
	b.Helper()
	jobs := make(chan int)
	errs := make(chan error, benchContainers)
	var wg sync.WaitGroup
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
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
