package core

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

// Defaults for the zero values of Options, as idem's Default* constants.
const (
	DefaultRetention       = 24 * time.Hour
	DefaultRetryAfter      = time.Second
	DefaultMaxResponseSize = 1 << 20
	DefaultPruneInterval   = time.Minute
)

// InFlightPolicy says what a call does while another call with the same key
// runs (idem.InFlightPolicy).
type InFlightPolicy uint8

const (
	// InFlightWait: wait for the running call and answer from its outcome.
	InFlightWait InFlightPolicy = iota
	// InFlightFail: fail at once with an *InProgressError.
	InFlightFail
)

// RecoveryPolicy says what to do with an interrupted execution
// (idem.RecoveryPolicy).
type RecoveryPolicy uint8

const (
	// RecoverReexecute runs fn again, with CallFrom's Recovered set.
	RecoverReexecute RecoveryPolicy = iota
	// RecoverRefuse returns ErrIncomplete until an operator resolves the key.
	RecoverRefuse
)

// Options are the engine settings every backend shares; each field means what
// the idem.Options field of the same name means, zero values included.
type Options struct {
	Retention        time.Duration
	InFlight         InFlightPolicy
	RetryAfter       time.Duration
	Recovery         RecoveryPolicy
	MaxResponseSize  int
	ReplayCacheBytes int
	Now              func() time.Time
	Logger           *slog.Logger
	Observer         Observer

	// PruneInterval is the period of the background pruner (Start); zero
	// means DefaultPruneInterval, negative disables it.
	PruneInterval time.Duration
	// Outbox configures the dispatcher (Start runs it if Outbox.Dispatch).
	Outbox OutboxOptions

	// Guard, if set, is checked by every call before it enters (Do, DoTx
	// and Enter, after the re-entrance checks): a non-nil error refuses the
	// call, wrapped in an *OpError. bbolt's refuses a call from inside a
	// Records, View or Messages callback, which holds a read transaction.
	Guard func() error
}

// Validate refuses settings that have no meaning, instead of reading them as
// a default: a negative Retention or RetryAfter, a policy value that is not
// one of the constants, and negative outbox counts and periods. Zero values
// and the negatives the fields document (PruneInterval, MaxResponseSize,
// ReplayCacheBytes, Outbox.MaxAttempts) are valid. The error wraps
// ErrOptions and names the field.
func (o Options) Validate() error {
	bad := func(field string, v any, rule string) error {
		return fmt.Errorf("%w: %s is %v; %s", ErrOptions, field, v, rule)
	}
	ob := o.Outbox
	switch {
	case o.Retention < 0:
		return bad("Retention", o.Retention, "zero means the default, a window cannot be negative")
	case o.RetryAfter < 0:
		return bad("RetryAfter", o.RetryAfter, "zero means the default, a wait cannot be negative")
	case o.InFlight > InFlightFail:
		return bad("InFlight", uint8(o.InFlight), "it must be InFlightWait or InFlightFail")
	case o.Recovery > RecoverRefuse:
		return bad("Recovery", uint8(o.Recovery), "it must be RecoverReexecute or RecoverRefuse")
	case ob.Workers < 0:
		return bad("Outbox.Workers", ob.Workers, "zero means the default")
	case ob.BaseBackoff < 0:
		return bad("Outbox.BaseBackoff", ob.BaseBackoff, "zero means the default")
	case ob.MaxBackoff < 0:
		return bad("Outbox.MaxBackoff", ob.MaxBackoff, "zero means the default")
	case ob.DeadLetterRetention < 0:
		return bad("Outbox.DeadLetterRetention", ob.DeadLetterRetention, "zero means the default")
	case ob.PollInterval < 0:
		return bad("Outbox.PollInterval", ob.PollInterval, "zero means the default")
	}
	return nil
}

// Result describes the answer of Do or DoTx (idem.Result). It is returned
// beside a non-nil error too.
type Result struct {
	Response    []byte
	Replayed    bool
	Attempt     int
	StartedAt   time.Time
	CompletedAt time.Time
}

// Counters are the engine's work since it started, for Stats.
type Counters struct {
	Replays, Executions, Conflicts, Pruned atomic.Uint64
}

// Engine is the state machine over one Backend. It is safe for concurrent
// use. T is the backend's DoTx transaction.
type Engine[T any] struct {
	b     Backend[T]
	info  Info
	opts  Options
	cache *replayCache
	locks *keyLocks
	ob    *Outbox[T]
	now   func() time.Time
	log   *slog.Logger

	// ctx is cancelled by Stop; every fn's context ends with it.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.RWMutex // guards closed against calls entering
	closed bool
	calls  sync.WaitGroup // calls in Do, DoTx and operator methods; the pruner and dispatchers

	pruneMu sync.Mutex // one prune at a time

	n Counters
}

// New returns an engine over b with the zero values of o replaced by their
// defaults. The engine does not close b: the caller does, after Stop and
// Wait.
func New[T any](b Backend[T], o Options) *Engine[T] {
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
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
		now: func() time.Time { return clock().Round(0) },
		log: o.Logger,
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.ob = newOutbox(e, o.Outbox)
	return e
}

// Start starts the engine's background work, unless the backend is read
// only: the pruner every PruneInterval (unless negative) and, if
// Outbox.Dispatch, the dispatcher. Both end with Stop; Wait waits for them.
// Call it once, after New.
func (e *Engine[T]) Start() {
	if e.info.ReadOnly {
		return
	}
	if every := cmp.Or(e.opts.PruneInterval, DefaultPruneInterval); every > 0 && e.enter() == nil {
		go func() {
			defer e.calls.Done()
			e.pruneLoop(every)
		}()
	}
	if e.opts.Outbox.Dispatch {
		go func() { _ = e.ob.Run(e.ctx) }() // Run registers itself, as a call
	}
}

// Options returns the engine's options, defaults filled in.
func (e *Engine[T]) Options() Options { return e.opts }

// Now reads the engine clock, monotonic reading stripped.
func (e *Engine[T]) Now() time.Time { return e.now() }

// clock reads the clock that judges the store's times (Backend, "Clocks"):
// the backend's (Info.Clock) if it has one, else the engine's.
func (e *Engine[T]) clock(ctx context.Context) (time.Time, error) {
	if c := e.info.Clock; c != nil {
		t, err := c(ctx)
		return t.Round(0), err
	}
	return e.now(), nil
}

// Counters returns the engine's counters; the caller may add to Pruned.
func (e *Engine[T]) Counters() *Counters { return &e.n }

// Backend returns the engine's backend.
func (e *Engine[T]) Backend() Backend[T] { return e.b }

// Stop refuses new calls (ErrClosed), cancels the contexts of running fns
// and ends the pruner and the dispatchers (their handlers' contexts too).
// Wait then waits for all of them. Stop is idempotent.
func (e *Engine[T]) Stop() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.cancel()
}

// Wait waits for the calls that entered before Stop, and for the background
// work Start started.
func (e *Engine[T]) Wait() { e.calls.Wait() }

// Done is closed by Stop.
func (e *Engine[T]) Done() <-chan struct{} { return e.ctx.Done() }

// Enter registers an operator call of the embedding engine (for its Stats,
// Backup, outbox methods): it fails with ErrReentrant from inside a DoTx fn,
// and with ErrClosed after Stop. Exit ends the call.
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

// guard runs Options.Guard.
func (e *Engine[T]) guard() error {
	if g := e.opts.Guard; g != nil {
		return g()
	}
	return nil
}

// Exit ends a call registered by Enter.
func (e *Engine[T]) Exit() { e.calls.Done() }

// enter registers a call, or fails after Stop.
func (e *Engine[T]) enter() error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return ErrClosed
	}
	e.calls.Add(1)
	return nil
}

// Live reports whether r is live at now: a started record kept until
// resolved, or any started record while this engine refuses, always; any
// other record inside the longer of the window it was written under and this
// engine's.
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

// ErrNilFn refuses a nil fn before anything is stored: running it would
// leave a started record for a function that never existed.
var ErrNilFn = errors.New("nil fn: Do and DoTx need a function to run")

// ErrInsideDoTx is ErrReentrant as returned from inside a DoTx fn, for the
// embedding engine's own checks.
var ErrInsideDoTx = errInsideDoTx

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

// CloneBytes copies b, keeping nil and empty apart.
func CloneBytes(b []byte) []byte { return cloneBytes(b) }
