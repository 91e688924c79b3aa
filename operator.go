package idem

// The operator API: reading, resolving and forgetting records, counts, and
// the file's views and backups.

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/idemcore"
)

// Get returns key's live record without side effects (idemcore.Engine.Get):
// ErrNotFound if it has none or it expired, ErrCorrupt if it does not decode.
func (e *Engine) Get(key string) (*Record, error) { return e.c.Get(key) }

// Forget deletes key's record in any state, so the next call runs fn as new
// (idemcore.Engine.Forget): ErrInProgress while a call with the key runs,
// ErrNotFound if it has no live record.
func (e *Engine) Forget(key string) error { return e.c.Forget(key) }

// Resolve completes an interrupted execution by hand: key's started record
// becomes done with response and, if outcome is not nil, a stored *Error
// with its Code and Message (idemcore.Engine.Resolve): ErrNotFound,
// ErrState for a done record, ErrInProgress while a call with the key runs.
func (e *Engine) Resolve(key string, response []byte, outcome *Error) error {
	return e.c.Resolve(key, response, outcome)
}

// Stats counts the engine's work since Open (idemcore.Stats: records
// pruned, replays, executions, conflicts, commits and the writes they
// carried, messages delivered), from counters in memory: Stats reads no file
// and takes no lock. What the file holds is FileStats.
type Stats = idemcore.Stats

// Stats returns the engine's counters since Open, at the cost of a few
// atomic loads; it works after Close too (the final counts). ScanFile
// counts the records and messages in the file.
func (e *Engine) Stats() Stats { return e.c.Stats() }

// FileStats counts what the file holds, as ScanFile found it
// (idemcore.FileStats: records by state, expired and corrupt ones, the
// file's size, the outbox's messages).
type FileStats = idemcore.FileStats

// ScanFile reads every record and message of the file (one read
// transaction, linear in what is stored: for a dashboard or `idem stats`,
// not for a metrics scrape, which Stats serves) and returns the counts. It
// fails with ErrClosed after Close.
func (e *Engine) ScanFile() (FileStats, error) {
	if err := e.c.Enter(); err != nil {
		return FileStats{}, &OpError{Op: "scan", Err: err}
	}
	defer e.c.Exit()
	if err := e.b.settle(false); err != nil {
		return FileStats{}, opError("scan", "", err)
	}
	var s FileStats
	now := e.c.Now()
	err := e.b.viewSnapshot(nil, func(tx *bbolt.Tx, snap []bucketSnap) error {
		s.FileSize = tx.Size()
		if err := e.outboxStats(tx, &s.Outbox); err != nil {
			return err
		}
		return e.b.st.forEach(tx, snap, func(r *Record, err error) error {
			switch {
			case err != nil:
				s.Corrupt++
			case !e.c.Live(r, now):
				s.ExpiredPending++
			case r.State == StateStarted:
				s.Started++
			default:
				s.Done++
			}
			return nil
		})
	})
	return s, opError("scan", "", err)
}

// Records calls fn for every live record in the file (one read transaction),
// time slot by time slot from the oldest, by key within a slot. A corrupt
// record is passed as a Record with only Key set, beside an ErrCorrupt error.
// An error from fn stops the walk and is returned.
func (e *Engine) Records(fn func(r *Record, err error) error) error { return e.c.Records(fn) }

// View runs fn in a read-only bbolt transaction over the file, so a program
// reads the buckets its DoTx fns write (its orders, its balances) outside a
// call. Bytes read from the transaction point into the file's memory map:
// copy what you keep past fn. Reads run alongside calls; they do not dedupe
// anything. The engine's own bucket ("idem") is visible but is not an API.
// With the journal on, View first brings the file up to date with the DoTx
// writes the journal holds and it does not (a checkpoint: two fsyncs, only
// when there are such writes), so fn sees every acknowledged one; a
// read-only engine over such a journal refuses, with an error matching
// bbolt's errors.ErrDatabaseReadOnly.
func (e *Engine) View(fn func(tx *bbolt.Tx) error) error {
	if err := e.c.Enter(); err != nil {
		return &OpError{Op: "view", Err: err}
	}
	defer e.c.Exit()
	if err := e.b.settle(false); err != nil {
		return opError("view", "", err)
	}
	defer e.b.reads.unmark(e.b.reads.mark())
	inUser := true // the whole of fn is the user's
	return viewUser(e.b.db, &inUser, fn)
}

// Backup writes a consistent copy of the live file to w (bbolt's Tx.WriteTo)
// and returns the bytes written. The copy holds every write answered before
// Backup began and needs no journal: the journal's frames are checkpointed
// into bbolt first, and the live file's journal takes a new id in the same
// bbolt transaction that writes the copy, so the copy, restored later beside
// the journal, never takes in a frame written after it. With the journal on,
// writes wait while the copy is written (a file of a few MiB: milliseconds);
// without it, calls go on meanwhile (a read transaction). A read-only engine
// over a journal the file lacks refuses, with an error matching bbolt's
// errors.ErrDatabaseReadOnly.
func (e *Engine) Backup(w io.Writer) (int64, error) {
	if err := e.c.Enter(); err != nil {
		return 0, &OpError{Op: "backup", Err: err}
	}
	defer e.c.Exit()
	switch {
	case e.b.j != nil:
		n, err := e.b.j.backup(w)
		if err != nil {
			return n, opError("backup", "", storageErr(err, e.b.maxSize))
		}
		return n, nil
	case !e.b.ov.empty():
		// Read-only, over a journal the file lacks: a copy of the file alone
		// would lose its writes.
		return 0, opError("backup", "", fmt.Errorf("the journal holds %d writes the file does not yet; open it for writing once, which replays them, then back it up: %w", e.b.replayed, bolterrors.ErrDatabaseReadOnly))
	}
	var n int64
	err := view(e.b.db, func(tx *bbolt.Tx) error {
		var err error
		n, err = tx.WriteTo(w)
		return err
	})
	return n, opError("backup", "", err)
}

// BackupFile is Backup into a new file at path (created with mode 0600; an
// existing file is refused), synced before it returns. On failure the file is
// removed.
func (e *Engine) BackupFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return &OpError{Op: "backup", Path: path, Err: err}
	}
	_, err = e.Backup(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path) // no half-written backup left to be mistaken for one
		if oe, ok := err.(*OpError); ok {
			err = oe.Err
		}
		return &OpError{Op: "backup", Path: path, Err: err}
	}
	return nil
}

// Forget deletes every version of key, in every slot.
func (b *boltBackend) Forget(_ context.Context, key string) (found bool, err error) {
	err = b.write(func(tx *bbolt.Tx) error {
		var err error
		found, err = b.st.deleteAll(tx, key)
		return err
	})
	return found, err
}

// Resolve reads the key's newest version and writes fn's record in its
// place, in one write transaction.
func (b *boltBackend) Resolve(_ context.Context, key string, fn func(cur *Record) (*Record, error)) error {
	return b.write(func(tx *bbolt.Tx) error {
		cur, err := b.st.lookup(boltRec{tx}, key, time.Time{})
		if err != nil {
			return err
		}
		next, err := fn(cur)
		if err != nil {
			return err
		}
		return b.st.put(boltRec{tx}, next, cur)
	})
}

// Scan walks every stored record in one read transaction, slot by slot from
// the oldest, by key within a slot.
func (b *boltBackend) Scan(_ context.Context, fn func(r *Record, err error) error) error {
	defer b.reads.unmark(b.reads.mark()) // fn runs inside the read transaction
	var inUser bool
	return b.viewSnapshot(&inUser, func(tx *bbolt.Tx, snap []bucketSnap) error {
		return b.st.forEach(tx, snap, func(r *Record, err error) error {
			inUser = true
			err = fn(r, err)
			inUser = false
			return err
		})
	})
}
