// Package testkit opens engines on temporary files for tests and checks the
// file's consistency (bbolt's Tx.Check) after every test, the way bbolt's
// internal/btesting does. It also starts the repository's child processes
// (child.go): crash tests run a child built with the idemfail tag and kill it
// at a failpoint (Main, RunChild, RunKilled), and tests that arm failpoints in
// their own process run in such a build (Failpoints).
package testkit

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
)

// Open opens an engine with opts on a new file in t.TempDir(). The engine is
// closed (Close is idempotent, so tests may close it first) and the file
// checked when the test ends.
func Open(t testing.TB, opts *idem.Options) (*idem.Engine, string) {
	t.Helper()
	return OpenFile(t, nil, opts)
}

// OpenFile is Open with the bbolt file's settings file (nil for defaults).
func OpenFile(t testing.TB, file *idem.BoltOptions, opts *idem.Options) (*idem.Engine, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	e, err := idem.OpenFile(path, file, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		Check(t, path)
	})
	return e, path
}

// Check runs bbolt's consistency check on the file at path, which no engine
// may hold.
func Check(t testing.TB, path string) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Errorf("check: open %s: %v", path, err)
		return
	}
	defer db.Close()
	if err := db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			t.Errorf("check: %v", err)
		}
		return nil
	}); err != nil {
		t.Errorf("check: %v", err)
	}
}

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
