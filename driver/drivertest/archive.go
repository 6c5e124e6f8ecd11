package drivertest

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// testArchive copies a directory holding a file into a running instance,
// describes both, copies the directory out again and compares; a path
// that does not exist is ErrNotFound for each call.
func (s *suite) testArchive(t *testing.T) {
	a, _ := driver.As[driver.Archiver](s.d, driver.CapArchive)
	inst := s.startOne(t, "archive")
	ctx := s.ctx(t)
	content := bytes.Repeat([]byte("berth archive\n"), 1000)
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	_ = tw.WriteHeader(&tar.Header{Name: "berth-cp/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "berth-cp/file", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))})
	_, _ = tw.Write(content)
	_ = tw.Close()
	if err := a.CopyTo(ctx, inst.ID, "/", &in, driver.CopyToOptions{}); err != nil {
		t.Fatalf("CopyTo /: %v", err)
	}
	if st, err := a.StatPath(ctx, inst.ID, "/berth-cp/file"); err != nil || st.Name != "file" || st.Size != int64(len(content)) || !st.Mode.IsRegular() {
		t.Errorf("StatPath of the file copied in: %+v, %v; want file, %d bytes, regular", st, err, len(content))
	}
	if st, err := a.StatPath(ctx, inst.ID, "/berth-cp"); err != nil || !st.Mode.IsDir() {
		t.Errorf("StatPath of the directory copied in: %+v, %v", st, err)
	}
	var out bytes.Buffer
	st, err := a.CopyFrom(ctx, inst.ID, "/berth-cp", &out)
	if err != nil || !st.Mode.IsDir() {
		t.Fatalf("CopyFrom /berth-cp: %+v, %v", st, err)
	}
	got := map[string][]byte{}
	tr := tar.NewReader(&out)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the archive CopyFrom wrote: %v", err)
		}
		b, _ := io.ReadAll(tr)
		got[hdr.Name] = b
	}
	if _, ok := got["berth-cp/"]; !ok || !bytes.Equal(got["berth-cp/file"], content) {
		t.Errorf("CopyFrom /berth-cp: entries %v, want berth-cp/ and berth-cp/file with what was copied in", keys(got))
	}
	if _, err := a.StatPath(ctx, inst.ID, "/berth-no-such-file"); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("StatPath of a missing path: %v, want ErrNotFound", err)
	}
	if _, err := a.CopyFrom(ctx, inst.ID, "/berth-no-such-file", io.Discard); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("CopyFrom of a missing path: %v, want ErrNotFound", err)
	}
	if err := a.CopyTo(ctx, inst.ID, "/berth-no-such-dir", bytes.NewReader(nil), driver.CopyToOptions{}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("CopyTo a missing directory: %v, want ErrNotFound", err)
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// testTop lists the processes of a running instance: titles and at least
// one row as long as them.
func (s *suite) testTop(t *testing.T) {
	tp, _ := driver.As[driver.Topper](s.d, driver.CapTop)
	inst := s.startOne(t, "top")
	ps, err := tp.Top(s.ctx(t), inst.ID, "")
	if err != nil {
		t.Fatalf("Top: %v", err)
	}
	if len(ps.Titles) == 0 || len(ps.Rows) == 0 {
		t.Fatalf("Top: %+v, want titles and the instance's process", ps)
	}
	for i, row := range ps.Rows {
		if len(row) != len(ps.Titles) {
			t.Errorf("Top: row %d has %d values for %d titles: %q", i, len(row), len(ps.Titles), row)
		}
	}
}
