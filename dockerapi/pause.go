package dockerapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/moby/moby/api/types/container"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/driver"
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

// rename renames a container: a created one in the spec it will be
// submitted with, a started one (a Berth instance) through the plane's
// Rename, which renames its resource on the back-end too.
func (s *Server) rename(w http.ResponseWriter, r *http.Request) error {
	name := strings.TrimPrefix(r.URL.Query().Get("name"), "/")
	if name == "" {
		return badRequest("name: give the container's new name")
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if len(name) > 255 || !containerName.MatchString(name) {
		return badRequest("name %q: want 2 to 255 of [a-zA-Z0-9_.-], starting with a letter or digit", name)
	}
	if c.created != nil {
		return s.renameCreated(w, r, c.id, c.created.owner, name)
	}
	// A container created and not started holds its name too.
	if s.createdName(c.id, c.in.Owner, name) {
		return nameInUse(name)
	}
	// The container's own name is one of its network aliases (see
	// onNetwork): the new name takes the old one's place for the copies
	// made from now on.
	old := c.in.Name
	err = s.plane.Rename(r.Context(), c.id, name, func(spec *driver.Spec) {
		spec.NetworkAliases = slices.Clone(spec.NetworkAliases)
		if i := slices.Index(spec.NetworkAliases, old); i >= 0 && !slices.Contains(spec.NetworkAliases, name) {
			spec.NetworkAliases[i] = name
		}
	})
	if errors.Is(err, driver.ErrAlreadyExists) {
		return nameInUse(name)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// renameCreated renames container id, created by owner and not started,
// in the spec it will be submitted with.
func (s *Server) renameCreated(w http.ResponseWriter, r *http.Request, id, owner, name string) error {
	if err := s.checkName(r.Context(), name, owner); err != nil {
		return err
	}
	err := s.changeCreated(r.Context(), id, r.PathValue("id"), func(cc *created) error {
		if s.createdNameLocked(id, owner, name) {
			return nameInUse(name)
		}
		cc.req.Spec.Name = name
		return nil
	})
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// createdName reports whether a container created and not started, other
// than id, holds name in namespace owner.
func (s *Server) createdName(id, owner, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.createdNameLocked(id, owner, name)
}

// createdNameLocked is createdName with s.mu held.
func (s *Server) createdNameLocked(id, owner, name string) bool {
	for cid, o := range s.created {
		if cid != id && o.owner == owner && o.req.Spec.Name == name {
			return true
		}
	}
	return false
}

// update changes a container's cpus and memory (docker update --cpus,
// --memory): a started one through the plane's Resize (live, checked
// against its node's free capacity; the back-end must resize), a created
// one in the spec it will be submitted with. Any other setting is refused
// by name: Berth has no other limit to change.
func (s *Server) update(w http.ResponseWriter, r *http.Request) error {
	body, err := api.ReadBody(w, r.Body)
	if err != nil {
		return err
	}
	var uc container.UpdateConfig
	if err := json.Unmarshal(body, &uc); err != nil {
		return badRequest("decode the update: %v", err)
	}
	rest := uc
	rest.NanoCPUs, rest.Memory = 0, 0
	if !reflect.DeepEqual(rest, container.UpdateConfig{}) {
		return unsupported("docker update: Berth changes only --cpus and --memory (%s)", describeUpdate(&rest))
	}
	res := driver.Resources{CPU: driver.MilliCPU(uc.NanoCPUs / 1_000_000), Memory: driver.Bytes(uc.Memory)}
	switch {
	case uc.NanoCPUs < 0 || uc.Memory < 0:
		return badRequest("--cpus and --memory must not be negative")
	case uc.NanoCPUs > 0 && res.CPU == 0:
		return badRequest("--cpus %.4f: Berth counts cpus in thousandths; ask for at least 0.001", float64(uc.NanoCPUs)/1e9)
	case res.IsZero():
		return badRequest("nothing to update: give --cpus or --memory")
	}
	if err := driver.ValidateResources("", res); err != nil {
		return badRequest("%v", err)
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if c.created != nil {
		err := s.changeCreated(r.Context(), c.id, r.PathValue("id"), func(cc *created) error {
			if res.CPU > 0 {
				cc.req.Spec.CPU = res.CPU
			}
			if res.Memory > 0 {
				cc.req.Spec.Memory = res.Memory
			}
			return nil
		})
		if err != nil {
			return err
		}
	} else if err := s.plane.Resize(r.Context(), c.id, res); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, container.UpdateResponse{Warnings: []string{}})
}

// describeUpdate names the settings of an update other than cpus and
// memory that are set, as the CLI's flags.
func describeUpdate(u *container.UpdateConfig) string {
	var set []string
	if u.RestartPolicy.Name != "" {
		set = append(set, "--restart")
	}
	if u.CPUShares != 0 {
		set = append(set, "--cpu-shares")
	}
	if u.CPUPeriod != 0 || u.CPUQuota != 0 {
		set = append(set, "--cpu-period/--cpu-quota")
	}
	if u.CpusetCpus != "" || u.CpusetMems != "" {
		set = append(set, "--cpuset-cpus/--cpuset-mems")
	}
	if u.MemoryReservation != 0 || u.MemorySwap != 0 {
		set = append(set, "--memory-reservation/--memory-swap")
	}
	if u.PidsLimit != nil {
		set = append(set, "--pids-limit")
	}
	if u.BlkioWeight != 0 {
		set = append(set, "--blkio-weight")
	}
	if len(set) == 0 {
		return "a setting the CLI has no flag for"
	}
	return strings.Join(set, ", ") + " given"
}
