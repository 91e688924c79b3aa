// Package idem is an embedded dedupe engine: it makes any side-effecting Go
// function safe to call again.
//
// Agents and services retry: LLM tool loops re-issue calls, HTTP clients retry
// timeouts and 5xx, orchestrators replay steps after a crash. Engine.Do runs
// fn once per idempotency key, records its outcome in a bbolt file beside the
// program, and answers every retry from that record (errors included), so one
// logical action reaches the world once however many physical calls arrive.
//
//	e, err := idem.Open("idem.db", nil)
//	...
//	fp, _ := idem.Fingerprint(args) // canonical arguments: "the same request"
//	res, err := e.Do(ctx, key, fp, func(ctx context.Context) ([]byte, error) {
//		return chargeCard(ctx, args) // runs once per key
//	})
//	// res.Response is the first call's response; res.Replayed tells a retry.
//
// The engine is github.com/idemkit/idem/idemcore's (the state machine,
// written once for every backend, and its vocabulary: Options, Record,
// Error and the sentinels are its types, aliased here) over a bbolt file;
// github.com/idemkit/idem/idempg runs the same engine over Postgres.
// OpenFile takes the file's own settings (BoltOptions) beside the engine's.
//
// Keys follow Stripe's rules (1 to 255 bytes) and the IETF Idempotency-Key
// draft's semantics: a reused key with other arguments is refused
// (ErrFingerprintMismatch, the draft's 422), a duplicate that arrives while the
// first call runs waits for it, or fails with ErrInProgress (the draft's 409).
//
// # Guarantees
//
//   - At most once per key within the retention window, for fn's effect as far
//     as the engine can see it: a started record is committed and synced before
//     fn runs, a done record after it returns, and every later call with the key
//     is answered from the done record without running fn. The window (default
//     24 hours) runs from the record's completion; it is a floor: records may be
//     kept longer, never shorter. Each record carries the window it was written
//     under (Record.Retention): reopening the file with a shorter
//     Options.Retention, or running `idem prune`, never expires it earlier.
//   - Replays are exact: the same response bytes (nil and empty differ), the same
//     error code and message, after a restart too. A caller can tell a replay only
//     by Result.Replayed.
//   - Durability: when Do returns, its record is on disk (fsync), unless
//     BoltOptions.NoSync is set. Concurrent calls share commits (group commit).
//     A Do's records reach the disk through the write-ahead journal beside
//     the file (<path>.journal/: one fdatasync each, shared), and bbolt is
//     brought up to date behind it; every read sees them at once, and Open
//     replays what a crash or a power cut left in the journal. The journal
//     belongs to the file until Close removes it.
//   - A crash at any point leaves either no record (fn did not run), a done record
//     (replayed), or a started record: an interrupted execution, whose effect is
//     unknown. The RecoveryPolicy decides: re-execute (the default, at-least-once;
//     fn reads CallFrom(ctx).Recovered and reconciles with the downstream system,
//     passing the key on), or refuse with ErrIncomplete until an operator
//     resolves the key. A recovering call that ends without an outcome
//     (Retryable included) leaves that evidence in place: the next call
//     recovers again, and attempt numbers never repeat.
//   - How long the evidence of an interrupted execution lasts: under
//     RecoverReexecute, one retention window after the interrupted attempt
//     started (the window it was written under, or a longer Options.Retention).
//     A call within it runs fn with Recovered set and the next attempt number;
//     a call after it finds the key absent and runs attempt 1 with Recovered
//     false, as for a new key: fn can no longer tell that an earlier attempt
//     may have had its effect. When the pruner drops such records it logs their
//     count at warn level (never their keys). Under RecoverRefuse the record is
//     marked kept until resolved (Record.KeptUntilResolved): it never expires,
//     whatever a later Open passes, until a call recovers it, Engine.Resolve
//     or Engine.Forget. Choose the window longer than the longest time a
//     caller may take to retry after a crash, or refuse.
//   - DoTx gives exactly once for effects in the same file: fn's writes and the
//     record commit in one transaction or not at all. Effects elsewhere go
//     through the outbox in that transaction and are delivered at least once,
//     each with a stable downstream key.
//   - Concurrent duplicates in one process run fn once (per-key singleflight);
//     calls on different keys do not wait for each other.
//   - Nothing is lost on bad input: invalid keys and fingerprint conflicts store
//     nothing and touch nothing; a corrupt record (a bad checksum, a truncated
//     value, an unknown version) is reported with ErrCorrupt and its key, never
//     a panic.
//
// # Caveats
//
//   - One process holds the file (bbolt's exclusive lock); a second Open, even
//     in the same process, fails after BoltOptions.LockTimeout. Dedupe across
//     processes or machines needs a shared backend, which this package is not.
//   - Exactly once is impossible for an effect on another system: after a crash
//     between the effect and the done record, fn runs again (or the key is
//     refused). Pass the idempotency key to the downstream system, or use DoTx
//     with the outbox.
//   - A DoTx fn may run more than once (with the journal off, shared
//     transactions are retried without a failing member; with it on, only
//     after another fn of its group called runtime.Goexit), never more than
//     3 times per call, and must touch only its Tx: no I/O, no shared memory.
//   - BoltOptions.NoSync gives up durability: after a machine crash a started record
//     may be missing and fn may run twice. For tests and benchmarks.
//   - The fingerprint is a 64-bit xxhash: two different requests collide with
//     probability 2^-64, and only matter within one key.
//   - Responses are stored in full up to Options.MaxResponseSize (1 MiB by
//     default); a larger one fails closed with ErrResponseTooLarge.
//   - The file never shrinks by itself: `idem compact` rewrites it offline.
//   - Damage to bbolt's own pages (a torn disk, a file edited by hand) is beyond
//     record checksums. Open reads both meta pages before bbolt maps the file,
//     so a file truncated below its last page in use is an error wrapping
//     ErrCorrupt, read-only too, not a fault; a panic of bbolt's while it opens
//     a damaged file is an ErrCorrupt error too, and releases the file. Damage
//     inside pages that Open does not read may still make bbolt panic or fault
//     later. `idem check` runs bbolt's consistency check; restore such a file
//     from a Backup.
//   - Keys and responses are user data: the engine never logs them. Choose keys
//     that carry no personal data in clear (KeyOf hashes the parts).
//   - On a shared backend (idempg) fn holds a lease: its context ends with
//     cause idempg.ErrLeaseLost the moment the lease has passed unrenewed. Its Err
//     and Done judge the lease as last renewed, by the process's monotonic
//     clock, on every call, so fn resumed after a freeze (SIGSTOP, a long GC
//     pause, a starved scheduler) finds it ended on its first look,
//     whichever goroutine runs first; its Deadline stays the caller's. What
//     remains: contexts fn derives from it (WithTimeout, a driver's, an HTTP
//     request's) do not judge the lease themselves and learn of its end
//     through Done, when fn's context is cancelled (by its timer, or by a
//     look of fn's); a look and the effect after it are two instants, so a
//     process frozen between them does its effect late, maybe after the new
//     owner's (only its done write is refused, ErrFenced). Effects that must
//     never repeat belong in DoTx, whose writes commit with the record or not
//     at all, or downstream behind the idempotency key. An outbox handler's
//     context ends the same way at its message claim's end.
//
// # Outbox
//
// A DoTx fn records an effect on another system (a charge, an email) with
// Tx.Enqueue: the message commits with fn's writes and the done record, or not
// at all. The dispatcher (OutboxOptions.Dispatch, with OutboxOptions.Handlers) hands
// each message to the Handler of its topic after the commit, at least once,
// with Message.DownstreamKey (the call's key and the message's index, the same
// on every attempt) to pass on as the downstream idempotency key. Messages of
// one ordering key (the call's key, or one given to Tx.EnqueueOrdered) are
// delivered one at a time in enqueue order; a failed attempt is retried after
// an exponential backoff with jitter and holds back the later messages of its
// key; after OutboxOptions.MaxAttempts it becomes a dead letter, which no
// longer holds them back and which an operator lists (Engine.Messages),
// retries (Engine.RetryDead) or drops (Engine.DropDead). Messages live in the
// file: a restart delivers what was not delivered, and a crash after a handler
// returned but before its message was removed delivers that message again.
package idem
