package memory_test

import (
	"testing"

	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/memory"
	"github.com/berth-dev/berth/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return memory.New(memory.Options{History: 500})
	})
}
