package idem

// The operator API: reading, resolving and forgetting records, counts, and
// the file's views and backups.

import (
	"io"
	"os"

	"go.etcd.io/bbolt"
)

// Get returns key's live record without side effects: no execution, no
// recovery, no lock. A key with no record, or an expired one, gives
// ErrNotFound; an undecodable one ErrCorrupt.
//
// Get, Forget and Resolve take any key an earlier version could store (1 to
// MaxKeyLen bytes of UTF-8), also one that Do now refuses for white space at
// an end or an invisible character, so such records stay reachable.
func (e *Engine) Get(key string) (*Record, error) { return e.core.Get(key) }

// Forget deletes key's record in any state, so the next call runs fn as new:
// the next call of every engine on the store, once Forget has returned (an
// engine on a store several processes share, such as idempg's, answers no
// replay from its memory). It fails with ErrInProgress while a call with the
// key runs, and with
// ErrNotFound if key has no live record: an expired record the pruner has
// not reached yet is deleted too, but absent, as for Get.
func (e *Engine) Forget(key string) error { return e.core.Forget(key) }

// Resolve completes an interrupted execution by hand: key's started record
// becomes done with response and, if outcome is not nil, a stored *Error
// with outcome's Code and Message (its Replayed is ignored), as if fn had returned
// them. It fails with ErrNotFound if key has no live record, with ErrState if
// its record is done, and with ErrInProgress while a call with the key runs.
func (e *Engine) Resolve(key string, response []byte, outcome *Error) error {
	return e.core.Resolve(key, response, outcome)
}

// Stats counts the engine's work since Open, from counters in memory: Stats
// reads no file and takes no lock. What the file holds is FileStats.
type Stats struct {
	// Since Open: records pruned, answers replayed from storage, executions of
	// fn, and calls refused for a fingerprint mismatch.
	Pruned, Replays, Executions, Conflicts uint64
	// Commits made and the writes they carried since Open (their ratio is the
	// group-commit batch size).
	Commits, Writes uint64
}

// Stats returns the engine's counters since Open, at the cost of a few
// atomic loads; it works after Close too (the final counts). ScanFile
// counts the records and messages in the file.
func (e *Engine) Stats() Stats {
	n := e.core.Counters()
	s := Stats{
		Pruned: n.Pruned.Load(), Replays: n.Replays.Load(),
		Executions: n.Executions.Load(), Conflicts: n.Conflicts.Load(),
	}
	s.Commits, s.Writes = e.pipe.Stats()
	return s
}

// FileStats counts what the file holds, as ScanFile found it.
type FileStats struct {
	// Records by state, inside the retention window.
	Started, Done int
	// ExpiredPending counts records past the retention window that the pruner
	// has not reclaimed yet; every reader already treats them as absent.
	ExpiredPending int
	// Corrupt counts records that fail to decode (see `idem check`).
	Corrupt int
	// FileSize is the bytes of the file in use by bbolt's pages (its
	// Tx.Size); the file on disk may be larger, preallocated for growth.
	FileSize int64
	// Outbox counts the outbox messages by state.
	Outbox OutboxStats
}

// ScanFile reads every record and message of the file (one read
// transaction, linear in what is stored: for a dashboard or `idem stats`,
// not for a metrics scrape, which Stats serves) and returns the counts. It
// fails with ErrClosed after Close.
func (e *Engine) ScanFile() (FileStats, error) {
	if err := e.enterOp(); err != nil {
		return FileStats{}, &OpError{Op: "scan", Err: err}
	}
	defer e.exitOp()
	var s FileStats
	now := e.now()
	err := view(e.db, func(tx *bbolt.Tx) error {
		s.FileSize = tx.Size()
		if err := e.outboxStats(tx, &s.Outbox); err != nil {
			return err
		}
		return e.st.forEach(tx, func(r *Record, err error) error {
			switch {
			case err != nil:
				s.Corrupt++
			case !e.live(r, now):
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
func (e *Engine) Records(fn func(r *Record, err error) error) error { return e.core.Records(fn) }

// View runs fn in a read-only bbolt transaction over the file, so a program
// reads the buckets its DoTx fns write (its orders, its balances) outside a
// call. Bytes read from the transaction point into the file's memory map:
// copy what you keep past fn. Reads run alongside calls; they do not dedupe
// anything. The engine's own bucket ("idem") is visible but is not an API.
func (e *Engine) View(fn func(tx *bbolt.Tx) error) error {
	if err := e.enterOp(); err != nil {
		return &OpError{Op: "view", Err: err}
	}
	defer e.exitOp()
	defer e.reads.unmark(e.reads.mark())
	inUser := true // the whole of fn is the user's
	return viewUser(e.db, &inUser, fn)
}

// Backup writes a consistent copy of the live file to w (bbolt's Tx.WriteTo,
// in a read transaction: calls go on meanwhile) and returns the bytes written.
func (e *Engine) Backup(w io.Writer) (int64, error) {
	if err := e.enterOp(); err != nil {
		return 0, &OpError{Op: "backup", Err: err}
	}
	defer e.exitOp()
	var n int64
	err := view(e.db, func(tx *bbolt.Tx) error {
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
