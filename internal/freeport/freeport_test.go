package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestNeverTwice takes many ports, each listened on and closed at once, as
// a server that fails to start would: none is handed out twice, and each
// can be listened on when it is handed out.
func TestNeverTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		p := Port(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		l.Close()
	}
}
