package idemcore

import (
	"fmt"
	"log/slog"
	"time"
)

// Defaults for the zero values of Options.
const (
	// DefaultRetention is how long a record stays after it completes: Stripe
	// and the IETF Idempotency-Key draft both suggest at least 24 hours.
	DefaultRetention = 24 * time.Hour
	// DefaultPruneInterval is how often the background pruner runs.
	DefaultPruneInterval = time.Minute
	// DefaultRetryAfter is the wait an InProgressError suggests (Options.RetryAfter).
	DefaultRetryAfter = time.Second
	// DefaultMaxResponseSize is the largest response stored, in bytes (1 MiB).
	DefaultMaxResponseSize = 1 << 20
)

// InFlightPolicy says what a call does while another call with the same key
// runs.
type InFlightPolicy uint8

const (
	// InFlightWait: wait for the running call and answer from its outcome.
	InFlightWait InFlightPolicy = iota
	// InFlightFail: fail at once with an *InProgressError, which matches
	// ErrInProgress (the IETF draft's HTTP 409).
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
	// (Record.KeptUntilResolved), so a later open with RecoverReexecute, or
	// `idem prune`, keeps it too (and recovers it on the next call).
	RecoverRefuse
)

// Options are the engine's settings, the same for every backend: idem.Open
// and idempg.Open take them beside their backend's own. The zero value of
// every field means its default; a nil *Options means all defaults.
type Options struct {
	// Retention is the retention window, wall-clock: a record expires this long
	// after it completed (an orphaned started record, after it started). Zero
	// means DefaultRetention. It is a floor: space may be reclaimed later. It
	// is recorded with every record written (Record.Retention): a record
	// written under a longer window by an earlier open keeps that window, and
	// one written under a shorter window lives this one.
	Retention time.Duration

	// PruneInterval is the period of the background pruner. Zero means
	// DefaultPruneInterval; a negative value disables the pruner (call Prune).
	PruneInterval time.Duration

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
	// completed records that answers replays without reading the store
	// (keys, responses and error texts, plus 352 bytes an entry for the
	// record, its index and its queue slots, and 64 for a stored error). Zero
	// means DefaultReplayCacheBytes; negative disables the cache. Only an
	// engine whose process alone holds its store keeps one (the bbolt file):
	// on a store several processes share (idempg, Info.Shared), another
	// process's Forget or Resolve may change any record, so every replay
	// reads the database and this field is ignored.
	ReplayCacheBytes int

	// Now is the clock, for expiry and record times. Nil means time.Now. The
	// engine strips the monotonic reading of every time it reads
	// (t.Round(0)): stored records carry wall-clock times only, so records
	// in memory do too, and both compare alike across a step of the wall
	// clock. A backend shared by several processes judges by a clock they
	// share instead, and does not read Now for any of these (idempg: the
	// database's clock; the package documentation, "Backends and their
	// clocks").
	Now func() time.Time

	// Outbox configures the dispatcher of outbox messages.
	Outbox OutboxOptions

	// Logger receives the engine's own events (pruning, recovery) at debug
	// and warn level; keys and responses are never logged. Nil discards.
	Logger *slog.Logger

	// Observer receives the engine's events (executions, replays, commits,
	// outbox deliveries, ...) for metrics: see Observer. Nil means none, at
	// the cost of a nil check per event.
	Observer Observer

	// Tracer follows each call, each run of fn and each outbox delivery
	// attempt with a context (a span's): see Tracer. Nil means none, at the
	// cost of a nil check per call.
	Tracer Tracer
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

// WithDefaults returns o with the zero values of Retention, PruneInterval,
// RetryAfter, MaxResponseSize, Now and Logger replaced by their defaults (the
// ones a backend reads before New: the window it stores, the clock). The
// outbox's and the replay cache's are filled in by New.
func (o Options) WithDefaults() Options {
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.PruneInterval == 0 {
		o.PruneInterval = DefaultPruneInterval
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
	return o
}

// Defaults for the zero values of OutboxOptions, each named DefaultOutbox and
// its field.
const (
	// DefaultOutboxWorkers bounds the handlers running at once.
	DefaultOutboxWorkers = 16
	// DefaultOutboxBaseBackoff is the wait after a message's first failed attempt.
	DefaultOutboxBaseBackoff = time.Second
	// DefaultOutboxMaxBackoff caps the wait between two attempts.
	DefaultOutboxMaxBackoff = 10 * time.Minute
	// DefaultOutboxMaxAttempts is the number of failed attempts after which a
	// message becomes a dead letter. With the default backoff, the last
	// attempt comes between about 53 minutes and 1 hour 47 minutes after the
	// first.
	DefaultOutboxMaxAttempts = 20
	// DefaultOutboxDeadLetterRetention is how long a dead letter is kept.
	DefaultOutboxDeadLetterRetention = 7 * 24 * time.Hour
	// DefaultOutboxPollInterval is the longest the dispatcher sleeps while a
	// message waits for its backoff.
	DefaultOutboxPollInterval = time.Second
)

// OutboxOptions configure the outbox dispatcher. The zero value of every
// field means its default.
type OutboxOptions struct {
	// Dispatch starts the dispatcher when the engine opens, in the
	// background, until Close (never on a read-only store). False (the
	// default) leaves the messages in the store, for Engine.Dispatch, a
	// later open with Dispatch set, or `idem outbox`. The dispatcher
	// delivers the outbox's messages to their handlers, at least once each:
	//
	//   - In enqueue order per ordering key, one at a time: a message is
	//     handed to its handler only after the previous one of its ordering
	//     key was delivered and removed, or died. A message waiting for its
	//     retry, or for a handler, holds back the later ones of its key; a
	//     dead letter does not (they overtake it). Messages of different
	//     ordering keys run in parallel, up to Workers.
	//   - A handler's error retries the message after an exponential backoff
	//     with jitter (BaseBackoff, MaxBackoff); after MaxAttempts failed
	//     attempts it becomes a dead letter (Engine.Messages, RetryDead,
	//     DropDead).
	//   - A delivered message is removed in a commit of its own; if the
	//     process dies between the handler's return and that commit, the
	//     message is delivered again after the restart, with the same
	//     DownstreamKey.
	//
	// It wakes on every commit, so a message is dispatched right after the
	// DoTx that enqueued it commits. Close cancels the context of running
	// handlers and waits for them.
	Dispatch bool

	// Handlers are the handlers by topic at open (the map is copied;
	// Engine.Handle changes them later). Messages of a topic without a
	// handler wait in the outbox (OutboxStats.Waiting), holding back the
	// later messages of their ordering key, until a handler is registered.
	Handlers map[string]Handler

	// Workers bounds the handlers running at once (of different ordering
	// keys: the messages of one ordering key are delivered one at a time).
	// Zero means DefaultOutboxWorkers.
	Workers int

	// BaseBackoff is the wait after a message's first failed attempt; it
	// doubles after each further failure, up to MaxBackoff (raised to
	// BaseBackoff if lower). Each wait w is jittered uniformly into
	// [w/2, w). Wall-clock, measured with Options.Now. Zero means
	// DefaultOutboxBaseBackoff and DefaultOutboxMaxBackoff respectively.
	BaseBackoff, MaxBackoff time.Duration

	// MaxAttempts is the number of failed attempts after which a message
	// becomes a dead letter. Zero means DefaultOutboxMaxAttempts; a negative value
	// retries forever.
	MaxAttempts int

	// DeadLetterRetention is how long a dead letter is kept after it died
	// (wall-clock, Options.Now) before the pruner deletes it; like
	// Options.Retention it is a floor, and an expired dead letter is absent
	// to Messages and RetryDead at once. Zero means
	// DefaultOutboxDeadLetterRetention. It is recorded with each dead letter when it
	// dies (Message.DeadLetterRetention): a later open with a shorter one, or
	// `idem prune`, does not expire it early; a longer one lengthens it.
	DeadLetterRetention time.Duration

	// PollInterval is the longest the dispatcher sleeps (real time) while a
	// message waits for its backoff; it wakes at once on every commit (and,
	// on a store shared by processes, on their notifications). Zero means
	// DefaultOutboxPollInterval.
	PollInterval time.Duration
}
