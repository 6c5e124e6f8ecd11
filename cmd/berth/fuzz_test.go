package main

import (
	"encoding/json"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// FuzzDriverOptions decodes random JSON objects as the options of every
// registered driver, as a config file's or flags' options are: never a
// panic; an error names the driver. The seed corpus is in
// testdata/fuzz/FuzzDriverOptions.
func FuzzDriverOptions(f *testing.F) {
	f.Add(`{"nodes": 3, "shape": {"cpus": 4, "memory": "8Gi"}}`)
	f.Add(`{"nodes": 4611686018427387904, "stop_grace": "9999999999h", "memory": 1e300}`)
	f.Add(`{"engines": [{"name": "e", "host": "unix:///x", "capacity": {"cpus": -1}}], "max_parallel": -1}`)
	f.Add(`{"workers": "1e400", "cpus": "9223372036854775807m", "overcommit": 1e308}`)
	f.Fuzz(func(t *testing.T, body string) {
		var raw map[string]any
		if json.Unmarshal([]byte(body), &raw) != nil {
			return
		}
		for _, name := range driver.Drivers() {
			def, err := driver.Lookup(name)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = def.Decode(raw)
		}
	})
}
