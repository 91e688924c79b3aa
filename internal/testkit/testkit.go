// Package testkit is the repository's one test kit, free of any backend (the
// bbolt part is its subpackage boltkit): the fake clock (Clock), the child
// processes (child.go: crash tests run a child built with the idemfail tag
// and kill it at a failpoint, Main, RunChild, RunKilled; tests that arm
// failpoints in their own process run in such a build, Failpoints), the
// contract's model for histories (ContractModel) and the outbox's checks
// (Recorder, OutboxHistory). idemtest uses it, so it imports only idemcore.
package testkit

import (
	"sync"
	"testing"
	"time"
)

// Clock is a fake clock for Options.Now: tests move it, they do not sleep.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock stopped at start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Eventually polls cond every millisecond until it holds, and fails t if it
// does not within two minutes (a bound on a hang for asynchronous work such
// as outbox delivery, not a timing claim: CI machines are shared). tick, if
// not nil, runs before every poll: a fake-clock advance, so that messages
// waiting for their backoff fall due.
func Eventually(t testing.TB, what string, tick func(), cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if tick != nil {
			tick()
		}
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
