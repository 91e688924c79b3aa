package idemcore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Result describes the answer of Do or DoTx. It is returned beside a non-nil
// error too.
type Result struct {
	// Response is fn's response (nil and empty differ): the caller whose fn
	// ran gets the slice fn returned (a copy for DoTx); every other caller
	// gets a copy of its own. A failed call carries no Response: beside an
	// error there is one only when it is the stored outcome's (fn returned
	// both a response and a permanent error, or a replay of such). After
	// Retryable, an interruption, ErrFenced, or a failed or unacknowledged
	// commit, fn's bytes are no stored outcome and are not returned; a retry
	// replays what was stored.
	Response []byte
	// Replayed is true when fn did not run in this call: the answer came
	// from the stored record, or from the concurrent call this one waited
	// for.
	Replayed bool
	// Attempt is the execution the answer comes from, starting at 1.
	Attempt int
	// StartedAt and CompletedAt are the record's times (engine clock);
	// CompletedAt is zero when no outcome was recorded.
	StartedAt   time.Time
	CompletedAt time.Time
}

// counters are the engine's work since it started, for Stats.
type counters struct {
	Replays, Executions, Conflicts, Pruned atomic.Uint64
}

// Engine is the state machine over one Backend: idem's engine, whichever
// the storage. It is safe for concurrent use. T is the transaction a DoTx fn
// receives from the backend (Backend.RunTx). A backend's package wraps it in
// an engine type of its own (idem.Engine over a bbolt file, idempg.Engine
// over Postgres), which forwards these methods and adds the backend's own.
type Engine[T any] struct {
	b     Backend[T]
	info  Info
	opts  Options
	cache *replayCache
	locks *keyLocks
	found foundRate // Do's recent findings, where the backend can claim first
	ob    *dispatcher[T]
	now   func() time.Time
	log   *slog.Logger

	// ctx is cancelled by Shutdown; every fn's context ends with it.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.RWMutex // guards closed against calls entering
	closed bool
	calls  sync.WaitGroup // calls in Do, DoTx and operator methods; the pruner and dispatchers

	pruneMu sync.Mutex // one prune at a time

	closing  sync.Once
	shutDone chan struct{} // closed once the backend is closed
	closeErr error

	n counters
}

// New returns an engine over b with the zero values of o replaced by their
// defaults (Options.WithDefaults, and the outbox's), and starts its
// background work, unless b is read only (Info.ReadOnly): the pruner every
// PruneInterval (unless negative) and, if Outbox.Dispatch, the dispatcher.
// Settings that fail Options.Validate give an error wrapping ErrOptions, and
// no engine. From then on the engine owns b: Shutdown closes it.
func New[T any](b Backend[T], o Options) (*Engine[T], error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.WithDefaults()
	handlers := o.Outbox.Handlers
	o.Outbox = o.Outbox.withDefaults()
	clock := o.Now
	info := b.Info()
	cacheBytes := cmp.Or(o.ReplayCacheBytes, DefaultReplayCacheBytes)
	if info.Shared || info.Clock != nil {
		// A shared store's records change under other processes (see
		// Info.Shared and replayCache), and an entry's expiry is the backend
		// clock's to judge, which costs what a Lookup costs.
		cacheBytes = 0
	}
	e := &Engine[T]{
		b:     b,
		info:  info,
		opts:  o,
		cache: newReplayCache(cacheBytes),
		locks: newKeyLocks(),
		// Records carry wall-clock times only: strip the monotonic reading.
		now:      func() time.Time { return clock().Round(0) },
		log:      o.Logger,
		shutDone: make(chan struct{}),
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.ob = newDispatcher(e, o.Outbox, handlers)
	e.start()
	return e, nil
}

// start starts the background work New describes.
func (e *Engine[T]) start() {
	if e.info.ReadOnly {
		return
	}
	if every := e.opts.PruneInterval; every > 0 && e.enter() == nil {
		go func() {
			defer e.calls.Done()
			e.pruneLoop(every)
		}()
	}
	if e.opts.Outbox.Dispatch {
		go func() { _ = e.ob.run(e.ctx) }() // run registers itself, as a call
	}
}

// Retention is the retention window the engine was opened with, wall-clock:
// how long a completed record is replayed.
func (e *Engine[T]) Retention() time.Duration { return e.opts.Retention }

// Close is Shutdown without a deadline.
func (e *Engine[T]) Close() error { return e.Shutdown(context.Background()) }

// Shutdown closes the engine: new calls fail with ErrClosed, the contexts
// given to running fns and handlers are cancelled, and Shutdown waits for
// running calls, the pruner and the dispatcher, then closes the backend and
// returns its error. If ctx ends first, Shutdown returns ctx.Err() and the
// engine finishes closing in the background when the last call returns. It
// is idempotent: later calls wait the same way and return the first close's
// result.
func (e *Engine[T]) Shutdown(ctx context.Context) error {
	e.closing.Do(func() {
		e.mu.Lock()
		e.closed = true
		e.mu.Unlock()
		e.cancel()
		go func() {
			e.calls.Wait() // the calls, the pruner and the dispatcher
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

// The methods below are for the engine type of a backend's package, which
// wraps this one: its own operator calls (bbolt's ScanFile, View, Backup)
// register as calls of the engine, read its clock, and judge records by its
// rules.

// Options returns the engine's options, defaults filled in (the outbox's
// too, but Handlers, which Handler reads).
func (e *Engine[T]) Options() Options { return e.opts }

// Now reads the engine clock (Options.Now), monotonic reading stripped.
func (e *Engine[T]) Now() time.Time { return e.now() }

// clock reads the clock that judges the store's times (the package documentation, "Backends and their clocks"):
// the backend's (Info.Clock) if it has one, else the engine's.
func (e *Engine[T]) clock(ctx context.Context) (time.Time, error) {
	if c := e.info.Clock; c != nil {
		t, err := c(ctx)
		return t.Round(0), err
	}
	return e.now(), nil
}

// Enter registers a call of the wrapping engine's own, so that Shutdown
// waits for it: it fails with ErrReentrant from inside a DoTx fn, with
// ErrClosed after Shutdown, and with the error of Backend.Guard. Exit ends
// the call.
func (e *Engine[T]) Enter() error {
	if e.b.Holding() {
		return errInsideDoTx
	}
	if err := e.enter(); err != nil {
		return err // closed first, as for Do
	}
	if err := e.guard(); err != nil {
		e.calls.Done()
		return err
	}
	return nil
}

// guard is Backend.Guard, checked by every call as it enters.
func (e *Engine[T]) guard() error { return e.b.Guard() }

// Exit ends a call registered by Enter.
func (e *Engine[T]) Exit() { e.calls.Done() }

// enter registers a call, or fails after Shutdown.
func (e *Engine[T]) enter() error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return ErrClosed
	}
	e.calls.Add(1)
	return nil
}

// Live reports whether r is live at now for this engine: a started record
// kept until resolved, or any started record while this engine refuses
// (RecoverRefuse), always; any other record until Expiry(r, the engine's
// Retention). Every reader treats a record that is not live as absent.
func (e *Engine[T]) Live(r *Record, now time.Time) bool {
	if r.State == StateStarted && (r.KeptUntilResolved || e.opts.Recovery == RecoverRefuse) {
		return true
	}
	return now.Before(Expiry(r, e.opts.Retention))
}

func (e *Engine[T]) live(r *Record, now time.Time) bool { return e.Live(r, now) }

// The two re-entrances, each with its own text.
var (
	errInsideDoTx = fmt.Errorf("%w: called from inside a DoTx fn, which holds the file's single writer", ErrReentrant)
	errOwnKey     = fmt.Errorf("%w: fn called the engine with its own key", ErrReentrant)
)

// errNilFn refuses a nil fn before anything is stored: running it would
// leave a started record for a function that never existed.
var errNilFn = errors.New("nil fn: Do and DoTx need a function to run")

// errRedecide tells the leader's decision loop that the backend's answer
// changed what it knows of the key (a claim raced another process): decide
// again from leading.current.
var errRedecide = errors.New("idem: decide again")

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}
