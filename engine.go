package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/internal/boltfile"
	"github.com/idemkit/idem/internal/commit"
	"github.com/idemkit/idem/internal/fault"
)

// Defaults for the zero values of Options.
const (
	// MaxKeyLen is the longest idempotency key in bytes: Stripe's limit of 255
	// characters, counted in bytes of UTF-8.
	MaxKeyLen = 255
	// DefaultRetention is how long a record stays after it completes: Stripe
	// and the IETF Idempotency-Key draft both suggest at least 24 hours.
	DefaultRetention = 24 * time.Hour
	// DefaultPruneInterval is how often the background pruner runs.
	DefaultPruneInterval = time.Minute
	// DefaultLockTimeout bounds how long Open waits for the file lock.
	DefaultLockTimeout = time.Second
	// DefaultRetryAfter is the wait an InProgressError suggests (Options.RetryAfter).
	DefaultRetryAfter = time.Second
	// DefaultMaxResponseSize is the largest response stored, in bytes (1 MiB).
	DefaultMaxResponseSize = 1 << 20
)

// InFlightPolicy says what a call does while another call with the same key
// runs in this process.
type InFlightPolicy uint8

const (
	// InFlightWait: wait for the running call and answer from its outcome.
	InFlightWait InFlightPolicy = iota
	// InFlightFail: fail at once with ErrInProgress (the IETF draft's HTTP 409).
	InFlightFail
)

// RecoveryPolicy says what to do with an interrupted execution: a started
// record that no live call owns, after which fn may or may not have had its
// effect.
type RecoveryPolicy uint8

const (
	// RecoverReexecute runs fn again (at-least-once). fn sees CallFrom(ctx)
	// with Recovered set and the attempt number, so it can reconcile with the
	// downstream system, passing the same key on.
	RecoverReexecute RecoveryPolicy = iota
	// RecoverRefuse returns ErrIncomplete until an operator resolves the key
	// (Engine.Resolve, Engine.Forget, or `idem resolve`). Such records never
	// expire: each started record is written marked kept until resolved
	// (Record.KeptUntilResolved), so a later Open with RecoverReexecute, or
	// `idem prune`, keeps it too (and recovers it on the next call).
	RecoverRefuse
)

// Options configure Open. The zero value of every field means its default; a
// nil *Options means all defaults.
type Options struct {
	// Retention is the retention window, wall-clock: a record expires this long
	// after it completed (an orphaned started record, after it started). Zero
	// means DefaultRetention. It is a floor: space may be reclaimed later. It
	// is recorded with every record written (Record.Retention): a record
	// written under a longer window by an earlier Open keeps that window, and
	// one written under a shorter window lives this one.
	Retention time.Duration

	// PruneInterval is the period of the background pruner. Zero means
	// DefaultPruneInterval; a negative value disables the pruner (call Prune).
	PruneInterval time.Duration

	// LockTimeout bounds the wait for the file lock, held by any other Open of
	// the file, in this process or another. Zero means DefaultLockTimeout. The
	// error then matches bbolt's errors.ErrTimeout.
	LockTimeout time.Duration

	// InFlight is the policy for concurrent duplicates. Zero is InFlightWait.
	InFlight InFlightPolicy

	// RetryAfter is the wait, wall-clock, that an InProgressError suggests to a
	// duplicate refused under InFlightFail (the HTTP adapter's Retry-After,
	// rounded up to whole seconds). Zero means DefaultRetryAfter.
	RetryAfter time.Duration

	// Recovery is the policy for interrupted executions. Zero is
	// RecoverReexecute.
	Recovery RecoveryPolicy

	// MaxResponseSize is the most bytes stored for an outcome: the response
	// plus the error's code and message. Zero means DefaultMaxResponseSize;
	// negative means no limit. A larger outcome fails closed with
	// ErrResponseTooLarge (stored, replayed, never truncated).
	MaxResponseSize int

	// ReplayCacheBytes bounds the memory, in bytes, of the cache of recently
	// completed records that answers replays without a read transaction
	// (keys, responses and error texts, plus 352 bytes an entry for the
	// record, its index and its queue slots, and 64 for a stored error). Zero
	// means DefaultReplayCacheBytes; negative disables the cache.
	ReplayCacheBytes int

	// ReadOnly opens the file for inspection: a shared lock (other read-only
	// opens may share the file, a writer may not), no change to the file, no
	// pruner or dispatcher. Replays and Get work; anything that writes fails
	// with bbolt's errors.ErrDatabaseReadOnly. A file with no idem bucket is
	// refused with ErrFormat.
	ReadOnly bool

	// NoSync skips fsync on every commit. UNSAFE: a crash of the machine (not
	// just of the process) may lose records, and a lost started record means a
	// duplicate execution. For tests and benchmarks.
	NoSync bool

	// MaxSize bounds the file, in bytes (bbolt's MaxSize), so that callers
	// minting new keys cannot fill the disk: a commit that would grow the file
	// past it fails with ErrFileFull and stores nothing. bbolt grows the file
	// in steps (doubling up to 1 GiB, then 16 MiB at a time), so the file
	// stops at the last step under MaxSize. Zero or negative means no limit.
	// A file already larger opens, and commits that fit in its free pages go
	// on.
	MaxSize int

	// InitialMmapSize is the size, in bytes, of the memory map bbolt opens
	// the file with (bbolt's InitialMmapSize). A commit that grows the file
	// past the map must remap it, and waits until every read transaction
	// (View, Backup, Records, Messages, ScanFile, a long scan) has ended: calls
	// stall behind a long reader then. A map larger than the file will grow
	// (it costs address space, not memory) lets commits go on beside any
	// reader. Zero means bbolt's default (the file's size, rounded up).
	InitialMmapSize int

	// Now is the clock, for expiry and record times. Nil means time.Now. The
	// engine strips the monotonic reading of every time it reads
	// (t.Round(0)): records in the file carry wall-clock times only, so
	// records in memory do too, and both compare alike across a step of the
	// wall clock.
	Now func() time.Time

	// Outbox configures the dispatcher of outbox messages (see Tx.Enqueue).
	Outbox OutboxOptions

	// Logger receives the engine's own events (pruning, recovery) at debug
	// and warn level; keys and responses are never logged. Nil discards.
	Logger *slog.Logger

	// Observer receives the engine's events (executions, replays, commits,
	// outbox deliveries, ...) for metrics: see Observer. Nil means none, at
	// the cost of a nil check per event.
	Observer Observer
}

// Result describes the answer of Do or DoTx. It is returned beside a non-nil
// error too.
type Result struct {
	// Response is fn's response (nil and empty differ). The caller whose fn
	// ran gets the slice fn returned (a copy for DoTx); every other caller
	// gets a copy of its own.
	Response []byte
	// Replayed is true when fn did not run in this call: the answer came from
	// the stored record, or from the concurrent call this one waited for.
	Replayed bool
	// Attempt is the execution the answer comes from, starting at 1.
	Attempt int
	// StartedAt and CompletedAt are the record's times (engine clock).
	StartedAt   time.Time
	CompletedAt time.Time
}

// Engine is an open idem file. It is safe for concurrent use.
type Engine struct {
	db    *bbolt.DB
	opts  Options
	st    store
	cache *replayCache
	ob    *outbox
	pipe  *commit.Pipeline
	locks *keyLocks
	now   func() time.Time
	log   *slog.Logger

	// ctx is cancelled by Close; every fn's context ends with it.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.RWMutex // guards closed against calls entering
	closed   bool
	calls    sync.WaitGroup // calls in Do, DoTx and operator methods
	bg       sync.WaitGroup // pruner, dispatcher
	stopBg   chan struct{}
	closing  sync.Once
	pruneMu  sync.Mutex // one prune at a time
	shutDone chan struct{}
	closeErr error

	n counters
}

type counters struct {
	replays, executions, conflicts, pruned atomic.Uint64
}

// Open opens or creates the idem file at path. One Engine holds a file at a
// time: another Open of the same file, in this process or another, fails after
// opts.LockTimeout with an error that matches bbolt's errors.ErrTimeout. A file
// of format version 1 (the first) is read as it is and, unless opts.ReadOnly,
// migrated to version 2 in Open's first transaction (its records keep their
// windows; its interrupted executions are kept until resolved, since version 1
// did not record the policy); a file of a newer version fails with ErrFormat
// and is left as it is. A damaged file (truncated below its last page in use,
// or a page bbolt panics on) fails with an error wrapping ErrCorrupt and is
// released: a later Open of the repaired file succeeds.
func Open(path string, opts *Options) (*Engine, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.PruneInterval == 0 {
		o.PruneInterval = DefaultPruneInterval
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
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
	clock := o.Now
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ReadOnly {
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
		Timeout:      o.LockTimeout,
		NoSync:       o.NoSync,
		ReadOnly:     o.ReadOnly,
		FreelistType: bbolt.FreelistMapType,
		// NoFreelistSync would save a page per commit, but bbolt then walks
		// every page at Open in a goroutine of its own, where a damaged page
		// panics beyond recovery and kills the program: not worth it.
		NoStatistics: true,
		MaxSize:      max(o.MaxSize, 0),
		// A negative size would make bbolt's map smaller than the file.
		InitialMmapSize: max(o.InitialMmapSize, 0),
	})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			err = fmt.Errorf("file is in use by another program or engine (no lock after %v): %w", o.LockTimeout, err)
		}
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	if err := firstRead(db, func() error { return initFile(db, o.ReadOnly) }); err != nil {
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	e := &Engine{
		db:       db,
		opts:     o,
		st:       store{width: o.Retention, refuse: o.Recovery == RecoverRefuse},
		locks:    newKeyLocks(),
		cache:    newReplayCache(cmp.Or(o.ReplayCacheBytes, DefaultReplayCacheBytes)),
		now:      func() time.Time { return clock().Round(0) },
		log:      o.Logger,
		stopBg:   make(chan struct{}),
		shutDone: make(chan struct{}),
	}
	if err := firstRead(db, func() error { return db.View(e.st.loadSlots) }); err != nil {
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.pipe = commit.New(db, e.committed)
	e.watchCommits()
	if o.ReadOnly {
		e.opts.Outbox.Dispatch = false
	}
	if err := e.startOutbox(); err != nil {
		_ = e.Close()
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	if o.PruneInterval > 0 && !o.ReadOnly {
		e.bg.Add(1)
		go e.pruneLoop(o.PruneInterval)
	}
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
			err = fmt.Errorf("%w: %w (bbolt: %v); run `idem check` and restore from a backup", ErrCorrupt, boltfile.ErrDamaged, v)
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
// which waits for fn.
func (e *Engine) Do(ctx context.Context, key string, fingerprint []byte, fn func(context.Context) ([]byte, error)) (Result, error) {
	res, err := e.call(ctx, "do", key, fingerprint, func(ctx context.Context, c *leading) (Result, error) {
		return e.execute(ctx, c, fn)
	})
	return res, opError("do", key, err)
}

// leading is the state of the call that leads a key.
type leading struct {
	flight    *flight
	key       string
	fp        uint64
	attempt   int
	recovered bool
	prev      *Record // the interrupted execution being recovered, if any
	// again asks the waiters to try to lead: nothing was stored.
	again bool
	// incomplete: fn ended without an outcome; waiters get ErrIncomplete.
	incomplete bool
}

// call is the part of Do and DoTx before execution: validation, the replay
// fast path, the singleflight, and the state machine on the stored record.
func (e *Engine) call(ctx context.Context, op, key string, fingerprint []byte,
	exec func(context.Context, *leading) (Result, error)) (Result, error) {
	if err := validateKey(key); err != nil {
		return Result{}, &OpError{Op: op, Key: key, Err: err}
	}
	if err := e.reentrant(ctx, key); err != nil {
		return Result{}, &OpError{Op: op, Key: key, Err: err}
	}
	if err := e.enter(); err != nil {
		return Result{}, &OpError{Op: op, Key: key, Err: err}
	}
	defer e.calls.Done()
	fp := xxhash.Sum64(fingerprint)

	// The fast path: a done record answers without the per-key lock, after
	// the fingerprint check, from memory if it completed recently.
	now := e.now()
	if rec, ok := e.cached(key, now); ok {
		return e.replay(op, rec, fp, true)
	}
	gen := e.locks.generation()
	rec, conflict, err := e.loadFor(key, fp, true, now)
	if err != nil {
		return Result{}, err
	}
	if conflict {
		return Result{}, e.conflict(op, key, nil)
	}
	if rec != nil && rec.State == StateDone {
		return e.replay(op, rec, fp, false)
	}

	for {
		f, leader := e.locks.acquire(key, fp, now)
		if !leader {
			if err := e.selfWait(f); err != nil {
				return Result{}, &OpError{Op: op, Key: key, Err: err}
			}
			if f.fp != fp {
				if f.executing.Load() {
					return Result{}, e.conflict(op, key, errors.New("the call in progress has another fingerprint"))
				}
				// The leader has not claimed the key with its fingerprint (it
				// may be answering from a record of ours, or be an operator):
				// its outcome is not ours. Wait for it, then look again.
				if err := f.wait(ctx); err != nil {
					return Result{}, err
				}
				continue
			}
			if e.opts.InFlight == InFlightFail {
				e.observe(Event{Kind: EventInProgress, Op: op})
				return Result{}, &OpError{Op: op, Key: key, Err: &InProgressError{StartedAt: f.started, RetryAfter: e.opts.RetryAfter}}
			}
			fault.Point("do-wait")
			e.observe(Event{Kind: EventWait, Op: op})
			if err := f.wait(ctx); err != nil {
				return Result{}, err
			}
			if f.again {
				continue
			}
			// fn did not run in this call: the answer is a replay of the
			// leader's, in copies of its own.
			res, err := f.res, f.err
			res.Response, res.Replayed = cloneBytes(res.Response), true
			if ie, ok := err.(*Error); ok {
				cp := *ie
				cp.Replayed = true
				err = &cp
			}
			return res, err
		}
		// The record read above is still current if no call has released
		// a key since (every write of a record happens under its key);
		// otherwise the leader reads it again.
		return e.lead(ctx, op, key, fp, f, rec, e.locks.generation() != gen, exec)
	}
}

// lead runs the state machine for the leader and publishes its outcome to
// the waiters, also when exec panics or calls runtime.Goexit. rec is the
// key's record as read before the key was taken; stale asks to read it again.
// Everything after acquire runs here, under the deferred release, so no path
// leaves the flight registered.
func (e *Engine) lead(ctx context.Context, op, key string, fp uint64, f *flight, rec *Record, stale bool,
	exec func(context.Context, *leading) (Result, error)) (res Result, err error) {
	c := &leading{key: key, fp: fp, attempt: 1, flight: f}
	returned := false
	defer func() {
		switch {
		case c.again:
			f.again = true
		case !returned || c.incomplete:
			f.err = &OpError{Op: op, Key: key, Err: fmt.Errorf("%w: the leading call ended without an outcome", ErrIncomplete)}
		default:
			f.res, f.err = res, err
		}
		e.locks.release(key, f)
	}()
	var loadErr error
	if stale {
		rec, loadErr = e.load(key)
	}
	res, err = e.decide(ctx, op, c, f, rec, loadErr, exec)
	returned = true
	return res, err
}

// decide applies the state machine to rec, the key's record read by the
// leader (err: the read failed).
func (e *Engine) decide(ctx context.Context, op string, c *leading, f *flight, rec *Record, err error,
	exec func(context.Context, *leading) (Result, error)) (Result, error) {
	if err != nil {
		c.again = true
		return Result{}, err
	}
	if rec != nil {
		if rec.Fingerprint != c.fp {
			return Result{}, e.conflict(op, c.key, nil)
		}
		if rec.State == StateDone {
			return e.replay(op, rec, c.fp, false)
		}
		// A started record while we hold the key: nobody owns it.
		if e.opts.Recovery == RecoverRefuse {
			return Result{}, &OpError{Op: op, Key: c.key, Err: fmt.Errorf("%w: interrupted execution (attempt %d, started %s); resolve or forget the key",
				ErrIncomplete, rec.Attempt, rec.StartedAt.UTC().Format(time.RFC3339))}
		}
		c.attempt, c.recovered, c.prev = rec.Attempt+1, true, rec
		e.log.Debug("idem: re-executing an interrupted execution", "attempt", c.attempt)
	}
	if err := ctx.Err(); err != nil {
		c.again = true
		return Result{}, err
	}
	f.executing.Store(true) // the key is claimed with c.fp: others conflict at once
	return exec(ctx, c)
}

// execute is Do's execution: started commit, fn, done commit.
func (e *Engine) execute(ctx context.Context, c *leading, fn func(context.Context) ([]byte, error)) (Result, error) {
	if e.pipe.Holding() {
		c.again = true
		return Result{}, &OpError{Op: "do", Key: c.key, Err: errInsideDoTx}
	}
	started := &Record{Key: c.key, State: StateStarted, Fingerprint: c.fp, Attempt: c.attempt, StartedAt: e.now()}
	if err := e.pipe.Do(func(tx *bbolt.Tx) error { return e.st.put(tx, started, c.prev) }); err != nil {
		c.again = true
		return Result{}, e.writeErr("do", c.key, err)
	}
	fault.Point("do-after-started")
	if err := ctx.Err(); err != nil {
		// fn has not started: put the key back as it was.
		c.again = true
		if rerr := e.pipe.Do(func(tx *bbolt.Tx) error { return e.restore(tx, c, started) }); rerr != nil {
			e.log.Warn("idem: cannot remove a started record after cancellation", "err", rerr)
		}
		return Result{}, err
	}

	e.observe(Event{Kind: EventExecution, Op: "do", N: c.attempt})
	e.n.executions.Add(1)
	c.flight.runner.Store(commit.GoroutineID()) // fn runs here: see selfWait
	resp, ferr, ended := e.runFn(ctx, c, fn)
	fault.Point("do-after-fn")

	res := Result{Response: resp, Attempt: c.attempt, StartedAt: started.StartedAt}
	switch {
	case errors.Is(ferr, ErrRetryable) && c.prev != nil:
		// fn's promise covers this attempt only: the earlier attempt's effect
		// is still unknown, so this attempt's started record stays, and the
		// next call recovers with the attempt after it.
		return res, ferr
	case errors.Is(ferr, ErrRetryable):
		if err := e.pipe.Do(func(tx *bbolt.Tx) error { return e.st.del(tx, started) }); err != nil {
			c.incomplete = true
			return res, errors.Join(ferr, e.writeErr("do", c.key, err))
		}
		return res, ferr
	case ferr != nil && ended:
		// fn's own context ended (the caller's ctx or Close): its error is an
		// interruption, not an outcome. A context error fn made itself (a
		// downstream timeout) while its context was live is an outcome.
		c.incomplete = true
		return res, ferr
	}
	done := e.doneRecord(started, resp, ferr)
	if err := e.pipe.Do(func(tx *bbolt.Tx) error {
		fault.Point("do-done-commit")
		return e.st.put(tx, done, started)
	}); err != nil {
		c.incomplete = true
		return res, e.writeErr("do", c.key, err)
	}
	fault.Point("do-after-done")
	e.remember(done)
	return e.firstAnswer(done, resp, ferr)
}

// runFn runs Do's fn in its context, and releases that context (its
// registration on the engine's) on every path: a panic or runtime.Goexit in fn
// included. ended reports whether fn's own context had ended (the caller's
// ctx or Close) when fn returned, read before the stop that cancels it.
func (e *Engine) runFn(ctx context.Context, c *leading, fn func(context.Context) ([]byte, error)) (resp []byte, ferr error, ended bool) {
	fnCtx, stop := e.fnContext(ctx, c, false)
	defer stop()
	resp, ferr = fn(fnCtx)
	return resp, ferr, fnCtx.Err() != nil
}

// doneRecord builds the done record for fn's outcome, failing closed on a
// response over the limit.
func (e *Engine) doneRecord(started *Record, resp []byte, ferr error) *Record {
	done := *started
	done.State, done.CompletedAt, done.Response = StateDone, e.now(), resp
	var code, msg string
	if ferr != nil {
		code, msg = errorCode(ferr), ferr.Error()
	}
	// The limit covers what is stored: the response and the error's text.
	if max, n := e.opts.MaxResponseSize, len(resp)+len(code)+len(msg); max > 0 && n > max {
		done.Response = nil
		done.Err = &Error{Code: codeResponseTooLarge,
			Message: fmt.Sprintf("response and error of %d bytes exceed the limit of %d bytes", n, max)}
	} else if ferr != nil {
		done.Err = &Error{Code: code, Message: msg}
	}
	return &done
}

// firstAnswer is the caller's answer once done is committed: the record as a
// replay would give it, except that the error wraps fn's own.
func (e *Engine) firstAnswer(done *Record, resp []byte, ferr error) (Result, error) {
	res := Result{Response: done.Response, Attempt: done.Attempt, StartedAt: done.StartedAt, CompletedAt: done.CompletedAt}
	if done.Err == nil {
		return res, nil
	}
	out := *done.Err
	if out.Code != codeResponseTooLarge {
		out.err = ferr
	}
	return res, &out
}

// restore undoes this call's started record: back to the interrupted
// execution it recovered, or deleted.
func (e *Engine) restore(tx *bbolt.Tx, c *leading, started *Record) error {
	if c.prev != nil {
		return e.st.put(tx, c.prev, started)
	}
	return e.st.del(tx, started)
}

// replay answers from a done record. A record shared with the cache is
// copied: each caller gets its own response bytes and its own *Error. A
// record just decoded from the file is the caller's already.
func (e *Engine) replay(op string, rec *Record, fp uint64, shared bool) (Result, error) {
	if rec.Fingerprint != fp {
		return Result{}, e.conflict(op, rec.Key, nil)
	}
	e.n.replays.Add(1)
	e.observe(Event{Kind: EventReplay, Op: op})
	res := Result{Response: rec.Response, Replayed: true, Attempt: rec.Attempt, StartedAt: rec.StartedAt, CompletedAt: rec.CompletedAt}
	if !shared {
		if rec.Err != nil {
			return res, rec.Err
		}
		return res, nil
	}
	res.Response = cloneBytes(rec.Response)
	if rec.Err != nil {
		err := *rec.Err
		return res, &err
	}
	return res, nil
}

// conflict counts a fingerprint mismatch on key and returns its error, with
// why (if not nil) as the detail.
func (e *Engine) conflict(op, key string, why error) error {
	e.n.conflicts.Add(1)
	e.observe(Event{Kind: EventConflict, Op: op})
	err := ErrFingerprintMismatch
	if why != nil {
		err = fmt.Errorf("%w: %v", ErrFingerprintMismatch, why)
	}
	return &OpError{Op: op, Key: key, Err: err}
}

// remember puts a just-committed done record in the replay cache, as a
// replay from the file would see it: its own copy of the response.
func (e *Engine) remember(done *Record) {
	if e.cache == nil {
		return
	}
	r := *done
	r.Response = cloneBytes(done.Response)
	if done.Err != nil {
		stored := Error{Code: done.Err.Code, Message: done.Err.Message, Replayed: true}
		r.Err = &stored
	}
	e.cache.put(&r)
}

// load reads key's live record, or nil if it has none or it expired.
func (e *Engine) load(key string) (*Record, error) {
	rec, _, err := e.loadFor(key, 0, false, e.now())
	return rec, err
}

// loadFor is load at now for a call with fingerprint fp: if check is set, a
// live done record with another fingerprint is reported as conflict without
// decoding it (the response need not be copied to be refused).
func (e *Engine) loadFor(key string, fp uint64, check bool, now time.Time) (rec *Record, conflict bool, err error) {
	err = e.db.View(func(tx *bbolt.Tx) error {
		// bbolt only compares the key: a view of the string's bytes saves
		// the copy on every lookup.
		v := e.st.rawLookup(tx, unsafe.Slice(unsafe.StringData(key), len(key)), e.horizon(now))
		if v == nil {
			return nil
		}
		if st, rfp, completed, ok := peekRecord(v); check && ok && st == StateDone && rfp != fp &&
			now.Before(completed.Add(e.opts.Retention)) {
			conflict = true
			return nil
		}
		var err error
		rec, err = decodeRecord(key, v)
		return err
	})
	if err != nil || conflict {
		return nil, conflict, err
	}
	if rec != nil && !e.live(rec, now) {
		return nil, false, nil
	}
	return rec, false, nil
}

// horizon is the oldest time a live record can be slotted at: none. A record
// kept until resolved may sit in any slot, however old, and a record keeps
// the window it was written under, so lookups probe every slot; the pruner
// drops those that hold only expired records.
func (e *Engine) horizon(time.Time) time.Time { return time.Time{} }

// live reports whether r is live at now: a started record kept until
// resolved (written under RecoverRefuse, or of a format-1 file), or any
// started record while this engine refuses, always; any other record inside
// the longer of the window it was written under and this engine's.
func (e *Engine) live(r *Record, now time.Time) bool {
	if r.State == StateStarted && (r.KeptUntilResolved || e.opts.Recovery == RecoverRefuse) {
		return true
	}
	return now.Before(r.expiresAt(e.opts.Retention))
}

func (e *Engine) writeErr(op, key string, err error) error {
	return opError(op, key, storageErr(err, e.opts.MaxSize))
}

// storageErr maps the commit pipeline's errors onto the engine's sentinels,
// keeping the cause in the chain.
func storageErr(err error, maxSize int) error {
	switch {
	case errors.Is(err, commit.ErrStopped):
		return ErrClosed
	case errors.Is(err, commit.ErrFailed):
		return fmt.Errorf("%w: %w", ErrStorageFailed, err)
	case errors.Is(err, bolterrors.ErrMaxSizeReached):
		return fmt.Errorf("%w (Options.MaxSize is %d bytes): %w", ErrFileFull, maxSize, err)
	}
	return err
}

// enterOp is enter for every method but Do and DoTx (which check before they
// write): called from inside a DoTx fn, which holds the single writer, it
// fails with ErrReentrant instead of waiting for itself.
func (e *Engine) enterOp() error {
	if e.pipe.Holding() {
		return errInsideDoTx
	}
	return e.enter()
}

// enter registers a call, or fails after Close.
func (e *Engine) enter() error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return ErrClosed
	}
	if err := e.pipe.Failed(); err != nil {
		return storageErr(err, e.opts.MaxSize)
	}
	e.calls.Add(1)
	return nil
}

// Call describes the execution a fn belongs to; CallFrom reads it from fn's
// context.
type Call struct {
	// Key is the idempotency key: pass it on to the downstream system.
	Key string
	// Attempt is 1 on the first execution and counts re-executions.
	Attempt int
	// Recovered is true when this execution recovers an interrupted one: fn
	// may have had its effect before, so reconcile with the downstream system.
	Recovered bool
}

type callCtxKey struct{}

type callCtx struct {
	Call
	e    *Engine
	inTx bool
}

// CallFrom returns the Call that ctx belongs to, if ctx is (derived from) the
// context given to fn by Do or DoTx.
func CallFrom(ctx context.Context) (Call, bool) {
	c, ok := ctx.Value(callCtxKey{}).(*callCtx)
	if !ok {
		return Call{}, false
	}
	return c.Call, true
}

// fnContext derives fn's context: ctx's values and deadline, the Call, and
// cancellation on Close.
func (e *Engine) fnContext(ctx context.Context, c *leading, inTx bool) (context.Context, func()) {
	ctx = context.WithValue(ctx, callCtxKey{}, &callCtx{
		Call: Call{Key: c.key, Attempt: c.attempt, Recovered: c.recovered}, e: e, inTx: inTx})
	ctx, cancel := context.WithCancel(ctx)
	unregister := context.AfterFunc(e.ctx, cancel)
	return ctx, func() { unregister(); cancel() }
}

// reentrant refuses, from the context fn was given, calls that would
// deadlock: any call from inside a DoTx fn (which holds the writer), and a
// call for the key whose fn is running. It is the cheap check, made before
// any read; a DoTx fn that passes another context is caught by the commit
// pipeline's Holding (a goroutine id read), checked only before a write and
// by the operator methods (enterOp), never on the replay path.
func (e *Engine) reentrant(ctx context.Context, key string) error {
	c, ok := ctx.Value(callCtxKey{}).(*callCtx)
	if !ok || c.e != e {
		return nil
	}
	if c.inTx {
		return errInsideDoTx
	}
	if c.Key == key {
		return errOwnKey
	}
	return nil
}

// The two re-entrances, each with its own text.
var (
	errInsideDoTx = fmt.Errorf("%w: called from inside a DoTx fn, which holds the file's single writer", ErrReentrant)
	errOwnKey     = fmt.Errorf("%w: fn called the engine with its own key", ErrReentrant)
)

// selfWait refuses a wait that would never end: on the flight of the fn that
// runs on this goroutine (a call with fn's own key, whatever its context), or
// from inside a DoTx fn, whose writer every leader needs. It is checked only
// before a wait, never on the replay path.
func (e *Engine) selfWait(f *flight) error {
	if e.pipe.Holding() {
		return errInsideDoTx
	}
	if r := f.runner.Load(); r != 0 && r == commit.GoroutineID() {
		return errOwnKey
	}
	return nil
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
		e.mu.Lock()
		e.closed = true
		e.mu.Unlock()
		e.cancel()
		go func() {
			e.calls.Wait()
			close(e.stopBg)
			e.bg.Wait()
			e.pipe.Stop()
			e.closeErr = e.db.Close()
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

// Get returns key's live record without side effects: no execution, no
// recovery, no lock. A key with no record, or an expired one, gives
// ErrNotFound; an undecodable one ErrCorrupt.
//
// Get, Forget and Resolve take any key an earlier version could store (1 to
// MaxKeyLen bytes of UTF-8), also one that Do now refuses for white space at
// an end or an invisible character, so such records stay reachable.
func (e *Engine) Get(key string) (*Record, error) {
	if err := validateStoredKey(key); err != nil {
		return nil, &OpError{Op: "get", Key: key, Err: err}
	}
	if err := e.enterOp(); err != nil {
		return nil, &OpError{Op: "get", Key: key, Err: err}
	}
	defer e.calls.Done()
	rec, err := e.load(key)
	if err != nil {
		return nil, opError("get", key, err)
	}
	if rec == nil {
		return nil, &OpError{Op: "get", Key: key, Err: ErrNotFound}
	}
	return rec, nil
}

// Forget deletes key's record in any state, so the next call runs fn as new.
// It fails with ErrInProgress while a call with the key runs, and with
// ErrNotFound if nothing is stored.
func (e *Engine) Forget(key string) error {
	return e.operate("forget", key, func(tx *bbolt.Tx) error {
		e.cache.forget(key) // under the key: no call can cache it again meanwhile
		found, err := e.st.deleteAll(tx, key)
		if err == nil && !found {
			err = ErrNotFound
		}
		return err
	})
}

// Resolve completes an interrupted execution by hand: key's started record
// becomes done with response and, if outcome is not nil, a stored *Error
// with outcome's Code and Message (its Replayed is ignored), as if fn had returned
// them. It fails with ErrNotFound if key has no live record, with ErrState if
// its record is done, and with ErrInProgress while a call with the key runs.
func (e *Engine) Resolve(key string, response []byte, outcome *Error) error {
	return e.operate("resolve", key, func(tx *bbolt.Tx) error {
		rec, err := e.st.lookup(tx, key, time.Time{})
		if err != nil {
			return err
		}
		if rec == nil || !e.live(rec, e.now()) {
			return ErrNotFound // an expired record is absent, as for Get
		}
		if rec.State != StateStarted {
			return fmt.Errorf("%w: the record is %s, only an interrupted execution can be resolved", ErrState, rec.State)
		}
		done := *rec
		done.State, done.CompletedAt, done.Response = StateDone, e.now(), response
		if outcome != nil {
			done.Err = &Error{Code: outcome.Code, Message: outcome.Message}
		}
		return e.st.put(tx, &done, rec)
	})
}

// operate runs an operator write on key while holding the key, so it never
// races a running call.
func (e *Engine) operate(op, key string, fn func(tx *bbolt.Tx) error) error {
	if err := validateStoredKey(key); err != nil {
		return &OpError{Op: op, Key: key, Err: err}
	}
	if err := e.enterOp(); err != nil {
		return &OpError{Op: op, Key: key, Err: err}
	}
	defer e.calls.Done()
	f, leader := e.locks.acquire(key, 0, e.now())
	if !leader {
		return &OpError{Op: op, Key: key, Err: ErrInProgress}
	}
	defer func() {
		f.again = true
		e.locks.release(key, f)
	}()
	if err := e.pipe.Do(fn); err != nil {
		return e.writeErr(op, key, err)
	}
	return nil
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
	s := Stats{
		Pruned: e.n.pruned.Load(), Replays: e.n.replays.Load(),
		Executions: e.n.executions.Load(), Conflicts: e.n.conflicts.Load(),
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
	defer e.calls.Done()
	var s FileStats
	now := e.now()
	err := e.db.View(func(tx *bbolt.Tx) error {
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
func (e *Engine) Records(fn func(r *Record, err error) error) error {
	if err := e.enterOp(); err != nil {
		return &OpError{Op: "records", Err: err}
	}
	defer e.calls.Done()
	now := e.now()
	var fnErr error // fn's own error, returned as it is
	err := e.db.View(func(tx *bbolt.Tx) error {
		return e.st.forEach(tx, func(r *Record, err error) error {
			if err == nil && !e.live(r, now) {
				return nil
			}
			if err != nil {
				err = opError("records", r.Key, err)
			}
			fnErr = fn(r, err)
			return fnErr
		})
	})
	if err != nil && err == fnErr {
		return err
	}
	return opError("records", "", err)
}

// View runs fn in a read-only bbolt transaction over the file, so a program
// reads the buckets its DoTx fns write (its orders, its balances) outside a
// call. Bytes read from the transaction point into the file's memory map:
// copy what you keep past fn. Reads run alongside calls; they do not dedupe
// anything. The engine's own bucket ("idem") is visible but is not an API.
func (e *Engine) View(fn func(tx *bbolt.Tx) error) error {
	if err := e.enterOp(); err != nil {
		return &OpError{Op: "view", Err: err}
	}
	defer e.calls.Done()
	return e.db.View(fn)
}

// Backup writes a consistent copy of the live file to w (bbolt's Tx.WriteTo,
// in a read transaction: calls go on meanwhile) and returns the bytes written.
func (e *Engine) Backup(w io.Writer) (int64, error) {
	if err := e.enterOp(); err != nil {
		return 0, &OpError{Op: "backup", Err: err}
	}
	defer e.calls.Done()
	var n int64
	err := e.db.View(func(tx *bbolt.Tx) error {
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

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}
