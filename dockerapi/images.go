package dockerapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	dockerspec "github.com/moby/docker-image-spec/specs-go/v1"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/image"

	"github.com/berth-dev/berth/driver"
)

// imageSummaries lists the images of every online node of every provider
// that lists images, one row per image id, in the order first seen.
func (s *Server) imageSummaries(ctx context.Context) ([]*image.Summary, error) {
	nodes, err := s.plane.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	provs, err := s.plane.Providers(ctx)
	if err != nil {
		return nil, err
	}
	lists := map[string]bool{}
	for _, p := range provs {
		lists[p.Name] = slices.Contains(p.Capabilities, driver.CapImages)
	}
	byID := map[string]*image.Summary{}
	var out []*image.Summary
	for _, n := range nodes {
		if !lists[n.Provider] || n.Status != driver.NodeOnline {
			continue
		}
		imgs, err := s.plane.Images(ctx, n.Provider, n.Name)
		if err != nil {
			return nil, fmt.Errorf("images of %s/%s: %w", n.Provider, n.Name, err)
		}
		for _, im := range imgs {
			id := im.ID
			if id == "" {
				id = im.Name
			}
			sum, ok := byID[id]
			if !ok {
				sum = &image.Summary{ID: id, RepoTags: []string{}, RepoDigests: []string{}, Created: im.Created.Unix(), Size: int64(im.Size), Containers: -1, SharedSize: -1, Labels: map[string]string{}}
				byID[id] = sum
				out = append(out, sum)
			}
			if im.Name != "" && im.Name != im.ID && !slices.Contains(sum.RepoTags, im.Name) {
				sum.RepoTags = append(sum.RepoTags, im.Name)
			}
		}
	}
	return out, nil
}

// findImage resolves an image reference as the engine does: a name (the
// tag latest when it names none), an id, or a unique prefix of an id.
func (s *Server) findImage(ctx context.Context, ref string) (*image.Summary, error) {
	if ref == "" {
		return nil, badRequest("name the image")
	}
	all, err := s.imageSummaries(ctx)
	if err != nil {
		return nil, err
	}
	name := imageKey(ref)
	for _, sum := range all {
		if sum.ID == ref || slices.ContainsFunc(sum.RepoTags, func(t string) bool { return imageKey(t) == name }) {
			return sum, nil
		}
	}
	hex := strings.TrimPrefix(ref, "sha256:")
	var found []*image.Summary
	for _, sum := range all {
		if strings.HasPrefix(strings.TrimPrefix(sum.ID, "sha256:"), hex) && len(hex) > 0 && strings.Trim(hex, "0123456789abcdef") == "" {
			found = append(found, sum)
		}
	}
	if len(found) == 1 {
		return found[0], nil
	}
	if len(found) > 1 {
		return nil, badRequest("image id prefix %s is ambiguous: give more of the id", ref)
	}
	return nil, &httpError{http.StatusNotFound, "No such image: " + ref}
}

// imageKey is an image name as the engines list it: familiar, with the
// tag latest when it names no tag or digest.
func imageKey(name string) string {
	name = familiar(name)
	if !strings.Contains(name, "@") && !strings.Contains(name[strings.LastIndex(name, "/")+1:], ":") {
		name += ":latest"
	}
	return name
}

// imageRoute serves GET /images/{name}/json and /images/{name}/history:
// an image's name may hold slashes, so the route takes the rest of the
// path.
func (s *Server) imageRoute(w http.ResponseWriter, r *http.Request) error {
	rest := r.PathValue("rest")
	switch {
	case strings.HasSuffix(rest, "/json"):
		return s.imageInspect(w, r, strings.TrimSuffix(rest, "/json"))
	case strings.HasSuffix(rest, "/history"):
		return s.imageHistory(w, r, strings.TrimSuffix(rest, "/history"))
	}
	return unsupported("GET /images/%s is not supported by Berth's Docker endpoint", rest)
}

// imageInspect answers what Berth knows of an image: its id, tags, size
// and creation time as the engines list them. Its configuration and
// layers are the engine's to show (docker -H ENGINE image inspect).
func (s *Server) imageInspect(w http.ResponseWriter, r *http.Request, ref string) error {
	sum, err := s.findImage(r.Context(), ref)
	if err != nil {
		return err
	}
	out := image.InspectResponse{
		ID: sum.ID, RepoTags: sum.RepoTags, RepoDigests: sum.RepoDigests,
		Created: time.Unix(sum.Created, 0).UTC().Format(time.RFC3339Nano),
		Config:  &dockerspec.DockerOCIImageConfig{},
		Os:      "linux", Size: sum.Size,
		RootFS: image.RootFS{Type: "layers"},
	}
	return writeJSON(w, http.StatusOK, out)
}

// imageHistory answers one row, the image itself: the engines' listing
// Berth reads has no layers.
func (s *Server) imageHistory(w http.ResponseWriter, r *http.Request, ref string) error {
	sum, err := s.findImage(r.Context(), ref)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, []image.HistoryResponseItem{{
		ID: sum.ID, Created: sum.Created, Size: sum.Size, Tags: sum.RepoTags,
		Comment: "Berth lists the image as a whole, without its layers",
	}})
}

// diskUsage is GET /system/df as API 1.41 answers it.
type diskUsage struct {
	LayersSize int64
	Images     []image.Summary
	Containers []container.Summary
	Volumes    []any
	BuildCache []any
}

// systemDF answers docker system df: the images of every node and the
// containers the caller sees. Berth does not measure containers' file
// systems (their SizeRw is 0) and keeps no volumes or build cache.
func (s *Server) systemDF(w http.ResponseWriter, r *http.Request) error {
	if t := r.URL.Query()["type"]; slices.ContainsFunc(t, func(v string) bool { return v == "volume" || v == "build-cache" }) {
		return unsupported("system df for volumes and the build cache: Berth keeps neither")
	}
	imgs, err := s.imageSummaries(r.Context())
	if err != nil {
		return err
	}
	list, err := s.visible(r, true)
	if err != nil {
		return err
	}
	out := diskUsage{Images: []image.Summary{}, Containers: []container.Summary{}, Volumes: []any{}, BuildCache: []any{}}
	now := time.Now()
	used := map[string]int64{}
	for _, in := range list {
		sum := summary(in, now)
		out.Containers = append(out.Containers, sum)
		used[imageKey(sum.Image)]++
	}
	for _, im := range imgs {
		sum := *im
		sum.Containers = 0
		for _, t := range sum.RepoTags {
			sum.Containers += used[imageKey(t)]
		}
		out.LayersSize += sum.Size
		out.Images = append(out.Images, sum)
	}
	return writeJSON(w, http.StatusOK, out)
}
