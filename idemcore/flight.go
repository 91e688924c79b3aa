package idemcore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// keyLocks is the per-key singleflight within one process: at most one call
// per key leads (runs the state machine and fn); the others with the same key
// wait for its outcome. Whether a started record is owned by a live call
// elsewhere is the backend's answer (Backend.Owner); within this process, a
// started record whose key this engine leads is owned by nobody else.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*flight
	// released counts flights ended, on any key: a record read while it did
	// not change is still current, since every write of a record by this
	// engine happens under its key.
	released atomic.Uint64
}

// leaderEnd is how a leader's flight ended: what its waiters do next.
type leaderEnd uint8

const (
	// endAnswer: the leader has an answer (a result, or an error that is an
	// outcome); waiters replay it.
	endAnswer leaderEnd = iota
	// endAgain: the leader stored nothing and left (the key is free, or back
	// as it was); one waiter leads in its place.
	endAgain
	// endIncomplete: fn ended without an outcome (the end of its context, a
	// panic, a failed commit); waiters get ErrIncomplete.
	endIncomplete
)

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

	end leaderEnd
	res Result
	err error
}

func newKeyLocks() *keyLocks { return &keyLocks{m: make(map[string]*flight)} }

// acquire makes the caller the leader of key, or returns the flight to wait
// for.
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
