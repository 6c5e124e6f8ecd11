package ssh_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

// benchScript is what each launch runs, through Berth and through ssh.
const benchScript = `echo hello; exec sleep 1000`

// BenchmarkLaunch100 launches 100 processes on 4 hosts (sshd servers in
// network namespaces of their own), 8 at a time, once through the ssh
// back-end (with Berth's own binary as the supervisor; the connections are
// dialled in the timed part, the binary was copied before) and once with
// the same command over plain ssh(1) from a shell loop (xargs -P 8, a
// connection per launch, the process detached with setsid and its output
// in files, as the supervisor keeps it). It reports both times and their
// ratio. Run it alone, once:
//
//	go test -run '^$' -bench Launch100 -benchtime 1x ./drivers/ssh/
func BenchmarkLaunch100(b *testing.B) {
	const hosts, launches, parallel = 4, 100, 8
	dir := b.TempDir()
	berth := filepath.Join(dir, "berth")
	if out, err := exec.Command("go", "build", "-o", berth, "../../cmd/berth").CombinedOutput(); err != nil {
		b.Fatalf("build berth: %v: %s", err, out)
	}
	f := newFleet(b, hosts)
	opts := map[string]any{"supervisor_binary": berth}
	for b.Loop() {
		// The binary's one copy to each host, before the timed part.
		warm := f.open(b, opts)
		for i := range hosts {
			in := launchB(b, warm, nodeName(i))
			deleteB(b, warm, in.ID)
		}
		warm.Close(context.Background())

		start := time.Now()
		d := f.open(b, opts)
		ids := make([]string, launches)
		var wg sync.WaitGroup
		work := make(chan int)
		for range parallel {
			wg.Go(func() {
				for i := range work {
					ids[i] = launchB(b, d, nodeName(i%hosts)).ID
				}
			})
		}
		for i := range launches {
			work <- i
		}
		close(work)
		wg.Wait()
		viaBerth := time.Since(start)
		for _, id := range ids {
			deleteB(b, d, id)
		}
		d.Close(context.Background())

		viaSSH, pids := f.sshLoop(b, dir, launches, parallel)
		for _, pid := range pids {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
		if len(pids) != launches {
			b.Fatalf("the ssh loop launched %d processes, want %d", len(pids), launches)
		}
		b.ReportMetric(viaBerth.Seconds(), "berth-s")
		b.ReportMetric(viaSSH.Seconds(), "ssh-s")
		b.ReportMetric(viaBerth.Seconds()/viaSSH.Seconds(), "ratio")
	}
}

func launchB(b *testing.B, d driver.Driver, node string) *driver.Instance {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	op, err := d.Create(ctx, node, shSpec(benchScript))
	if err != nil {
		b.Fatalf("Create: %v", err)
	}
	in, err := driver.Drive(ctx, op)
	if err != nil {
		b.Fatalf("Create: %v", err)
	}
	return in
}

func deleteB(b *testing.B, d driver.Driver, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	op, err := d.Delete(ctx, id)
	if err == nil {
		_, err = driver.Drive(ctx, op)
	}
	if err != nil {
		b.Errorf("Delete %s: %v", id, err)
	}
}

// sshLoop launches n processes over plain ssh, p at a time, from a shell
// loop, and returns the time it took and the processes' pids.
func (f *fleet) sshLoop(b *testing.B, dir string, n, p int) (time.Duration, []int) {
	var hostsList []string
	for _, s := range f.servers {
		hostsList = append(hostsList, s.Host)
	}
	out := filepath.Join(dir, "ssh-out")
	if err := os.MkdirAll(out, 0o755); err != nil {
		b.Fatal(err)
	}
	// One launch: host i%4, a directory of its own, the process detached
	// with its output in files; the pid comes back on stdout.
	launch := fmt.Sprintf(`set -e
hosts="%s"
i=$1
set -- $hosts
shift $((i %% %d))
ssh -n -i %s -o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes -o BatchMode=yes -o LogLevel=ERROR root@$1 \
  "mkdir -p %s/$i; cd %s/$i; setsid sh -c '%s' </dev/null >stdout.log 2>stderr.log & echo \$!"
`, strings.Join(hostsList, " "), len(hostsList), f.key, f.knownHosts, out, out, benchScript)
	script := filepath.Join(dir, "launch.sh")
	if err := os.WriteFile(script, []byte(launch), 0o755); err != nil {
		b.Fatal(err)
	}
	loop := fmt.Sprintf("seq 0 %d | xargs -P %d -n 1 sh %s", n-1, p, script)
	start := time.Now()
	res, err := exec.Command("sh", "-c", loop).Output()
	took := time.Since(start)
	if err != nil {
		b.Fatalf("%s: %v", loop, err)
	}
	var pids []int
	for _, l := range strings.Fields(string(res)) {
		if pid, err := strconv.Atoi(l); err == nil {
			pids = append(pids, pid)
		}
	}
	return took, pids
}
