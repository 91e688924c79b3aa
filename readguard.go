package idem

import (
	"fmt"
	"sync"
	"sync/atomic"

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
