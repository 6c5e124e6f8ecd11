package vm

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/berth-dev/berth/driver"
)

// configDriveImage is the NoCloud config drive of an instance (see the
// package documentation for its files).
func configDriveImage(instanceID string, spec *driver.Spec) ([]byte, error) {
	host := spec.Hostname
	if host == "" {
		host = spec.Name
	}
	var md strings.Builder
	fmt.Fprintf(&md, "instance-id: %s\n", quote(instanceID))
	if host != "" {
		fmt.Fprintf(&md, "local-hostname: %s\n", quote(host))
	}
	if len(spec.SSHKeys) > 0 {
		md.WriteString("public-keys:\n")
		for _, k := range spec.SSHKeys {
			fmt.Fprintf(&md, "  - %s\n", quote(k))
		}
	}
	type writeFile struct {
		Path        string `json:"path"`
		Encoding    string `json:"encoding"`
		Content     string `json:"content"`
		Permissions string `json:"permissions"`
	}
	var wf []writeFile
	var manifest strings.Builder
	files := []fatFile{{name: "meta-data", data: []byte(md.String())}, {name: "user-data", data: []byte(spec.UserData)}}
	for i, c := range spec.ConfigFiles {
		mode := c.Mode
		if mode == 0 {
			mode = 0o644
		}
		name := fmt.Sprintf("file-%d", i)
		files = append(files, fatFile{name: name, data: []byte(c.Content)})
		fmt.Fprintf(&manifest, "%04o %s %s\n", mode, name, c.Path)
		wf = append(wf, writeFile{Path: c.Path, Encoding: "b64", Content: base64.StdEncoding.EncodeToString([]byte(c.Content)), Permissions: fmt.Sprintf("0%o", mode)})
	}
	vendor := "#cloud-config\n{}\n"
	if len(wf) > 0 {
		j, err := json.Marshal(map[string]any{"write_files": wf})
		if err != nil {
			return nil, err
		}
		vendor = "#cloud-config\n" + string(j) + "\n"
	}
	files = append(files, fatFile{name: "vendor-data", data: []byte(vendor)}, fatFile{name: "berth-files", data: []byte(manifest.String())})
	return fatImage("CIDATA", files)
}

// quote writes s as a YAML scalar (a JSON string is one).
func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
