package local

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"

	"github.com/berth-dev/berth/driver"
)

// Logs copies the instance's stdout.log to stdout and stderr.log to stderr
// (each only if asked for; neither asked for means both). Tail keeps the
// last Tail lines of each file. With Follow it then keeps copying what the
// process writes, looking every poll_interval, until the instance is no
// longer running (it returns nil after a last copy) or ctx ends (it returns
// ctx's error).
func (d *Driver) Logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	if opts.Timestamps {
		return driver.Errorf(driver.ErrUnsupported, "local: logs with time stamps: the log files do not record when each line was written")
	}
	if err := d.checkOpen(); err != nil {
		return err
	}
	if _, err := d.Get(ctx, id); err != nil {
		return err
	}
	both := !opts.Stdout && !opts.Stderr
	var streams []*logStream
	if (opts.Stdout || both) && stdout != nil {
		streams = append(streams, &logStream{path: filepath.Join(d.instDir(id), "stdout.log"), w: stdout})
	}
	if (opts.Stderr || both) && stderr != nil {
		streams = append(streams, &logStream{path: filepath.Join(d.instDir(id), "stderr.log"), w: stderr})
	}
	for _, s := range streams {
		defer s.close()
		if err := s.open(opts.Tail); err != nil {
			return err
		}
	}
	copyAll := func() error {
		for _, s := range streams {
			if err := s.copy(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := copyAll(); err != nil || !opts.Follow {
		return err
	}
	for {
		in, err := d.Get(ctx, id)
		running := err == nil && live(in.State)
		if err := copyAll(); err != nil {
			return err
		}
		if !running {
			return nil
		}
		if err := sleep(ctx, d.opts.PollInterval); err != nil {
			return err
		}
	}
}

// logStream copies one log file to a writer, from where it last stopped.
type logStream struct {
	path string
	w    io.Writer
	f    *os.File // nil until the file exists
}

// open opens the file, positioned at its last tail lines (0: all). A file
// not written yet is opened later by copy.
func (s *logStream) open(tail int) error {
	f, err := os.Open(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	s.f = f
	if tail > 0 {
		off, err := tailOffset(f, tail)
		if err != nil {
			return err
		}
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return err
		}
	}
	return nil
}

func (s *logStream) copy() error {
	if s.f == nil {
		f, err := os.Open(s.path)
		if err != nil {
			return nil // still not written
		}
		s.f = f
	}
	_, err := io.Copy(s.w, s.f)
	return err
}

func (s *logStream) close() {
	if s.f != nil {
		s.f.Close()
	}
}

// tailOffset returns the offset at which the last n lines of f start. A
// last line without a newline counts as a line.
func tailOffset(f *os.File, n int) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	end := fi.Size()
	if end == 0 {
		return 0, nil
	}
	buf := make([]byte, 32*1024)
	pos := end
	count := 0
	// A trailing newline ends the last line; it does not start a new one.
	skipLast := true
	for pos > 0 {
		size := int64(len(buf))
		if pos < size {
			size = pos
		}
		pos -= size
		if _, err := f.ReadAt(buf[:size], pos); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		chunk := buf[:size]
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] != '\n' {
				skipLast = false
				continue
			}
			if skipLast && pos+int64(i) == end-1 {
				skipLast = false
				continue
			}
			count++
			if count == n {
				return pos + int64(i) + 1, nil
			}
		}
	}
	return 0, nil
}
