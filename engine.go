package idem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/boltfile"
)

// Engine is an open idem file: the state machine of idemcore over the
// bbolt backend (backend.go). It is safe for concurrent use.
type Engine struct {
	core *idemcore.Engine[*Tx]
	b    *boltBackend
	db   *bbolt.DB
	opts Options
	st   store
	pipe *pipeline
	log  *slog.Logger

	closing  sync.Once
	shutDone chan struct{}
	closeErr error

	reads readGuard // goroutines inside Records, View and Messages callbacks
}

// Open opens or creates the idem file at path. One Engine holds a file at a
// time: another Open of the same file, in this process or another, fails after
// opts.Bolt.LockTimeout with an error that matches bbolt's errors.ErrTimeout. A file
// of format version 1 (the first) is read as it is and, unless opts.Bolt.ReadOnly,
// migrated to version 2 in Open's first transaction (its records keep their
// windows; its interrupted executions are kept until resolved, since version 1
// did not record the policy); a file of a newer version fails with ErrFormat
// and is left as it is. A damaged file (truncated below its last page in use,
// or a page bbolt panics on) fails with an error wrapping ErrCorrupt and is
// released: a later Open of the repaired file succeeds.
func Open(path string, opts *Options) (*Engine, error) {
	return open(path, opts, nil)
}

// open is Open, with the backend wrapped by wrap if it is not nil (the
// conformance suite's test backends, through export_test.go).
func open(path string, opts *Options, wrap func(idemcore.Backend[*Tx]) idemcore.Backend[*Tx]) (*Engine, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := validateOptions(&o); err != nil {
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.PruneInterval == 0 {
		o.PruneInterval = DefaultPruneInterval
	}
	if o.Bolt.LockTimeout <= 0 {
		o.Bolt.LockTimeout = DefaultLockTimeout
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = DefaultRetryAfter
	}
	if o.MaxResponseSize == 0 {
		o.MaxResponseSize = DefaultMaxResponseSize
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Bolt.ReadOnly {
		fi, err := os.Stat(path)
		if err == nil && fi.Size() == 0 {
			err = fmt.Errorf("%w: the file is empty", ErrFormat)
		}
		if err == nil && fi.IsDir() {
			err = &fs.PathError{Op: "open", Path: path, Err: syscall.EISDIR}
		}
		if err != nil {
			return nil, &OpError{Op: "open", Path: path, Err: err}
		}
	}
	db, err := openBolt(path, &bbolt.Options{
		Timeout:      o.Bolt.LockTimeout,
		NoSync:       o.Bolt.NoSync,
		ReadOnly:     o.Bolt.ReadOnly,
		FreelistType: bbolt.FreelistMapType,
		// NoFreelistSync would save a page per commit, but bbolt then walks
		// every page at Open in a goroutine of its own, where a damaged page
		// panics beyond recovery and kills the program: not worth it.
		NoStatistics: true,
		MaxSize:      max(o.Bolt.MaxSize, 0),
		// A negative size would make bbolt's map smaller than the file.
		InitialMmapSize: max(o.Bolt.InitialMmapSize, 0),
	})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			err = fmt.Errorf("file is in use by another program or engine (no lock after %v): %w", o.Bolt.LockTimeout, err)
		}
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	if err := firstRead(db, func() error { return initFile(db, o.Bolt.ReadOnly) }); err != nil {
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	e := &Engine{
		db:       db,
		opts:     o,
		st:       store{width: o.Retention, refuse: o.Recovery == RecoverRefuse},
		log:      o.Logger,
		shutDone: make(chan struct{}),
	}
	if err := firstRead(db, func() error { return db.View(e.st.loadSlots) }); err != nil {
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	e.b = &boltBackend{db: db, st: &e.st, e: e, readOnly: o.Bolt.ReadOnly, ix: newOutboxIndex()}
	e.pipe = newPipeline(db, e.b.committed)
	e.b.pipe = e.pipe
	var b idemcore.Backend[*Tx] = e.b
	if wrap != nil {
		b = wrap(b)
	}
	co := engineOptions(&o)
	co.Guard = func() error {
		if e.reads.holding() {
			return errInsideRead
		}
		// Fail closed after a failed commit (ErrStorageFailed): every
		// call, replays from the cache too, is refused until a reopen.
		if err := e.pipe.Failed(); err != nil {
			return storageErr(err, e.opts.Bolt.MaxSize)
		}
		return nil
	}
	e.core = idemcore.New(b, co)
	e.watchCommits()
	e.core.Start()
	return e, nil
}

// openBolt is bbolt.Open through internal/boltfile: a file whose meta pages
// contradict it (truncated below its last page, which bbolt would map and
// fault on) is refused before bbolt maps it, and a panic of bbolt's on a
// damaged page releases the file; both are errors wrapping ErrCorrupt.
func openBolt(path string, o *bbolt.Options) (*bbolt.DB, error) {
	db, err := boltfile.Open(path, 0o600, o)
	switch {
	case errors.Is(err, boltfile.ErrDamaged):
		err = fmt.Errorf("%w: %w; run `idem check` and restore from a backup", ErrCorrupt, err)
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrVersionMismatch):
		// Random bytes, another program's file: not an idem file.
		err = fmt.Errorf("%w: %w", ErrFormat, err)
	}
	return db, err
}

// firstRead runs one of Open's first transactions on db, which read pages
// bbolt.Open did not: a panic of bbolt's on a damaged page there is an error
// wrapping ErrCorrupt, as in openBolt, and on any failure db is closed (the
// transaction rolled back first), so the file is released.
func firstRead(db *bbolt.DB, read func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = damaged(v)
		}
		if err != nil {
			_ = db.Close()
		}
	}()
	return read()
}

// Do runs fn once per idempotency key and records its outcome, so that every
// later call with the key gets that outcome back instead of running fn again.
//
// key is the idempotency key: 1 to MaxKeyLen bytes of UTF-8, without
// leading or trailing white space and without control or format characters
// (Unicode Cc and Cf, such as NUL or the byte-order mark); else
// ErrInvalidKey, nothing stored (ErrInvalidKey gives the rules' sources).
// fingerprint is the bytes that define "the same request" (canonical
// arguments, see Fingerprint); the engine stores a 64-bit xxhash of them, and
// a reused key with a different fingerprint fails with
// ErrFingerprintMismatch, whatever the record's state.
//
// The first call commits a started record (fsync), runs fn with a context
// that carries CallFrom information and ends on Close, then commits a done
// record with fn's response and error. A done key replays: Result.Replayed is
// true, Response is the stored one, and a stored error comes back as *Error
// with its Code and Message. While a call runs, others with the same key wait
// for it (InFlightWait) or fail with ErrInProgress (InFlightFail); a waiter
// whose ctx ends returns ctx.Err() and changes nothing.
//
// Outcomes of fn: a response and no error, or a permanent error (returned as
// *Error wrapping fn's error), are recorded. An error made with Retryable
// deletes the started record and frees the key. An error returned once fn's
// own context has ended (the caller's ctx or Close), a panic (re-raised in the
// caller with its value and stack), or a failed commit leave the started
// record: an interrupted execution that the RecoveryPolicy handles on the next
// call; waiters then get ErrIncomplete. A response over MaxResponseSize fails
// closed with ErrResponseTooLarge. Once fn has returned, its outcome is
// recorded even if ctx ends. After Close, Do returns ErrClosed.
//
// Only the end of fn's own context is an interruption: a context error fn
// returns while its context is live (its own call to a gateway timed out, say
// WithCode(downstreamCtx.Err(), "downstream_timeout")) is a permanent error
// like any other, stored with its code.
//
// Nothing erases the evidence of an unknown outcome. When a call that
// recovers an interrupted execution ends without an outcome (Retryable, the
// end of its context, a panic, a failed commit), the key keeps a started
// record carrying that call's attempt and start time, so the next call
// recovers again (CallFrom's Recovered is set) with the attempt after it.
// Attempt numbers never repeat.
//
// fn may call Do with other keys, passing its ctx. A call with fn's own key
// returns ErrReentrant instead of waiting for itself: one made with fn's
// context (from any goroutine), and one made from the goroutine that runs fn
// whatever context it passes (context.Background() included), also through
// other keys' fns that run on that goroutine. What cannot be detected: fn
// starts another goroutine that calls fn's own key with a context not derived
// from fn's, and waits for it; or two calls on two goroutines form a cycle
// (A's fn calls B while B's fn calls A). Such calls wait until one of their
// contexts ends (never, for context.Background()). fn must not call Close,
// which waits for fn. A nil fn is refused with an error (whatever the key's
// state), and nothing is stored.
func (e *Engine) Do(ctx context.Context, key string, fingerprint []byte, fn func(context.Context) ([]byte, error)) (Result, error) {
	return e.core.Do(ctx, key, fingerprint, fn)
}

// Close is Shutdown without a deadline.
func (e *Engine) Close() error { return e.Shutdown(context.Background()) }

// Shutdown closes the engine: new calls fail with ErrClosed, the contexts
// given to running fns are cancelled, and Shutdown waits for running calls,
// then stops the pruner and the commit pipeline and closes the file. If ctx
// ends first, Shutdown returns ctx.Err() and the engine finishes closing in the
// background when the last call returns. It is idempotent: later calls wait
// the same way and return the first close's result.
func (e *Engine) Shutdown(ctx context.Context) error {
	e.closing.Do(func() {
		e.core.Stop()
		go func() {
			e.core.Wait() // the calls, the pruner and the dispatcher
			e.closeErr = e.b.Close()
			close(e.shutDone)
		}()
	})
	select {
	case <-e.shutDone:
		return e.closeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Call describes the execution a fn belongs to; CallFrom reads it from fn's
// context. Key is the idempotency key: pass it on to the downstream system.
// Attempt is 1 on the first execution and counts re-executions. Recovered is
// true when this execution recovers an interrupted one: fn may have had its
// effect before, so reconcile with the downstream system. The type is the
// state machine's (idemcore), shared by every backend.
type Call = idemcore.Call

// CallFrom returns the Call that ctx belongs to, if ctx is (derived from) the
// context given to fn by Do or DoTx.
func CallFrom(ctx context.Context) (Call, bool) { return idemcore.CallFrom(ctx) }

// now reads the engine clock, monotonic reading stripped.
func (e *Engine) now() time.Time { return e.core.Now() }

// live reports whether r is live at now (idemcore.Engine.Live).
func (e *Engine) live(r *Record, now time.Time) bool { return e.core.Live(r, now) }

// enterOp registers an operator call: from inside a DoTx fn, which holds the
// single writer, it fails with ErrReentrant instead of waiting for itself;
// after Close with ErrClosed. exitOp ends it.
func (e *Engine) enterOp() error { return e.core.Enter() }

func (e *Engine) exitOp() { e.core.Exit() }

func (e *Engine) writeErr(op, key string, err error) error {
	return opError(op, key, storageErr(err, e.opts.Bolt.MaxSize))
}

func cloneBytes(b []byte) []byte { return idemcore.CloneBytes(b) }

// errNilFn refuses a nil fn (idemcore.ErrNilFn).
var errNilFn = idemcore.ErrNilFn
