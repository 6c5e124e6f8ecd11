package k8stest

import (
	"strings"
	"testing"
)

// TestBinDirMissing: without the binaries the error says how to build
// them.
func TestBinDirMissing(t *testing.T) {
	t.Setenv(envBin, t.TempDir())
	_, err := BinDir()
	if err == nil || !strings.Contains(err.Error(), ".ci/k8s-servers.sh") || !strings.Contains(err.Error(), "kube-apiserver") {
		t.Errorf("BinDir of an empty directory: %v, want an error naming the script and the binary", err)
	}
}
