// Package boltkit is the bbolt part of the test kit (internal/testkit): it
// opens engines on temporary files for tests and checks the file's
// consistency (bbolt's Tx.Check) after every test, the way bbolt's
// internal/btesting does.
package boltkit

import (
	"path/filepath"
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
