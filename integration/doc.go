// Package integration holds Berth's tests across packages on real back-ends:
// a control plane over the docker driver spanning the machine's Docker
// Engine and a second engine the tests start themselves, with a bbolt
// store. It has no code of its own; run it with
//
//	go test -race -count=1 ./integration/
//
// It needs a running Docker Engine at unix:///var/run/docker.sock, and
// root with dockerd and unshare installed for the second engine.
package integration
