package vm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/berth-dev/berth/internal/testdeps"
)

// TestDownloads reads a file through the node's daemon a thousand times in
// a row, from offsets all over it, while it grows: go-libvirt's own
// download hung within a few dozen of these.
func TestDownloads(t *testing.T) {
	if _, err := os.Stat(DefaultSocket); err != nil {
		testdeps.Need(t, fmt.Errorf("no libvirt daemon (%v): apt-get install libvirt-daemon-system, and start libvirtd (.ci/run does)", err))
	}
	dir := t.TempDir()
	o := *DefaultOptions()
	o.StorageDir = dir
	d, err := New(context.Background(), o, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	n := d.nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	path := filepath.Join(dir, "grows.log")
	err = d.call(ctx, n, "make", func(lv *libvirt.Libvirt) error { return makeFile(lv, path, "raw", 0, nil, nil) })
	if err != nil {
		t.Fatal(err)
	}
	defer d.call(context.Background(), n, "pool", func(lv *libvirt.Libvirt) error {
		p, err := dirPool(lv, dir, false)
		if err == nil {
			err = lv.StoragePoolDestroy(p)
		}
		return err
	})
	var want []byte
	for i := range 1000 {
		line := bytes.Repeat([]byte{byte('a' + i%26)}, i%300)
		line = append(line, '\n')
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.Write(line)
		f.Close()
		want = append(want, line...)
		from := int64(i*37) % int64(len(want))
		var got []byte
		err = d.call(ctx, n, "read", func(lv *libvirt.Libvirt) error {
			var err error
			got, _, err = readFile(ctx, n, lv, path, from, 1<<20)
			return err
		})
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if !bytes.Equal(got, want[from:]) {
			t.Fatalf("read %d from %d: %d bytes, want %d", i, from, len(got), len(want)-int(from))
		}
	}
}
