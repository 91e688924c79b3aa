package idem

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/fault"
)

// boltBackend is the engine's storage in one bbolt file: idemcore.Backend over
// the store's time slots (store.go), the commit pipeline's shared write
// transactions (commit.go), and the outbox buckets. DoTx's
// transaction is *Tx, a bbolt write transaction.
// Its methods, by concept: a call's records (call.go), the claim rule
// (lock.go), the operator's (operator.go), pruning (prune.go), the outbox's
// Enqueue (enqueue.go), claims (outboxclaim.go), delivery (delivery.go),
// walk (outbox.go) and dead letters (deadletter.go). It knows nothing of
// the engine above it: the engine calls it, never the reverse.
type boltBackend struct {
	db       *bbolt.DB
	st       *store
	pipe     *pipeline
	j        *journal // the write-ahead journal (journal.go); nil when off
	replayed int      // the writes Open replayed from the journal
	ov       *overlay // its acknowledged writes bbolt lacks (overlay.go); empty when off
	readOnly bool
	maxSize  int              // BoltOptions.MaxSize, for ErrFileFull's text
	now      func() time.Time // the engine clock, for Tx.Enqueue
	log      *slog.Logger
	commits  chan struct{} // Committed's: capacity 1
	ix       *outboxIndex  // pending messages, for ClaimDue (outboxindex.go)
	reads    readGuard     // goroutines inside Records, View and Messages callbacks
}

var _ idemcore.Backend[*Tx] = (*boltBackend)(nil)

// newBoltBackend returns the backend over db, opened with f, for an engine
// with options o (defaults filled in): its clock, its logger, its observer
// (which gets an EventCommit for every commit of the pipeline).
func newBoltBackend(db *bbolt.DB, f *BoltOptions, o *Options) *boltBackend {
	clock := o.Now
	st := &store{width: o.Retention, refuse: o.Recovery == RecoverRefuse}
	b := &boltBackend{db: db, st: st, ov: newOverlay(), readOnly: f.ReadOnly, maxSize: f.MaxSize,
		now: func() time.Time { return clock().Round(0) }, log: o.Logger, ix: newOutboxIndex(),
		commits: make(chan struct{}, 1)}
	b.pipe = newPipeline(db, b.committed)
	if ob := o.Observer; ob != nil {
		b.pipe.Observe = func(n int, d time.Duration) {
			ob.Observe(idemcore.Event{Kind: idemcore.EventCommit, N: n, Duration: d})
		}
	}
	return b
}

// Info: no heartbeat, no poll: a bbolt claim never lapses and is never
// owned elsewhere. The commits are the pipeline's and the journal's frames.
func (b *boltBackend) Info() idemcore.Info {
	return idemcore.Info{Name: "bbolt", ReadOnly: b.readOnly, Commits: b.commitStats, Replayed: uint64(b.replayed)}
}

// commitStats counts the pipeline's commits and the journal's frames, and
// the writes they carried.
func (b *boltBackend) commitStats() (commits, writes uint64) {
	commits, writes = b.pipe.Stats()
	if b.j != nil {
		g, w := b.j.stats()
		commits, writes = commits+g, writes+w
	}
	return commits, writes
}

// Guard refuses a call from inside a Records, View or Messages callback
// (errInsideRead), and fails closed after a failed commit
// (ErrStorageFailed): every call, replays from the cache too, is refused
// until a reopen.
func (b *boltBackend) Guard() error {
	if b.reads.holding() {
		return errInsideRead
	}
	if err := b.pipe.Failed(); err != nil {
		return storageErr(err, b.maxSize)
	}
	return nil
}

// Holding reports whether the caller runs inside a commit of the pipeline.
func (b *boltBackend) Holding() bool {
	return b.pipe.Holding() || (b.j != nil && b.j.holding())
}

// Close stops the journal (its last frames checkpointed into bbolt) and the
// commit pipeline, and closes the file.
func (b *boltBackend) Close() error {
	var jerr error
	if b.j != nil {
		jerr = b.j.close()
	}
	b.pipe.Stop()
	err := b.db.Close()
	if jerr != nil && !errors.Is(jerr, errCommitFailed) {
		err = errors.Join(jerr, err) // a failed engine reported its failure already
	}
	return err
}

// stopJournal stops the journal and the pipeline of a backend Open gives up
// on (it closes db).
func (b *boltBackend) stopJournal() {
	if b.j != nil {
		b.j.wmu.Lock()
		b.j.stopped = true
		b.j.wmu.Unlock()
		close(b.j.quit)
		<-b.j.done
		_ = b.j.segs.close(false)
	}
	b.pipe.Stop()
}

// write runs fn in the commit pipeline, a direct bbolt write (journal.go);
// its errors are mapped by storageErr.
func (b *boltBackend) write(fn commitFunc) error {
	if b.j == nil {
		return storageErr(b.pipe.Do(fn), b.maxSize)
	}
	return storageErr(b.j.directWrite(func() error { return b.pipe.Do(fn) }), b.maxSize)
}

// record makes a record write: through the journal, or, when it is off, in
// the commit pipeline.
func (b *boltBackend) record(fn func(tx recTx) error) error {
	if b.j == nil {
		return b.write(func(tx *bbolt.Tx) error { return fn(boltRec{tx}) })
	}
	return storageErr(b.j.do(func(w *jtx) error { return fn(w) }), b.maxSize)
}

// storageErr maps the commit pipeline's errors onto the engine's sentinels,
// keeping the cause in the chain: a stopped pipeline is ErrClosed, a failed
// commit ErrStorageFailed, bbolt's ErrMaxSizeReached ErrFileFull, a panic of
// bbolt's in a write (a damaged page) ErrCorrupt.
func storageErr(err error, maxSize int) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errPipelineStopped):
		return ErrClosed
	case errors.Is(err, errCommitFailed):
		return fmt.Errorf("%w: %w", ErrStorageFailed, err)
	case errors.Is(err, bolterrors.ErrMaxSizeReached):
		return fmt.Errorf("%w (BoltOptions.MaxSize is %d bytes): %w", ErrFileFull, maxSize, err)
	}
	// A write's panic is bbolt's on a damaged page (a DoTx fn's own panic
	// is the core's *PanicError, re-raised in its caller): the transaction
	// rolled back, the file is as it was.
	// (A failpoint's injected panic stays what it is.)
	if pe, ok := errors.AsType[*commitPanic](err); ok {
		if _, injected := pe.Value.(*fault.Panic); !injected {
			return damaged(pe.Value)
		}
	}
	return err
}
