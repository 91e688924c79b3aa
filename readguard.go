package idem

import (
	"fmt"
	"sync"
	"sync/atomic"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/internal/boltfile"
	"github.com/idemkit/idem/internal/goid"
)

// errInsideRead refuses an engine call from a Records, View or Messages
// callback: the callback holds a bbolt read transaction, a write waits for
// bbolt's remap when the file grows, and the remap waits for every read
// transaction to end, this one included; a read from there waits too while
// another goroutine's write remaps (a pending writer blocks new readers).
var errInsideRead = fmt.Errorf("%w: called from inside a Records, View or Messages callback, which holds a read transaction", ErrReentrant)

// readGuard marks the goroutines running a user callback inside a read
// transaction. n is the number of marks, so that the check costs one atomic
// load while no callback runs.
type readGuard struct {
	n   atomic.Int32
	mu  sync.Mutex
	ids map[uint64]int // goroutine id → callbacks it is inside (they nest)
}

// mark marks the calling goroutine as running a user callback inside a read
// transaction, until unmark with the id it returns.
func (g *readGuard) mark() uint64 {
	id := goid.ID()
	g.mu.Lock()
	if g.ids == nil {
		g.ids = make(map[uint64]int)
	}
	g.ids[id]++
	g.mu.Unlock()
	g.n.Add(1)
	return id
}

func (g *readGuard) unmark(id uint64) {
	g.n.Add(-1)
	g.mu.Lock()
	if g.ids[id]--; g.ids[id] == 0 {
		delete(g.ids, id)
	}
	g.mu.Unlock()
}

// holding reports whether the calling goroutine is inside such a callback.
func (g *readGuard) holding() bool {
	if g.n.Load() == 0 {
		return false
	}
	id := goid.ID()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ids[id] > 0
}

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
