// Package idemcore is idem's engine without its storage: the state machine
// of the contract (DESIGN.md), written once for every backend, and its
// vocabulary. Engine[T] runs Do and DoTx over a Backend[T]: key validation,
// fingerprints, the replay fast path and cache, the per-key singleflight,
// the decision table on a stored record, fn's context and the lease
// heartbeat, the classification of fn's outcome, the operator calls, the
// pruner and the outbox dispatcher. Options, Result, Record, Message, Error,
// OpError, the sentinels, Call and the observer's Event are its words, and
// every backend's: github.com/idemkit/idem (a bbolt file) aliases them, and
// github.com/idemkit/idem/idempg (Postgres) uses them as they are.
//
// Storage sits behind Backend, split by role (Records, Outbox, Waiter), so
// this package imports no storage driver: `go list -deps` of it, and of the
// adapters built on it (idemhttp, idemmcp, idemprom), names neither bbolt
// nor pgx. A backend imports this package, never the reverse, as River's
// drivers import riverdriver and litestream's replica clients implement
// ReplicaClient; the conformance suite, github.com/idemkit/idem/idemtest,
// runs on any Backend. Adapters take a Doer (or a TxDoer), which every
// backend's engine implements.
//
// The method comments say what each call does, returns and fails with; the
// reasoning they share is here, once.
//
// # Keys and fingerprints
//
// An idempotency key is 1 to MaxKeyLen bytes of UTF-8, without leading or
// trailing white space and without control or format characters (Unicode Cc
// and Cf, such as NUL or the byte-order mark); ErrInvalidKey gives the rules'
// sources. A fingerprint is the bytes that define "the same request"
// (canonical arguments: Fingerprint); the engine stores a 64-bit xxhash of
// them, and a reused key with another fingerprint fails with
// ErrFingerprintMismatch, whatever the record's state. KeyOf builds a key
// from domain parts: the namespace in clear, then the SHA-256 of the parts,
// each prefixed with its length, so different part lists give different keys
// (("a|b", "c") and ("a", "b|c") differ, and so do ("a") and ("a", "")) of a
// fixed length (the namespace's plus 65 bytes, at most 129). The parts do not
// sit in the store in clear, but the key is not reversible, and the hash is
// no secret: parts from a small space (a phone number, a sequential id) can
// be found by trying them all, so it is pseudonymisation, not
// anonymisation; the namespace must hold no personal data.
//
// # Outcomes
//
// The first call of a key commits a started record durably (bbolt: synced),
// runs fn with a context that carries CallFrom information and ends on
// Close, then commits a done record with fn's response and error. Later calls
// replay it: Result.Replayed is set, Response is the stored one, and a stored
// error comes back as *Error with its Code and Message. While a call runs,
// the others with its key wait for it (InFlightWait) or fail with
// ErrInProgress (InFlightFail), in this process and, on a backend shared by
// processes, in the others; a waiter whose ctx ends returns ctx.Err() and
// changes nothing.
//
// A response without error, or a permanent error (returned as *Error
// wrapping fn's error), is recorded. An error made with Retryable deletes the
// started record and frees the key. An error returned once fn's own context
// has ended (the caller's ctx, or Close), a panic (re-raised in the caller
// with its value and stack) or a failed commit leave the started record: an
// interrupted execution, which the RecoveryPolicy handles at the next call;
// waiters then get ErrIncomplete. Only the end of fn's own context is an
// interruption: a context error fn returns while its context is live (its own
// call to a gateway timed out, say WithCode(downstreamCtx.Err(),
// "downstream_timeout")) is a permanent error like any other. A response over
// MaxResponseSize fails closed with ErrResponseTooLarge. Once fn has
// returned, its outcome is recorded even if ctx ends.
//
// DoTx differs where its transaction makes a difference: fn's writes, its
// outbox messages and the done record commit together, or nothing does, so
// no started record is needed. If fn fails or panics, nothing it wrote
// commits: a permanent error is recorded without fn's writes (in a
// transaction of its own), as is ErrResponseTooLarge; Retryable, an error
// once fn's context ended, and a panic (re-raised as a *PanicError) store
// nothing, and the key is free. How many times fn may run is the backend's
// (Backend.RunTx: bbolt with its journal off may run it up to 3 times,
// bbolt's journal and Postgres once).
//
// # Unknown outcomes
//
// Nothing erases the evidence of an unknown outcome. When a call that
// recovers an interrupted execution ends without an outcome (Retryable, the
// end of its context, a panic, a failed commit), the key keeps a started
// record carrying that call's attempt and start time, so the next call
// recovers again (CallFrom's Recovered is set) with the attempt after it.
// Attempt numbers never repeat. A DoTx that recovers commits a started record
// of its own attempt first, as Do does, and it stays however the DoTx ends
// without an outcome.
//
// # Re-entrance
//
// fn may call Do with other keys, passing its ctx. A call with fn's own key
// returns ErrReentrant instead of waiting for itself: one made with fn's
// context (from any goroutine), and one made from the goroutine that runs fn
// whatever context it passes (context.Background() included), also through
// other keys' fns running on that goroutine. Inside a DoTx fn, every engine
// call returns ErrReentrant where the transaction holds the store's writer
// (Backend.Holding: bbolt). What cannot be detected: fn starts a goroutine
// that calls fn's own key with a context not derived from fn's, and waits for
// it; or two calls form a cycle (A's fn calls B while B's fn calls A). Such
// calls wait until one of their contexts ends (never, for
// context.Background()). fn must not call Close, which waits for fn.
//
// # Backends and their clocks
//
// Lease expiry is always judged by the backend's own clock (Postgres: the
// database's now()), never by the caller's. Everything else judged by time
// (retention, liveness, pruning, the outbox's due times and dead-letter
// retention) is judged by the clock Info.Clock names:
//
//   - Info.Clock nil (bbolt: one process holds the store): the engine's
//     clock (Options.Now, monotonic reading stripped). The times in requests
//     and records are its readings, and the backend stores them as given.
//   - Info.Clock set (Postgres: several processes share the store, and their
//     clocks may disagree): the backend's clock, which every process reads
//     alike. The backend stamps the times of what Claim, Complete, RunTx and
//     Enqueue store with its clock at the write (StartedAt, CompletedAt,
//     EnqueuedAt, set back in the records and messages it was given), judges
//     due messages by it (ClaimDue), and answers each read the engine judges
//     with its clock's reading (Lookup's at, ClaimResult.At). Where the
//     engine stamps or judges without such a read (Resolve's CompletedAt,
//     Failed's NextAttemptAt and DeadAt, Prune, Scan, Messages, RetryDead,
//     PruneDead) it reads Info.Clock first. The engine clock's readings in
//     requests (Lookup.Now, ClaimDue's now, the times of records it passes)
//     are then ignored. The engine keeps no replay cache (it could not judge
//     an entry's expiry without reading that clock).
//
// In one process at most one call per key runs the state machine at a time
// (the engine's singleflight), so a Backend sees at most one Claim, Complete,
// Release, RunTx, Forget or Resolve per key at a time from one engine;
// Lookup, Scan and the outbox methods run concurrently with everything. A
// backend shared by several processes (Postgres) makes Claim, Complete,
// Release and RunTx atomic against the other processes' on the same key.
package idemcore
