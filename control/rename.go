package control

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
)

// Rename gives the instance ref the name name in its namespace, and its
// back-end resource the name that goes with it (driver.Renamer): the
// resource is named after the instance (Instance.BackendName), and keeps
// that so, for the copies a restart makes later too. The instance must
// have a resource (created, not being made or deleted); a name another
// instance of the namespace holds is driver.ErrAlreadyExists, a back-end
// that cannot rename driver.ErrUnsupported naming it. A rename that the
// back-end made and the store then refused is undone on the back-end.
// edit, when not nil, changes a copy of the instance's spec in the same
// write (what else carries its name, such as its network aliases).
func (p *Plane) Rename(ctx context.Context, ref, name string, edit func(*driver.Spec)) error {
	return p.verbs.rename(ctx, ref, name, edit)
}

// rename is Plane.Rename.
func (s verbs) rename(ctx context.Context, ref, name string, edit func(*driver.Spec)) error {
	if err := driver.CheckName("name", name, maxNameLen); err != nil {
		return err
	}
	in, prov, err := s.live(ref)
	if err != nil {
		return err
	}
	if !slices.Contains(prov.Capabilities(), driver.CapRename) {
		return driver.Errorf(driver.ErrUnsupported, "provider %q (driver %q) cannot rename an instance's resource", prov.Name(), driverName(prov))
	}
	// Under the instance's stripe: no create of a new copy (which names
	// its resource after the record) runs between the back-end's rename
	// and the record's.
	mu := s.lockOf(in.ID)
	mu.Lock()
	defer mu.Unlock()
	cur, ok := s.get(in.ID)
	switch {
	case !ok:
		return driver.Errorf(driver.ErrNotFound, "instance %s", ref)
	case cur.Name == name:
		return nil
	case cur.BackendID == "" || cur.Phase == reconciler.Deleting || cur.Phase == reconciler.Deleted ||
		cur.Phase == reconciler.Creating || cur.Phase == reconciler.Scheduled:
		return driver.Errorf(driver.ErrInvalid, "instance %s is %s: rename it once it has been created, and before it is deleted", cur.ID, cur.Phase)
	}
	next := cur
	next.Name = name
	if err := s.reserveNames([]*reconciler.Instance{&next}); err != nil {
		return err
	}
	if err := prov.Rename(ctx, cur.BackendID, next.BackendName()); err != nil {
		s.unclaimName(next.Owner, name, next.ID)
		return err
	}
	if edit != nil && next.Spec != nil {
		spec := *next.Spec // shared with the request's other instances
		edit(&spec)
		next.Spec = &spec
	}
	next.Updated = s.now()
	ok, _, err = s.commit(context.WithoutCancel(ctx), &txn{puts: []instPut{{base: cur.Revision, in: &next}}})
	if err == nil && !ok {
		err = driver.Errorf(driver.ErrRetryable, "instance %s changed while it was renamed: try again", cur.ID)
	}
	if err != nil {
		if uerr := prov.Rename(context.WithoutCancel(ctx), cur.BackendID, cur.BackendName()); uerr != nil {
			err = errors.Join(err, fmt.Errorf("and its resource keeps the new name %q: %w", next.BackendName(), uerr))
		}
		s.unclaimName(next.Owner, name, next.ID)
		return err
	}
	return nil
}
