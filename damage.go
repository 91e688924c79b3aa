package idem

// Damage: a panic of bbolt's on a damaged page, in a read transaction,
// becomes an error wrapping ErrCorrupt, never a panic in the reader's goroutine.

import (
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/internal/boltfile"
)

// damaged is the error of a panic of bbolt's on a damaged page (it asserts
// that a page is what its parent says, and panics when it is not): the file
// is damaged where the call read, not the call's input.
func damaged(v any) error {
	return fmt.Errorf("%w: %w (bbolt: %v); run `idem check` and restore from a backup", ErrCorrupt, boltfile.ErrDamaged, v)
}

// view runs fn in a read transaction of db. A panic of bbolt's on a damaged
// page becomes an error wrapping ErrCorrupt (bbolt's View has rolled the
// transaction back by then), so a damaged file gives every reader an error,
// never a panic in its goroutine.
func view(db *bbolt.DB, fn func(*bbolt.Tx) error) error { return viewUser(db, nil, fn) }

// viewUser is view for a walk that calls a callback of the user's (Records,
// Messages, View): fn sets *inUser while the callback runs, and a panic
// then is the user's own, raised again as it was; only bbolt's are damage.
func viewUser(db *bbolt.DB, inUser *bool, fn func(*bbolt.Tx) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if inUser != nil && *inUser {
				panic(v)
			}
			err = damaged(v)
		}
	}()
	return db.View(fn)
}
