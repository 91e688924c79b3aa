package idemcore

import (
	"context"
	"fmt"
	"time"
)

// Backend is the storage of one engine: its records (Records), its outbox
// (Outbox) and its waits for other processes (Waiter), split by role as
// River's riverdriver splits Driver, Executor and Listener. T is the
// transaction a DoTx fn receives: *idem.Tx (a bbolt write transaction) for
// the bbolt engine, pgx.Tx for idempg's. Each implementation pins itself
// with
//
//	var _ idemcore.Backend[*idem.Tx] = (*boltBackend)(nil)
//
// and runs the suites of github.com/idemkit/idem/idemtest, which take any
// Backend: Run (the contract, through an engine) and RunBackend (this
// interface, driven directly). A backend outside this module may implement
// it; the interface may grow between minor versions of this module (as
// riverdriver's does), with the change in its CHANGELOG.
//
// The engine calls a Backend only for storage and owns every decision: what
// a record means, when fn runs, what is recorded. Which calls may overlap,
// and which clock judges which time (Info.Clock), is in the package
// documentation ("Backends and their clocks").
//
// Errors: a Backend wraps the sentinels of this package where the method
// says (ErrNotFound, ErrCorrupt, ErrFenced, ErrClaimTaken, ...); any other
// error is a storage failure that the engine returns inside an *OpError.
// After Close every method may fail.
type Backend[T any] interface {
	Records[T]
	Outbox[T]
	Waiter

	// Info describes the backend; it is called once, by New.
	Info() Info

	// Guard is called as every call enters the engine (Do, DoTx, the
	// operator and outbox calls, and Engine.Enter), after the re-entrance
	// checks: a non-nil error refuses the call, wrapped in an *OpError, and
	// nothing is read or written. bbolt refuses a call from inside a
	// Records, View or Messages callback, which holds a read transaction
	// (ErrReentrant), and every call after a failed commit
	// (ErrStorageFailed). A backend without such states returns nil. It is
	// called on the replay path, so it must be cheap.
	Guard() error

	// Close releases the backend's resources (bbolt: the file and its
	// lock; Postgres: its connections, unless the pool was given). The
	// engine calls it once, from Shutdown, after the last call returned,
	// and returns its error.
	Close() error
}

// Records is the part of a Backend that stores idempotency records: their
// lookup, the ownership rule, claims and their renewal, completion and
// release, DoTx's transaction, the operator's writes, pruning and scans.
type Records[T any] interface {
	// Lookup returns the stored record of q.Key, or nil if none is stored,
	// without judging expiry (the engine does, with Engine.Live at at). at
	// is the reading of the backend's clock at the read (Info.Clock set:
	// Postgres, the SELECT's own), or zero (the engine judges at q.Now).
	// When q.CheckFingerprint is set and the stored record is done, has
	// another fingerprint than q.Fingerprint and completed less than
	// q.Retention before q.Now (before the backend's clock's now, with
	// Info.Clock), Lookup may return ErrFingerprintMismatch, unwrapped,
	// without decoding the record (bbolt peeks at the header only: the
	// refused response is never copied). A record that fails to decode
	// gives an error wrapping ErrCorrupt and naming the key.
	//
	// It is the replay path's only storage call: bbolt answers it from one
	// read transaction, Postgres from one SELECT by key.
	Lookup(ctx context.Context, q Lookup) (rec *Record, at time.Time, err error)

	// Owner says whether rec, a started record of rec.Key as Lookup
	// returned it, is held by a live owner: the ownership rule, asked by
	// the engine's leader for the key before it refuses (RecoverRefuse) or
	// waits. bbolt: always Orphan (one process holds the file, and the
	// engine holds the key, so no live call owns it: instant recovery).
	// Postgres: Owned while the record's lease has not lapsed by the
	// database's now(). Owner takes nothing over; Claim does.
	Owner(ctx context.Context, rec *Record) (Ownership, error)

	// Claim takes the key of req.Started for a Do call: it stores
	// req.Started (state started, attempt and times set by the engine;
	// with Info.Clock, StartedAt stamped by the backend's clock and set in
	// req.Started) durably before fn runs, and returns the claim with a
	// fencing token greater than every earlier claim of the key.
	//
	// With req.Prev nil the key must have no live record: bbolt writes
	// (the engine holds the key); Postgres inserts, and answers
	// ClaimChanged with the record found if another process got there
	// first, or ClaimOwned if another process's transaction holds the
	// key's row uncommitted (a DoTx; no record to show: the engine waits
	// or refuses as for an owned one). With req.Prev set (an interrupted execution as Lookup
	// returned it, identified by its Attempt and StartedAt) Claim takes it
	// over: only if it is still the stored version and it is an orphan by
	// Owner's rule; else ClaimOwned (with the Ownership) or ClaimChanged
	// (with the record now stored). The taken-over record is replaced; the
	// engine restores it through Release if fn never starts.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)

	// Renew extends c's lease while fn runs. The engine calls it every
	// Info().Heartbeat (never, when that is zero: bbolt) and, if it fails
	// (ErrFenced, or a storage error until the lease lapses), cancels fn's
	// context with cause ErrLeaseLost. It updates c.LeaseUntil.
	Renew(ctx context.Context, c *Claim) error

	// Complete replaces c's started record by done (state done, response,
	// error and CompletedAt set by the engine; with Info.Clock, CompletedAt
	// stamped by the backend's clock and set in done), fenced: if the key's
	// current claim is no longer c (another owner took it over), nothing
	// is written and the error wraps ErrFenced. A storage error leaves the
	// outcome unknown to the engine: it treats the key as interrupted.
	// (Postgres resolves an ambiguous COMMIT by reading the record back by
	// c.Token, never by writing again.)
	Complete(ctx context.Context, c *Claim, done *Record) error

	// Release gives c's key back without an outcome: fn was never started
	// (the caller's context ended first) or promised it had no effect
	// (Retryable). With restore nil the started record is deleted and the
	// key is free; else restore (the interrupted execution c took over,
	// c.Prev) is stored back as it was. Fenced like Complete. The engine
	// also passes c's own started record as restore (window and mark as
	// the claim stored them) to end c's lease at once after fn ended
	// without an outcome in a live process (it panicked, or its context
	// ended): the record stays an interrupted execution, with a lapsed
	// lease and a token no claim holds.
	Release(ctx context.Context, c *Claim, restore *Record) error

	// RunTx runs fn inside the backend's own write transaction, for DoTx:
	// fn (the engine's wrapper of the user's fn) receives the transaction T,
	// and returns the done record to store in it, or an error. On (done,
	// nil) the backend stores done in T and commits fn's writes and done
	// together, or nothing (with Info.Clock, done's StartedAt is the
	// backend's stamp of the claim, c.Started's or the one it makes in T,
	// and its CompletedAt the stamp of the done write, both set in done);
	// on (nil, err) it rolls T back and returns err
	// itself (unwrapped: the engine matches its own values). The engine's
	// wrapper recovers a panic of the user's fn itself (as a *PanicError it
	// re-raises in DoTx's caller, wherever fn ran: bbolt may run it on its
	// committer goroutine), so a panic that reaches the backend is its own:
	// nothing commits and RunTx returns it as an error. If fn calls
	// runtime.Goexit on a goroutine of the backend's, RunTx returns an error
	// (ErrGoexit; bbolt: its pipeline's own); on the caller's goroutine, the engine's
	// deferred handlers see it.
	//
	// c.Token zero asks the backend to claim the key inside T before fn
	// runs (the engine found it free): bbolt needs nothing (the engine's
	// per-key lock and the file's single writer exclude every other
	// writer), Postgres inserts a started row in T, which makes another
	// process's claim of the key wait for T's end, and returns
	// ErrClaimTaken without running fn if a live record is there. A
	// non-zero c.Token is a claim from Claim (a recovering DoTx commits its
	// started record first, as Do does): done replaces c.Started, fenced
	// like Complete.
	//
	// fn may be called more than once: bbolt with its journal off shares
	// one transaction among concurrent calls (group commit) and has no
	// savepoints, so when another call's fn fails the transaction is rolled
	// back and fn runs again in a new one (at most 3 times per call); the
	// last run's result counts. bbolt's journal keeps each fn's writes
	// apart and runs fn once (again only after another fn of its group
	// called runtime.Goexit); Postgres runs fn once, under a savepoint.
	RunTx(ctx context.Context, c *Claim, fn func(tx T) (*Record, error)) error

	// Holding reports whether the calling goroutine runs inside a RunTx fn
	// of this backend, where a call into the engine would wait for the
	// transaction it runs in (bbolt: the file's single writer). The engine
	// then fails the call with ErrReentrant. A backend without that hazard
	// returns false. It is called before every write, so it must be cheap.
	Holding() bool

	// Forget deletes every stored version of key, in any state, and
	// reports whether there was one. The engine holds the key meanwhile. A
	// started record that a live owner elsewhere holds (Owner's rule:
	// Postgres, an unlapsed lease of another engine) is not deleted: the
	// error wraps ErrInProgress, as the engine answers for its own running
	// calls.
	Forget(ctx context.Context, key string) (found bool, err error)

	// Resolve runs fn on key's stored record (nil if none) inside one write
	// transaction and stores the record fn returns in its place, as it is
	// (times included: with Info.Clock the engine reads that clock first),
	// for the operator's Resolve; an error from fn writes nothing and is returned
	// as is. A backend shared by processes locks the row meanwhile, and
	// refuses a started record that a live owner elsewhere holds (Owner's
	// rule) without calling fn: the error wraps ErrInProgress.
	Resolve(ctx context.Context, key string, fn func(cur *Record) (*Record, error)) error

	// Prune deletes expired records at req.Now in bounded batches (at most
	// req.Limit records per write transaction, so writers are never held
	// long) until none is left or ctx ends, and returns how many it deleted
	// and, in Interrupted, how many of those were started records (the
	// engine logs those: evidence of unknown outcomes dropped). A record is
	// expired when req.Expired(r): outside the window at req.Now and, if
	// req.KeepStarted (the engine refuses interrupted executions), not
	// started. bbolt drops whole time slots; Postgres deletes by an expiry
	// index.
	Prune(ctx context.Context, req PruneRequest) (PruneResult, error)

	// Scan calls fn for every stored record, expired ones included, in one
	// consistent snapshot (bbolt: one read transaction, slot by slot from
	// the oldest, by key within a slot; Postgres: one REPEATABLE READ
	// transaction, by key). A record that fails to decode is passed as a
	// Record with only Key set, beside an error wrapping ErrCorrupt. An
	// error from fn stops the walk and is returned.
	Scan(ctx context.Context, fn func(r *Record, err error) error) error
}

// Outbox is the part of a Backend that stores outbox messages: enqueued in
// DoTx's transaction, claimed by the engine's dispatcher, moved on after
// each delivery attempt, and the dead letters.
type Outbox[T any] interface {
	// Enqueue stores m (Seq zero; the other fields set by the engine) as a
	// pending outbox message in tx, which must be a transaction of this
	// backend's RunTx: it commits with fn's writes and the done record, or
	// not at all. It sets m.Seq (and, with Info.Clock, stamps EnqueuedAt by
	// its clock and sets it in m).
	Enqueue(tx T, m *Message) error

	// Committed returns the channel that wakes the engine's dispatcher: the
	// backend sends on it after every commit that may have enqueued outbox
	// messages (Postgres also on a NOTIFY from another process), without
	// blocking (capacity 1; a send that finds it full is dropped, the
	// dispatcher being due to look anyway). The engine calls it once, in
	// New, and only receives: the backend never calls the engine.
	Committed() <-chan struct{}

	// ClaimDue claims up to limit due heads for the engine's dispatcher: for
	// each ordering key, its pending message of lowest Seq, if
	// NextAttemptAt is zero or not after now (the engine clock's reading;
	// with Info.Clock, the backend's clock at the claim instead), and if no
	// dispatcher holds it.
	// Only a head is claimable, so the messages of one ordering key are
	// delivered one at a time, in enqueue order. A claim holds until
	// Delivered or Failed for the message (Failed with the message as
	// claimed gives the claim back unchanged); Postgres claims with FOR
	// UPDATE SKIP LOCKED and a lease (several processes drain one outbox at
	// least once; a lapsed claim is claimed again), bbolt has one dispatcher
	// per file and claims in memory (its index of pending messages).
	//
	// A pending message that fails to decode is never returned: the backend
	// moves it, as it is, to the dead letters (where Messages reports it with
	// ErrCorrupt and DropDead deletes it), so it holds nothing back, and
	// lists its Seq in Due.Quarantined for the engine to log. Due.Next, if
	// the backend knows it, is the earliest NextAttemptAt after now among
	// heads not claimed: the dispatcher wakes then (a backend with
	// Info.Clock leaves it zero: the engine's clock cannot be compared with
	// it).
	ClaimDue(ctx context.Context, now time.Time, limit int) (Due, error)

	// RenewClaim extends, by one lease, the claim of message m, claimed by
	// ClaimDue, whose handler still runs: the dispatcher calls it every
	// Info().ClaimRenew while a handler runs, so that a handler slower than
	// the lease is not delivered again meanwhile, and ends the handler's
	// context at the claim's end as last renewed. It returns that new end,
	// stamped as Due.ClaimUntil is (zero for a backend whose claims never
	// lapse: bbolt). A claim that is no longer this dispatcher's (lapsed,
	// taken by another, or the message gone) is not renewed: the error
	// wraps ErrFenced.
	RenewClaim(ctx context.Context, m *Message) (time.Time, error)

	// Delivered deletes pending message m, claimed by ClaimDue, after its
	// handler succeeded, or returns an error wrapping ErrMessageNotFound if
	// it is gone. On another error the message stays claimed; the engine
	// then gives it back with Failed.
	Delivered(ctx context.Context, m *Message) error

	// Failed stores m back after a failed delivery, with the fields the
	// engine updated (Failures, LastError, NextAttemptAt; with Info.Clock,
	// its times are that clock's, read by the engine first), and ends its
	// claim; if m.Dead is set (DeadAt and DeadLetterRetention with it) it
	// moves m to the dead letters instead. An error wraps ErrMessageNotFound
	// if m is gone. Even when it fails otherwise, a backend whose claims are
	// in memory (bbolt) ends the claim, with m.NextAttemptAt, so that the
	// message is claimed again after it. A backend whose claims lapse
	// (Postgres) writes only while m's claim is still the stored one: once it
	// lapsed and was taken since (by another dispatcher, and maybe retried
	// from the dead letters by an operator), Failed writes nothing and wraps
	// ErrMessageNotFound, so a late failure never undoes what the store now
	// holds.
	Failed(ctx context.Context, m *Message) error

	// Messages calls fn for every pending message by Seq, then every dead
	// letter by Seq, in one snapshot, expired dead letters included (the
	// engine filters). An undecodable one is passed as a Message with only
	// Seq (and Dead) set beside an error wrapping ErrCorrupt. An error from
	// fn stops the walk and is returned.
	Messages(ctx context.Context, fn func(m *Message, err error) error) error

	// RetryDead moves dead letter seq back to the pending messages in one
	// write transaction: revive receives it and resets it (an error from
	// revive, such as ErrNotFound for an expired one, writes nothing and is
	// returned). A missing seq gives an error wrapping ErrNotFound.
	RetryDead(ctx context.Context, seq uint64, revive func(m *Message) error) error

	// DropDead deletes dead letter seq, or returns an error wrapping
	// ErrNotFound.
	DropDead(ctx context.Context, seq uint64) error

	// PruneDead deletes dead letters for which expired is true, at most
	// limit per write transaction, until none is left or ctx ends, and
	// returns how many it deleted.
	PruneDead(ctx context.Context, expired func(m *Message) bool, limit int) (int, error)
}

// Waiter is the part of a Backend that waits for a record that another
// process holds to change.
type Waiter interface {
	// WaitChange blocks until key's record may have changed (Postgres:
	// LISTEN/NOTIFY, else one poll period, Info().Poll), or ctx ends (it
	// then returns ctx.Err()). The engine calls it between Lookups while a
	// live owner elsewhere holds the key under InFlightWait. A backend
	// whose Owner never answers Owned may just sleep Info().Poll.
	WaitChange(ctx context.Context, key string) error
}

// Info describes a Backend to the engine.
type Info struct {
	// Name names the backend in logs and errors: "bbolt", "postgres".
	Name string
	// Heartbeat is the period of Renew while fn runs; zero means claims
	// never need renewal (bbolt).
	Heartbeat time.Duration
	// Poll is the longest WaitChange blocks without a notification, and the
	// RetryAfter hint floor for a key owned elsewhere; zero means Owner
	// never answers Owned (bbolt).
	Poll time.Duration
	// ReadOnly is set when every write fails (bbolt's read-only open): the
	// engine starts no pruner and no dispatcher.
	ReadOnly bool
	// Shared is set when engines in several processes use the storage at
	// once (Postgres): another process's Forget or Resolve may change any
	// record at any time, so the engine answers no replay from its memory
	// (it keeps no replay cache) and every replay reads the backend (one
	// Lookup). False: one process holds the storage (bbolt's file lock).
	Shared bool
	// PruneBatch is the Limit the engine passes to Prune and PruneDead: the
	// most records, or dead letters, deleted per write transaction. Zero
	// means PruneBatch (the package's constant).
	PruneBatch int
	// ClaimTimeout bounds each ClaimDue, which the dispatcher runs without
	// its own context's cancellation (a claim that committed but whose
	// answer was dropped would hold its messages for a lease); zero means
	// no bound (bbolt claims in memory).
	ClaimTimeout time.Duration
	// ClaimRenew is how often the dispatcher renews the claims of the
	// messages whose handlers run (RenewClaim); zero means claims never
	// lapse (bbolt).
	ClaimRenew time.Duration
	// Clock, if set, reads the backend's clock (Postgres: the database's,
	// one round trip), wall-clock time without a monotonic reading: the
	// clock that judges retention, liveness, pruning and the outbox's times
	// for every process sharing the store (package documentation, "Backends
	// and their clocks"). nil: the
	// engine's clock judges (bbolt: one process holds the store).
	Clock func(ctx context.Context) (time.Time, error)
	// Transient, if set, reports whether an error a DoTx fn returned came
	// from its database meaning "try again" (Postgres: lock_timeout,
	// serialization failure, deadlock). The engine then treats it as
	// Retryable: the transaction rolls back and no outcome is stored. nil:
	// none is (bbolt).
	Transient func(err error) bool
	// Commits, if set, returns the commits the backend made and the writes
	// they carried since it opened, for Engine.Stats (bbolt: its group
	// commit's counts). nil: Stats reports zero.
	Commits func() (commits, writes uint64)
	// Replayed is the writes the backend replayed from its journal when it
	// opened (bbolt's write-ahead journal), for Stats.Replayed.
	Replayed uint64
	// ClaimFirst is set when Claim with a nil Prev reads the key's record
	// itself, in the statement that claims: on a live record (of any state
	// and fingerprint) it writes nothing and answers ClaimChanged with it,
	// and a record outside its window it replaces. Do's leader then claims
	// without a Lookup first: one round trip per fresh key instead of two
	// (Postgres), and a replay is the claim's read. DoTx's leader too runs
	// RunTx with a free key's claim (Token zero) without a Lookup first,
	// relying on RunTx's ErrClaimTaken for a live record (then it looks the
	// key up). Either goes back to a Lookup first while most recent calls
	// find a record. False: Do and DoTx look the key up first and claim only
	// a key they found free (bbolt, whose Lookup is in memory).
	ClaimFirst bool
}

// Due is the answer of a Backend.ClaimDue.
type Due struct {
	// Messages are the claimed heads, by Seq.
	Messages []*Message
	// Quarantined are the Seqs of pending messages that failed to decode
	// and were moved to the dead letters as they were.
	Quarantined []uint64
	// Next is the earliest NextAttemptAt after now among the heads not
	// claimed, zero if none or unknown (Postgres): the dispatcher sleeps
	// until then at most (and at most its PollInterval).
	Next time.Time
	// ClaimUntil is when the claims of Messages lapse unless renewed, by
	// this process's clock with its monotonic reading (a local reading
	// taken before the claim was sent, plus the lease left as the backend
	// measured it, so never later than the lapse by the backend's clock):
	// the handlers' contexts end then. Zero if claims never lapse (bbolt).
	ClaimUntil time.Time
}

// Lookup is a Backend.Lookup request.
type Lookup struct {
	// Key is the idempotency key, as the caller gave it.
	Key string
	// Now is the engine clock's reading for the call (a backend with
	// Info.Clock reads its own).
	Now time.Time
	// Retention is the engine's retention window (Options.Retention).
	Retention time.Duration
	// Fingerprint is the call's 64-bit fingerprint hash; it is compared
	// only when CheckFingerprint is set.
	Fingerprint      uint64
	CheckFingerprint bool
}

// Fence is a fencing token: each claim of a key gets one greater than every
// earlier claim's, so a write carrying a stale one is refused (ErrFenced).
// bbolt's is the claim's attempt (one process, claims of a key in order);
// Postgres's is a per-key counter in the row, bumped by every claim.
type Fence uint64

// Claim is a key held by this engine for one execution, from Claim (or from
// the engine, Token zero, for RunTx to claim inside its transaction).
type Claim struct {
	// Key and Fingerprint are the call's.
	Key         string
	Fingerprint uint64
	// Token is the claim's fencing token; zero for a claim RunTx makes in
	// its transaction.
	Token Fence
	// Started is the started record the claim stored (nil for Token zero).
	Started *Record
	// Prev is the interrupted execution the claim took over, nil if none.
	Prev *Record
	// LeaseUntil is when the claim lapses unless renewed, by this process's
	// clock with its monotonic reading: a local reading taken before the
	// claim (or the renewal) was sent, plus the lease left as the backend
	// measured it, so never later than the lapse by the backend's clock.
	// fn's context ends then. Zero if it never lapses (bbolt).
	LeaseUntil time.Time
	// Trace is the trace context a DoTx call's Tracer gives its messages
	// (Tracer.MessageTrace, at most MaxMessageTrace bytes), nil if none:
	// the backend stores it as Message.Trace of each message the call's fn
	// enqueues.
	Trace []byte
}

// ClaimRequest is a Backend.Claim request.
type ClaimRequest struct {
	// Started is the started record to store: Key, Fingerprint, Attempt,
	// StartedAt, Retention (the engine's window) and KeptUntilResolved (set
	// under RecoverRefuse) set by the engine. When Prev is set the backend
	// stores the longer of the two windows, and the mark if either has it:
	// a recovering attempt interrupted in turn keeps both.
	Started *Record
	// Prev is the interrupted execution to take over, as Lookup returned
	// it; nil claims a key without a live record.
	Prev *Record
}

// ClaimStatus is the answer of a Claim.
type ClaimStatus uint8

const (
	// Claimed: the started record is stored; ClaimResult.Claim holds the key.
	Claimed ClaimStatus = iota + 1
	// ClaimOwned: a live owner elsewhere holds the key (Postgres: an
	// unexpired lease); ClaimResult.Ownership says whose and until when.
	// The engine waits for it or refuses with an InProgressError, never
	// recovers it.
	ClaimOwned
	// ClaimChanged: the stored record is not the one the request expected
	// (another process claimed or completed the key since it was read);
	// ClaimResult.Current holds it (nil if the key is now free) and the
	// engine decides again.
	ClaimChanged
)

// String names the status: "claimed", "owned" or "changed".
func (s ClaimStatus) String() string {
	switch s {
	case Claimed:
		return "claimed"
	case ClaimOwned:
		return "owned"
	case ClaimChanged:
		return "changed"
	}
	return fmt.Sprintf("ClaimStatus(%d)", uint8(s))
}

// ClaimResult is the answer of a Backend.Claim.
type ClaimResult struct {
	// Status says which of the fields below holds the answer.
	Status ClaimStatus
	// Claim is the key's claim when Status is Claimed.
	Claim *Claim
	// Ownership is the owner's when Status is ClaimOwned.
	Ownership Ownership
	// Current is the record now stored when Status is ClaimChanged.
	Current *Record
	// At is the reading of the backend's clock at which Current was read
	// (Info.Clock set), zero otherwise: the engine judges Current's expiry
	// at it, as at Lookup's.
	At time.Time
}

// Ownership is the ownership rule's answer for a started record.
type Ownership struct {
	// Owned is true while a live owner (another process; never this
	// engine, which knows its own calls) holds the record: it must not be
	// recovered. False means an orphan: an interrupted execution.
	Owned bool
	// Owner names the owner for messages (Postgres: host and pid), empty
	// if unknown.
	Owner string
	// Until is when the owner's lease lapses unless renewed (backend's
	// clock), zero if unknown; the engine's retry-after hint uses it.
	Until time.Time
}

// PruneRequest is a Backend.Prune request.
type PruneRequest struct {
	// Now is the reading of the clock that judges: the engine's, or the
	// backend's (Info.Clock), which the engine reads just before.
	Now time.Time
	// Retention is the engine's retention window (see Engine.Live).
	Retention time.Duration
	// KeepStarted keeps every started record (RecoverRefuse).
	KeepStarted bool
	// Limit bounds the records deleted per write transaction.
	Limit int
}

// PruneResult is the answer of a Backend.Prune.
type PruneResult struct {
	// Deleted counts the records deleted; Interrupted counts the started
	// records among them.
	Deleted, Interrupted int
}

// PanicError is the panic value DoTx re-raises in its caller when fn
// panicked, wherever fn ran (bbolt may run it on its committer goroutine).
type PanicError struct {
	// Value is fn's panic value.
	Value any
	// Stack is the stack of the goroutine where fn panicked.
	Stack []byte
}

// Error gives the panic value and the stack.
func (p *PanicError) Error() string {
	return fmt.Sprintf("DoTx fn panicked: %v\n\n%s", p.Value, p.Stack)
}
