package dockerapi

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/berth-dev/berth/reconciler"
)

// containerName is the engine's rule for a container's name.
var containerName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]+$`)

// pause suspends a running container (the plane's Suspend: the back-end
// pauses it), as docker pause.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("id")
	c, err := s.find(r, ref)
	if err != nil {
		return err
	}
	switch {
	case c.created == nil && c.in.Phase == reconciler.Suspended:
		return &httpError{http.StatusConflict, fmt.Sprintf("Container %s is already paused", c.id)}
	case c.created != nil || c.in.Phase != reconciler.Running:
		return &httpError{http.StatusConflict, fmt.Sprintf("Container %s is not running", c.id)}
	}
	if err := s.plane.Suspend(r.Context(), c.id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// unpause resumes a paused (suspended) container.
func (s *Server) unpause(w http.ResponseWriter, r *http.Request) error {
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if c.created != nil || c.in.Phase != reconciler.Suspended {
		return &httpError{http.StatusConflict, fmt.Sprintf("Container %s is not paused", c.id)}
	}
	if err := s.plane.Resume(r.Context(), c.id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// rename renames a container created and not started. A started one is a
// Berth instance, named once when it was submitted.
func (s *Server) rename(w http.ResponseWriter, r *http.Request) error {
	name := strings.TrimPrefix(r.URL.Query().Get("name"), "/")
	if name == "" {
		return badRequest("name: give the container's new name")
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if c.created == nil {
		return unsupported("rename of a started container: Berth names an instance once, when it is submitted (rename it between docker create and docker start)")
	}
	if len(name) > 255 || !containerName.MatchString(name) {
		return badRequest("name %q: want 2 to 255 of [a-zA-Z0-9_.-], starting with a letter or digit", name)
	}
	if err := s.checkName(r.Context(), name, c.created.owner); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cc, ok := s.created[c.id]
	if !ok {
		return noSuch(r.PathValue("id"))
	}
	for id, o := range s.created {
		if id != c.id && o.owner == cc.owner && o.req.Spec.Name == name {
			return nameInUse(name)
		}
	}
	cc.req.Spec.Name = name
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// top is refused by name: no back-end lists an instance's processes.
func (s *Server) top(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.find(r, r.PathValue("id")); err != nil {
		return err
	}
	return unsupported("top: Berth's back-ends do not list an instance's processes")
}
