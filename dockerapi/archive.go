package dockerapi

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
)

// statHeader carries a path's description, base64 of its JSON, in the
// answers of the archive routes.
const statHeader = "X-Docker-Container-Path-Stat"

// bodyLimit is how many bytes the body of r may have: an archive put into
// a container (docker cp) up to control.MaxArchiveBytes, any other body
// the server's MaxBodySize.
func (s *Server) bodyLimit(r *http.Request) int64 {
	if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/archive") {
		return control.MaxArchiveBytes
	}
	return s.maxBody
}

// archiveTarget returns the container of an archive route and the path
// the query names. Copying either way needs what an exec needs: an
// operator's token for the container's namespace, and a container Berth
// has made (one created and not started has no file system yet).
func (s *Server) archiveTarget(r *http.Request) (ref, string, error) {
	path := r.URL.Query().Get("path")
	if err := control.CheckArchivePath(path); err != nil {
		return ref{}, "", badRequest("%v", err)
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return ref{}, "", err
	}
	owner := c.in.Owner
	if c.created != nil {
		owner = c.created.owner
	}
	if id := identityOf(r); id.Authorize(auth.Operate, owner) != nil {
		return ref{}, "", &httpError{http.StatusForbidden, fmt.Sprintf("token %q (%s) may not copy files in or out of container %s: docker cp needs the %s permission in namespace %q", id.Name, id.Role, c.id, auth.Operate, owner)}
	}
	if c.created != nil {
		return ref{}, "", &httpError{http.StatusConflict, fmt.Sprintf("container %s is created and not started: Berth makes it when it starts, so it has no files to copy yet (docker start it first)", c.id)}
	}
	return c, path, nil
}

// setStat puts st in the answer's statHeader.
func setStat(w http.ResponseWriter, st driver.PathStat) error {
	b, err := json.Marshal(container.PathStat{Name: st.Name, Size: st.Size, Mode: st.Mode, Mtime: st.ModTime, LinkTarget: st.LinkTarget})
	if err != nil {
		return err
	}
	w.Header().Set(statHeader, base64.StdEncoding.EncodeToString(b))
	return nil
}

// archiveStat answers HEAD /containers/{id}/archive: the path's
// description in statHeader, as docker cp asks before it copies.
func (s *Server) archiveStat(w http.ResponseWriter, r *http.Request) error {
	c, path, err := s.archiveTarget(r)
	if err != nil {
		return err
	}
	st, err := s.plane.StatPath(r.Context(), c.id, path)
	if err != nil {
		return err
	}
	if err := setStat(w, st); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// archiveGet answers GET /containers/{id}/archive (docker cp out of a
// container): a tar archive of the path, its description in statHeader.
// A copy that fails once the archive has begun breaks the connection, so
// that no client takes a cut archive for a whole one.
func (s *Server) archiveGet(w http.ResponseWriter, r *http.Request) error {
	c, path, err := s.archiveTarget(r)
	if err != nil {
		return err
	}
	st, err := s.plane.StatPath(r.Context(), c.id, path)
	if err != nil {
		return err
	}
	release, err := s.acquire(w, r)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := s.streamContext(r)
	defer cancel()
	if err := setStat(w, st); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/x-tar")
	cw := &committedWriter{ResponseWriter: w}
	if _, err := s.plane.CopyFrom(ctx, c.id, path, cw); err != nil {
		if cw.committed {
			s.log.Warn("dockerapi: copy from container broke off", "container", c.id, "path", path, "error", err)
			panic(http.ErrAbortHandler)
		}
		w.Header().Del(statHeader)
		return err
	}
	return nil
}

// archivePut answers PUT /containers/{id}/archive (docker cp into a
// container): the body, a tar archive of at most control.MaxArchiveBytes,
// is unpacked into the directory path.
func (s *Server) archivePut(w http.ResponseWriter, r *http.Request) error {
	c, path, err := s.archiveTarget(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var opts driver.CopyToOptions
	for _, b := range []struct {
		name string
		v    *bool
	}{{"noOverwriteDirNonDir", &opts.NoOverwriteDirNonDir}, {"copyUIDGID", &opts.CopyUIDGID}} {
		if v := q.Get(b.name); v != "" {
			var err error
			if *b.v, err = strconv.ParseBool(v); err != nil {
				return badRequest("%s=%q: want true or false", b.name, v)
			}
		}
	}
	release, err := s.acquire(w, r)
	if err != nil {
		return err
	}
	defer release()
	// The server's read timeout bounds a request's body; an archive's
	// is bounded by its size.
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	ctx, cancel := s.streamContext(r)
	defer cancel()
	if err := s.plane.CopyTo(ctx, c.id, path, r.Body, opts); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// top lists the processes of a running container (docker top), with
// ps_args as ps's options: the back-end runs ps with them, or refuses
// them by name when it reads the processes itself.
func (s *Server) top(w http.ResponseWriter, r *http.Request) error {
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if c.created != nil || ended(c.in) {
		return &httpError{http.StatusConflict, fmt.Sprintf("Container %s is not running", c.id)}
	}
	ps, err := s.plane.Top(r.Context(), c.id, r.URL.Query().Get("ps_args"))
	if err != nil {
		return err
	}
	rows := ps.Rows
	if rows == nil {
		rows = [][]string{}
	}
	return writeJSON(w, http.StatusOK, container.TopResponse{Titles: ps.Titles, Processes: rows})
}
