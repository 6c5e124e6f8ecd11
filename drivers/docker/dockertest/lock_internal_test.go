package dockertest

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestMainEngineLockModes: holders of the shared lock coexist, and keep
// out one who wants the engine alone; a holder alone keeps out both.
// Another open of the file asks without waiting, as another test process
// would.
func TestMainEngineLockModes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.lock")
	try := func(how int) bool {
		t.Helper()
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		err = syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err != nil && !errors.Is(err, syscall.EWOULDBLOCK) {
			t.Fatal(err)
		}
		return err == nil
	}
	lock := func(how int) (unlock func()) {
		t.Helper()
		unlock, err := lockFile(path, how)
		if err != nil {
			t.Fatal(err)
		}
		return unlock
	}
	one := lock(syscall.LOCK_SH)
	two := lock(syscall.LOCK_SH)
	if try(syscall.LOCK_EX) {
		t.Error("the engine taken alone while two share it")
	}
	one()
	if try(syscall.LOCK_EX) {
		t.Error("the engine taken alone while one shares it")
	}
	two()
	alone := lock(syscall.LOCK_EX)
	if try(syscall.LOCK_SH) {
		t.Error("the engine shared while one holds it alone")
	}
	alone()
	if !try(syscall.LOCK_EX) {
		t.Error("the engine still held after every unlock")
	}
}
