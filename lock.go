package idem

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// keyLocks is the per-key singleflight: at most one call per key leads (runs
// the state machine and fn); the others with the same key wait for its outcome.
// Because one process holds the file, a started record whose key has no entry
// here is owned by nobody: an interrupted execution.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*flight
	// released counts flights ended, on any key: a record read while it did
	// not change is still current, since every record is written under its key.
	released atomic.Uint64
}

// flight is one leading call. Its outcome fields are written by the leader
// before done is closed and only read after.
type flight struct {
	fp      uint64
	done    chan struct{}
	started time.Time // when the leader took the key (engine clock)
	// executing is set once the leader claims the key with fp (it found no
	// live record, or recovers an interrupted execution with fp): from then
	// on a call with another fingerprint conflicts without waiting.
	executing atomic.Bool
	// runner is the id of the goroutine that runs the leader's Do fn, 0
	// until it runs: a wait from that goroutine would wait for itself.
	runner atomic.Uint64

	res Result
	err error
	// again tells waiters that the leader stored nothing and left: one of
	// them should try to lead (the key is free or back to its previous state).
	again bool
}

func newKeyLocks() *keyLocks { return &keyLocks{m: make(map[string]*flight)} }

// acquire makes the caller the leader of key, or returns the flight to wait
// for. A flight with another fingerprint is a conflict, reported at once.
func (l *keyLocks) acquire(key string, fp uint64, now time.Time) (f *flight, leader bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f := l.m[key]; f != nil {
		return f, false
	}
	f = &flight{fp: fp, done: make(chan struct{}), started: now}
	l.m[key] = f
	return f, true
}

// release ends the leader's flight and wakes its waiters.
func (l *keyLocks) release(key string, f *flight) {
	l.mu.Lock()
	delete(l.m, key)
	l.released.Add(1)
	l.mu.Unlock()
	close(f.done)
}

// generation changes whenever a flight ends.
func (l *keyLocks) generation() uint64 { return l.released.Load() }

// wait blocks until the flight ends or ctx is done. A cancelled wait returns
// ctx.Err() and changes nothing, for the leader or the other waiters.
func (f *flight) wait(ctx context.Context) error {
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
