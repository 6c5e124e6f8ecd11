package local

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// TestArchiveConfinedAndOwned: copies of an instance running as nobody
// stay under its working directory (a ".." path, a symbolic link out and
// an archive entry out are refused, nothing outside written), what is
// copied in belongs to nobody, and a file nobody may not read is not
// copied out. Top lists the instance's process and refuses ps options
// by name.
func TestArchiveConfinedAndOwned(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs processes as nobody: it needs root")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	ctx := ctxT(t)
	sp := shSpec(`sleep 1000 & wait`)
	sp.User = "nobody"
	in := create(t, d, sp)
	waitFor(t, d, in.ID, "running", hasState(driver.StateRunning))
	work := d.workDir(in.ID)
	var fe *driver.FieldError

	arc := func(entries ...string) io.Reader {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, name := range entries {
			_ = tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
			_, _ = tw.Write([]byte("hi"))
		}
		_ = tw.Close()
		return &b
	}
	if err := d.CopyTo(ctx, in.ID, "/", arc("in.txt"), driver.CopyToOptions{}); err != nil {
		t.Fatalf("CopyTo /: %v", err)
	}
	fi, err := os.Lstat(filepath.Join(work, "in.txt"))
	if err != nil {
		t.Fatalf("the file copied in is not in the working directory: %v", err)
	}
	if uid := strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)); uid != nobody.Uid {
		t.Errorf("the file copied in belongs to uid %s, want nobody's %s", uid, nobody.Uid)
	}
	// A "./" entry leaves the directory copied into as it is.
	var dot bytes.Buffer
	tw := tar.NewWriter(&dot)
	_ = tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o777})
	_ = tw.Close()
	if err := d.CopyTo(ctx, in.ID, "/", &dot, driver.CopyToOptions{}); err != nil {
		t.Errorf("CopyTo of a ./ entry: %v", err)
	}
	if fi, err := os.Stat(work); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("the working directory after a ./ entry: %v, %v; want root's, 0755, as Berth made it", fi.Mode(), err)
	}
	outside := filepath.Join(filepath.Dir(d.instDir(in.ID)), "evil")
	if err := d.CopyTo(ctx, in.ID, "/", arc("../../evil"), driver.CopyToOptions{}); !errors.As(err, &fe) {
		t.Errorf("CopyTo of an entry leaving the directory: %v, want a field error", err)
	}
	if _, err := os.Lstat(outside); err == nil {
		t.Errorf("an archive entry was written outside the working directory, at %s", outside)
	}
	if _, err := d.StatPath(ctx, in.ID, "/../record.json"); !errors.As(err, &fe) || fe.Path != "path" {
		t.Errorf("StatPath of a path with ..: %v, want a field error on path", err)
	}
	if err := os.Symlink("/etc", filepath.Join(work, "out")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.StatPath(ctx, in.ID, "/out/passwd"); !errors.As(err, &fe) || fe.Path != "path" {
		t.Errorf("StatPath through a link out of the directory: %v, want a field error on path", err)
	}
	if _, err := d.CopyFrom(ctx, in.ID, "/out/passwd", io.Discard); !errors.As(err, &fe) {
		t.Errorf("CopyFrom through a link out of the directory: %v, want a field error", err)
	}
	if err := d.CopyTo(ctx, in.ID, "/out", arc("x"), driver.CopyToOptions{}); !errors.As(err, &fe) {
		t.Errorf("CopyTo through a link out of the directory: %v, want a field error", err)
	}
	if err := os.WriteFile(filepath.Join(work, "secret"), []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.CopyFrom(ctx, in.ID, "/secret", io.Discard); !errors.As(err, &fe) {
		t.Errorf("CopyFrom of root's 0600 file for nobody: %v, want refused", err)
	}

	ps, err := d.Top(ctx, in.ID, "")
	if err != nil || len(ps.Rows) == 0 || ps.Rows[0][0] != nobody.Uid || ps.Rows[0][1] != strconv.Itoa(pidOf(t, d, in.ID)) {
		t.Errorf("Top: %+v, %v; want the instance's process first, of nobody", ps, err)
	}
	if _, err := d.Top(ctx, in.ID, "aux"); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("Top with ps options: %v, want ErrUnsupported", err)
	}
}
