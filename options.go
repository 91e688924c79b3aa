package idem

// Options and the policies: the engine's settings, every backend's, and the
// bbolt file's (BoltOptions).

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/internal/bridge"
	"github.com/idemkit/idem/internal/core"
)

// Defaults for the zero values of Options.
const (
	// MaxKeyLen is the longest idempotency key in bytes: Stripe's limit of 255
	// characters, counted in bytes of UTF-8.
	MaxKeyLen = core.MaxKeyLen
	// DefaultRetention is how long a record stays after it completes: Stripe
	// and the IETF Idempotency-Key draft both suggest at least 24 hours.
	DefaultRetention = 24 * time.Hour
	// DefaultPruneInterval is how often the background pruner runs.
	DefaultPruneInterval = time.Minute
	// DefaultLockTimeout bounds how long Open waits for the file lock.
	DefaultLockTimeout = time.Second
	// DefaultRetryAfter is the wait an InProgressError suggests (Options.RetryAfter).
	DefaultRetryAfter = time.Second
	// DefaultReplayCacheBytes bounds the memory of the replay cache: 16 MiB of
	// recently completed records (their keys, responses and errors).
	DefaultReplayCacheBytes = core.DefaultReplayCacheBytes
	// DefaultMaxResponseSize is the largest response stored, in bytes (1 MiB).
	DefaultMaxResponseSize = 1 << 20
)

// InFlightPolicy says what a call does while another call with the same key
// runs in this process.
type InFlightPolicy = core.InFlightPolicy

const (
	// InFlightWait: wait for the running call and answer from its outcome.
	InFlightWait = core.InFlightWait
	// InFlightFail: fail at once with ErrInProgress (the IETF draft's HTTP 409).
	InFlightFail = core.InFlightFail
)

// RecoveryPolicy says what to do with an interrupted execution: a started
// record that no live call owns, after which fn may or may not have had its
// effect.
type RecoveryPolicy = core.RecoveryPolicy

const (
	// RecoverReexecute runs fn again (at-least-once). fn sees CallFrom(ctx)
	// with Recovered set and the attempt number, so it can reconcile with the
	// downstream system, passing the same key on.
	RecoverReexecute = core.RecoverReexecute
	// RecoverRefuse returns ErrIncomplete until an operator resolves the key
	// (Engine.Resolve, Engine.Forget, or `idem resolve`). Such records never
	// expire: each started record is written marked kept until resolved
	// (Record.KeptUntilResolved), so a later Open with RecoverReexecute, or
	// `idem prune`, keeps it too (and recovers it on the next call).
	RecoverRefuse = core.RecoverRefuse
)

// Options configure an engine: the engine's settings, the same for every
// backend (idempg.Open takes them too), and, in Bolt, the bbolt file's, which
// only Open reads. The zero value of every field means its default; a nil
// *Options means all defaults.
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
	// means DefaultReplayCacheBytes; negative disables the cache. Only an
	// engine whose process alone holds its store keeps one (this package's
	// bbolt file): on a store several processes share (idempg), another
	// process's Forget or Resolve may change any record, so every replay
	// reads the database and this field is ignored.
	ReplayCacheBytes int

	// Now is the clock, for expiry and record times. Nil means time.Now. The
	// engine strips the monotonic reading of every time it reads
	// (t.Round(0)): records in the file carry wall-clock times only, so
	// records in memory do too, and both compare alike across a step of the
	// wall clock. A backend shared by several processes judges by a clock
	// they share instead, and does not read Now for any of these (idempg:
	// the database's clock).
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

	// Bolt holds the settings of the bbolt file, read only by Open; the
	// fields above are the engine's, the same for every backend (a backend
	// with a store of its own, such as idempg, takes *Options for them and
	// refuses a non-zero Bolt).
	Bolt BoltOptions
}

// BoltOptions are the settings of the bbolt file that Open opens, beside the
// engine's in Options. The zero value of every field means its default.
type BoltOptions struct {
	// LockTimeout bounds the wait for the file lock, held by any other Open of
	// the file, in this process or another. Zero means DefaultLockTimeout. The
	// error then matches bbolt's errors.ErrTimeout.
	LockTimeout time.Duration

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
}

// Result describes the answer of Do or DoTx. It is returned beside a non-nil
// error too. Response is fn's response (nil and empty differ): the caller
// whose fn ran gets the slice fn returned (a copy for DoTx); every other
// caller gets a copy of its own. A failed call carries no Response: beside an
// error there is one only when it is the stored outcome's (fn returned both
// a response and a permanent error, or a replay of such). After Retryable,
// an interruption, ErrFenced, or a failed or unacknowledged commit, fn's
// bytes are no stored outcome and are not returned; a retry replays what was
// stored. Replayed is true when fn did not run in this call: the answer came
// from the stored record, or from the concurrent call this one waited for.
// Attempt is the execution the answer comes from, starting at 1. StartedAt
// and CompletedAt are the record's times (engine clock). The type is the
// state machine's (internal/core), shared by every backend.
type Result = core.Result

func init() { bridge.EngineOptions = engineOptions }

// engineOptions returns the engine settings of o (nil for defaults) as the
// state machine takes them: the one conversion, for every backend (idempg
// reaches it through internal/bridge). The zero values stay zero; core.New
// fills in the defaults, which are the Default* constants here.
func engineOptions(o *Options) core.Options {
	if o == nil {
		return core.Options{}
	}
	return core.Options{
		Retention: o.Retention, InFlight: o.InFlight, RetryAfter: o.RetryAfter, Recovery: o.Recovery,
		MaxResponseSize: o.MaxResponseSize, ReplayCacheBytes: o.ReplayCacheBytes,
		Now: o.Now, Logger: o.Logger, Observer: o.Observer,
		PruneInterval: o.PruneInterval, Outbox: core.OutboxOptions(o.Outbox),
	}
}

// validateOptions refuses o's settings that have no meaning (see
// core.Options.Validate), and the bbolt file's: a negative Bolt.LockTimeout
// or Bolt.InitialMmapSize. The error wraps ErrOptions.
func validateOptions(o *Options) error {
	if err := engineOptions(o).Validate(); err != nil {
		return err
	}
	switch {
	case o.Bolt.LockTimeout < 0:
		return fmt.Errorf("%w: Bolt.LockTimeout is %v; zero means the default, a wait cannot be negative", ErrOptions, o.Bolt.LockTimeout)
	case o.Bolt.InitialMmapSize < 0:
		return fmt.Errorf("%w: Bolt.InitialMmapSize is %d; zero means bbolt's default", ErrOptions, o.Bolt.InitialMmapSize)
	}
	return nil
}
