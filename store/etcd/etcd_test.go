package etcd_test

import (
	"testing"

	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/etcd"
	"github.com/berth-dev/berth/store/etcd/etcdtest"
	"github.com/berth-dev/berth/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return etcd.New(etcdtest.Client(t, etcdtest.Member(t)), etcd.Options{Prefix: "/test", History: 1000})
	})
}
