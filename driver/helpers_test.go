package driver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

func TestParseSignal(t *testing.T) {
	for _, c := range []struct {
		in   string
		name string
		num  int
	}{
		{"TERM", "TERM", 15}, {"sigkill", "KILL", 9}, {"SIGHUP", "HUP", 1},
		{"9", "KILL", 9}, {" usr1 ", "USR1", 10}, {"19", "STOP", 19},
	} {
		name, num, err := driver.ParseSignal(c.in)
		if err != nil || name != c.name || num != c.num {
			t.Errorf("ParseSignal(%q) = %q, %d, %v; want %q, %d", c.in, name, num, err, c.name, c.num)
		}
	}
	for _, bad := range []string{"", "SIGFOO", "0", "64", "-1", "KILLX"} {
		_, _, err := driver.ParseSignal(bad)
		var fe *driver.FieldError
		if !errors.As(err, &fe) || fe.Path != "signal" || !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("ParseSignal(%q) = %v; want a FieldError for signal", bad, err)
		}
	}
}

func TestFieldErrorsAddErr(t *testing.T) {
	var es driver.FieldErrors
	es.Add("name", "bad %d", 1)
	es.AddErr("ports", driver.FieldErrors{{Path: "[1].host_port", Reason: "r1"}, {Path: "", Reason: "r2"}})
	es.AddErr("engines[0]", &driver.FieldError{Path: "tls.cert", Reason: "r3"})
	es.AddErr("options", fmt.Errorf("wrapped: %w", driver.FieldErrors{{Path: "nodes", Reason: "r4"}}))
	es.AddErr("plain", errors.New("r5"))
	es.AddErr("nothing", nil)
	want := []string{"name", "ports[1].host_port", "ports", "engines[0].tls.cert", "options.nodes", "plain"}
	if len(es) != len(want) {
		t.Fatalf("got %d errors (%v), want %d", len(es), es, len(want))
	}
	for i, w := range want {
		if es[i].Path != w {
			t.Errorf("error %d path = %q, want %q", i, es[i].Path, w)
		}
	}
	if es[0].Reason != "bad 1" || es[5].Reason != "r5" {
		t.Errorf("reasons = %q, %q", es[0].Reason, es[5].Reason)
	}
}

func TestCheckName(t *testing.T) {
	if fe := driver.CheckName("name", "web-1.a_b", 63); fe != nil {
		t.Errorf("valid name rejected: %v", fe)
	}
	for _, bad := range []string{"", "-a", "a b", "é", "abcdefghij"} {
		if fe := driver.CheckName("engines[2].name", bad, 9); fe == nil || fe.Path != "engines[2].name" {
			t.Errorf("CheckName(%q) = %v; want an error for engines[2].name", bad, fe)
		}
	}
}

func TestFlagName(t *testing.T) {
	if got := driver.FlagName("local", driver.Option{Name: "stop_grace"}); got != "local-stop-grace" {
		t.Errorf("FlagName = %q, want local-stop-grace", got)
	}
}

// A waiter must not inherit the cancellation of the caller whose fetch it
// was waiting for.
func TestListCacheWaiterRefetchesAfterForeignCancel(t *testing.T) {
	started := make(chan struct{})
	calls := 0
	c := &driver.ListCache[int]{TTL: time.Hour, Fetch: func(ctx context.Context) (int, error) {
		calls++
		if calls == 1 {
			close(started)
			<-ctx.Done()
			return 0, ctx.Err()
		}
		return 42, nil
	}}
	ctxA, cancelA := context.WithCancel(context.Background())
	errA := make(chan error, 1)
	go func() { _, err := c.Get(ctxA); errA <- err }()
	<-started
	gotB := make(chan int, 1)
	go func() {
		v, err := c.Get(context.Background())
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		gotB <- v
	}()
	// Give B time to join A's fetch (the case under test); if it comes late
	// it fetches on its own, and must get 42 either way.
	time.Sleep(20 * time.Millisecond)
	cancelA()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("fetching caller: %v, want context.Canceled", err)
	}
	if v := <-gotB; v != 42 {
		t.Fatalf("waiter got %d, want 42", v)
	}
}
