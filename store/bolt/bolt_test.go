package bolt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/storetest"
)

// crashChildEnv names the store file a re-executed test binary writes to
// until it is killed.
const crashChildEnv = "BERTH_STORE_CRASH_CHILD"

func TestMain(m *testing.M) {
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(path)
		return
	}
	goleak.VerifyTestMain(m)
}

func openTemp(t testing.TB, opts Options) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "berth.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openTemp(t, Options{History: 500}) })
}

func TestConformanceNoGroupCommit(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openTemp(t, Options{History: 500, NoGroupCommit: true}) })
}

func TestReopenKeepsRevisions(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	s, err := Open(path, Options{History: 100})
	if err != nil {
		t.Fatal(err)
	}
	var last store.TxnResult
	for i := range 150 {
		last, err = s.Txn(ctx, nil, []store.Op{store.Put(fmt.Sprintf("/k/%d", i%10), []byte(strconv.Itoa(i)))})
		if err != nil {
			t.Fatal(err)
		}
	}
	first, err := s.Get(ctx, "/k/3")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, nil, []store.Op{store.Delete("/k/9")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(path, Options{History: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	kvs, rev, err := s.List(ctx, "/k/")
	if err != nil {
		t.Fatal(err)
	}
	if rev != last.Revision+1 || len(kvs) != 9 {
		t.Fatalf("after reopen: revision %d with %d keys, want %d with 9", rev, len(kvs), last.Revision+1)
	}
	got, err := s.Get(ctx, "/k/3")
	if err != nil {
		t.Fatal(err)
	}
	if got.CreateRevision != first.CreateRevision || got.ModRevision != first.ModRevision || string(got.Value) != "143" {
		t.Fatalf("after reopen /k/3 = %+v, before %+v", got, first)
	}
	// The revision sequence continues, and create revisions are kept.
	res, err := s.Txn(ctx, []store.Cmp{{Key: "/k/3", ModRevision: got.ModRevision}}, []store.Op{store.Put("/k/3", []byte("new"))})
	if err != nil || !res.Succeeded || res.Revision != rev+1 {
		t.Fatalf("Txn after reopen = %+v, %v; want succeeded at %d", res, err, rev+1)
	}
	if kv, _ := s.Get(ctx, "/k/3"); kv.CreateRevision != first.CreateRevision {
		t.Fatalf("create revision after reopen and put = %d, want %d", kv.CreateRevision, first.CreateRevision)
	}
	// The history starts at the reopen: a watch from before it is
	// compacted, one from the current revision sees what follows.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, err := s.Watch(wctx, "/k/", last.Revision); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("Watch from %d, before the reopen: err = %v, want ErrCompacted", last.Revision, err)
	}
	w, err := s.Watch(wctx, "/k/", res.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, nil, []store.Op{store.Put("/k/9", []byte("back"))}); err != nil {
		t.Fatal(err)
	}
	ev := <-w.Events()
	if ev.Type != store.EventPut || ev.KV.Key != "/k/9" || string(ev.KV.Value) != "back" || ev.KV.ModRevision != res.Revision+1 || ev.KV.CreateRevision != res.Revision+1 {
		t.Fatalf("first event after the reopen = %+v, want put of /k/9 at %d", ev, res.Revision+1)
	}
	cancel()
	for range w.Events() {
	}
	checkFile(t, s)
}

func TestSecondOpenFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = Open(path, Options{LockTimeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: err = %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Fatalf("second Open error %q does not name the file", err)
	}
}

func TestSecondProcessOpenFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The child tries to open the file the parent holds; it must fail
	// with ErrLocked (it exits 3 then) instead of writing.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("child opening a locked file: %v, output %q; want exit 3", err, out)
	}
	if !strings.Contains(string(out), "locked") {
		t.Fatalf("child output %q does not say the file is locked", out)
	}
}

func TestNotAStoreFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(path, []byte(strings.Repeat("not a database ", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, Options{}); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of a junk file: err = %v, want an error naming the file", err)
	}
}

// crashChild runs in a re-executed test binary: it commits Txns from
// several goroutines, printing "ack <key> <revision>" after each one
// returns, until it is killed.
func crashChild(path string) {
	s, err := Open(path, Options{LockTimeout: 100 * time.Millisecond, History: 200})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if errors.Is(err, ErrLocked) {
			os.Exit(3)
		}
		os.Exit(2)
	}
	ctx := context.Background()
	var mu sync.Mutex
	var wg sync.WaitGroup
	pid := os.Getpid()
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("/crash/%d/%d/%d", pid, g, i)
				res, err := s.Txn(ctx, []store.Cmp{{Key: key}}, []store.Op{
					store.Put(key, []byte(key)),
					store.Put(fmt.Sprintf("/crash/last/%d", g), []byte(key)),
				})
				if err != nil || !res.Succeeded {
					fmt.Fprintln(os.Stderr, "txn:", res, err)
					os.Exit(2)
				}
				mu.Lock()
				fmt.Fprintf(os.Stdout, "ack %s %d\n", key, res.Revision)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// TestCrashKeepsAcknowledgedTxns kills a writing child process at random
// moments; after each kill every Txn the child saw acknowledged is in the
// file with its revision, and the file is consistent.
func TestCrashKeepsAcknowledgedTxns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	var lastRev int64
	for round := range 4 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		acked := map[string]int64{}
		lines := make(chan string)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		// Kill after a random number of acknowledgements, so the kill
		// lands at a random point of a commit.
		killAt := 20 + rand.IntN(300)
		for line := range lines {
			f := strings.Fields(line)
			if len(f) != 3 || f[0] != "ack" {
				t.Fatalf("child printed %q", line)
			}
			rev, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			acked[f[1]] = rev
			if len(acked) == killAt {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
		}
		err = cmd.Wait()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child ended with %v, stderr %q; want killed", round, err, stderr.String())
		}
		if len(acked) < killAt {
			t.Fatalf("round %d: child acknowledged %d Txns, fewer than %d", round, len(acked), killAt)
		}

		s, err := Open(path, Options{History: 200})
		if err != nil {
			t.Fatalf("round %d: reopen after kill: %v", round, err)
		}
		checkFile(t, s)
		ctx := context.Background()
		for key, rev := range acked {
			kv, err := s.Get(ctx, key)
			if err != nil {
				t.Fatalf("round %d: acknowledged %s at %d: %v", round, key, rev, err)
			}
			if kv.ModRevision != rev || kv.CreateRevision != rev || string(kv.Value) != key {
				t.Fatalf("round %d: acknowledged %s at %d, found %+v", round, key, rev, kv)
			}
		}
		kvs, rev, err := s.List(ctx, "/crash/")
		if err != nil {
			t.Fatal(err)
		}
		if rev <= lastRev {
			t.Fatalf("round %d: revision %d did not advance past %d", round, rev, lastRev)
		}
		// Every revision up to rev holds one Txn of two puts: the keys
		// reflect a gapless sequence.
		seen := map[int64]bool{}
		for _, kv := range kvs {
			if !strings.HasPrefix(kv.Key, "/crash/last/") {
				if seen[kv.ModRevision] {
					t.Fatalf("round %d: revision %d used twice", round, kv.ModRevision)
				}
				seen[kv.ModRevision] = true
			}
		}
		if int64(len(seen)) != rev {
			t.Fatalf("round %d: %d Txns in the file, revision %d", round, len(seen), rev)
		}
		lastRev = rev
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// checkFile runs bbolt's consistency check and checks that no key was
// changed at a revision later than the store's.
func checkFile(t *testing.T, s *Store) {
	t.Helper()
	err := s.db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		rev, _ := getU64(tx.Bucket(bucketMeta).Get(metaRev))
		return tx.Bucket(bucketKV).ForEach(func(k, v []byte) error {
			if create, mod := createRevision(v), modRevision(v); create < 1 || create > mod || mod > rev {
				return fmt.Errorf("key %q: create revision %d, mod revision %d, store revision %d", k, create, mod, rev)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatalf("file check: %v", err)
	}
}

// TestOpensFormat1 opens a file written in format 1, which kept the change
// log in the file: the keys and revisions are kept, the log is dropped.
func TestOpensFormat1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		meta, _ := tx.CreateBucket(bucketMeta)
		kv, _ := tx.CreateBucket(bucketKV)
		log, _ := tx.CreateBucket(bucketLog)
		for _, e := range []struct {
			b    *bbolt.Bucket
			k, v []byte
		}{
			{meta, metaFormat, u64(1)}, {meta, metaRev, u64(7)}, {meta, metaCompact, u64(3)},
			{kv, []byte("/a"), encodeKV(2, 7, []byte("x"))},
			{log, []byte("any log entry"), []byte("v")},
		} {
			if err := e.b.Put(e.k, e.v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	kv, err := s.Get(context.Background(), "/a")
	if err != nil || string(kv.Value) != "x" || kv.CreateRevision != 2 || kv.ModRevision != 7 {
		t.Fatalf("Get(/a) = %+v, %v", kv, err)
	}
	res, err := s.Txn(context.Background(), nil, []store.Op{store.Put("/b", []byte("y"))})
	if err != nil || res.Revision != 8 {
		t.Fatalf("Txn after the upgrade = %+v, %v; want revision 8", res, err)
	}
	err = s.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketLog) != nil || tx.Bucket(bucketMeta).Get(metaCompact) != nil {
			return errors.New("the format 1 change log is still in the file")
		}
		if v, _ := getU64(tx.Bucket(bucketMeta).Get(metaFormat)); v != formatVersion {
			return fmt.Errorf("format %d, want %d", v, formatVersion)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, s)
}
