package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/berth-dev/berth/driver"
)

func TestClassify(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	for _, c := range []struct {
		name     string
		err      error
		mutating bool
		want     error
	}{
		{"not found", apierrors.NewNotFound(pods, "p"), false, driver.ErrNotFound},
		{"already exists", apierrors.NewAlreadyExists(pods, "p"), true, driver.ErrAlreadyExists},
		{"conflict", apierrors.NewConflict(pods, "p", errors.New("the object has been modified")), true, driver.ErrPermanent},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "p", field.ErrorList{field.Invalid(field.NewPath("spec", "containers"), "x", "bad")}), true, driver.ErrPermanent},
		{"quota", apierrors.NewForbidden(pods, "p", errors.New("exceeded quota: pods, requested: pods=1, used: pods=1, limited: pods=1")), true, driver.ErrQuotaExceeded},
		{"quota needs limits", apierrors.NewForbidden(pods, "p", errors.New("failed quota: q: must specify limits.cpu")), true, driver.ErrPermanent},
		{"forbidden", apierrors.NewForbidden(pods, "p", errors.New("RBAC says no")), true, driver.ErrPermanent},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1), true, driver.ErrRetryable},
		{"unavailable", apierrors.NewServiceUnavailable("etcd"), true, driver.ErrRetryable},
		{"internal, write", apierrors.NewInternalError(errors.New("boom")), true, driver.ErrTimeout},
		{"internal, read", apierrors.NewInternalError(errors.New("boom")), false, driver.ErrRetryable},
		{"server timeout", apierrors.NewServerTimeout(pods, "create", 1), true, driver.ErrTimeout},
		{"deadline", fmt.Errorf("post: %w", context.DeadlineExceeded), true, driver.ErrTimeout},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true, driver.ErrRetryable},
		{"broken", errors.New("unexpected EOF"), true, driver.ErrTimeout},
	} {
		got := classify(c.err, "create pod p", c.mutating)
		if driver.ClassOf(got) != c.want {
			t.Errorf("%s: %v classified %v, want %v", c.name, got, driver.ClassOf(got), c.want)
		}
	}
	if classify(nil, "x", true) != nil {
		t.Error("classify(nil) is not nil")
	}
}

func TestSettled(t *testing.T) {
	timeout := driver.Errorf(driver.ErrTimeout, "cut off")
	if got := settled(timeout, nil); driver.ClassOf(got) != driver.ErrRetryable {
		t.Errorf("timeout, clean cleanup: %v, want ErrRetryable", got)
	}
	perm := driver.Errorf(driver.ErrPermanent, "bad image")
	if got := settled(perm, errors.New("delete failed")); driver.ClassOf(got) != driver.ErrTimeout {
		t.Errorf("permanent, failed cleanup: %v, want ErrTimeout", got)
	}
	if got := settled(perm, nil); got != perm {
		t.Errorf("permanent, clean cleanup: %v, want it unchanged", got)
	}
}
