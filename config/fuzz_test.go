package config

import "testing"

// FuzzParse reads random bytes as a configuration file and finishes it
// (overrides, provider options, validation): it never panics, and a file
// it takes validates. The seed corpus is in testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("providers:\n  - name: a\n    driver: cfgtest\n    options: {nodes: 99999999999999999999, memory: 1e300}\n"))
	f.Add([]byte("reconcile: {max_attempts: -1, workers: 4611686018427387904}\npools: [{name: p, provider: a, max_instances: -5, labels: [{name: l, min_ready: 9223372036854775807}]}]\n"))
	f.Add([]byte("quotas: [{namespace: x, cpus: 1e300, memory: -1}]\nshutdown_timeout: 9999999h\n"))
	f.Add([]byte("&a [*a, *a]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.yaml", data)
		if err != nil {
			return
		}
		_ = cfg.Finish("fuzz.yaml", nil)
	})
}
