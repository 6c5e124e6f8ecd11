package api

import (
	"net/http"
	"runtime"
	"runtime/debug"
)

// VersionInfo is the server's version, from GET /v1/version.
type VersionInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
}

// BuildVersion is this binary's version: the module version it was built
// at, else the VCS revision, else "devel".
func BuildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return "devel-" + s.Value[:12]
		}
	}
	return "devel"
}

func (s *Server) version(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, VersionInfo{Version: BuildVersion(), GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH})
}
