// Package idempg is idem's Postgres backend (github.com/idemkit/idem/idempg,
// a module of its own, so that users of the bbolt engine never download a
// Postgres driver; its users get the root module github.com/idemkit/idem as
// well, whose types and errors it shares): the same contract as the bbolt
// engine, for several processes or machines that share one database, through
// pgx/v5.
//
// # Schema
//
// The tables live in one schema (Options.Schema, default "public"): records
// (idem_records), the outbox (idem_outbox), dead letters (idem_dead_letters)
// and the applied schema versions (idem_migrations). Migrate creates and
// upgrades them, as does the CLI:
//
//	idem migrate --pg 'postgres://user@host/db' [--schema idem]
//
// Migrations are versioned, applied in order, each in a transaction of its
// own, idempotent, and safe to run from several processes at once without
// advisory locks (so they also run on engines where those are stubs).
//
// # Guarantees
//
// The contract is the bbolt engine's (idem's doc.go and DESIGN.md), across
// every process that shares the schema:
//
//   - Do is at least once across processes, and at most once while a claim
//     is alive: fn runs again for a key only when the process that ran it
//     left its started record behind (crashed, was stopped or lost the
//     database) and its lease lapsed; the new run sees CallFrom's Recovered
//     and the next attempt number. A process stopped or cut off holds a
//     key for Options.Lease after its last renewal, which came at most
//     Options.Heartbeat before it stopped: with the defaults, 20 to 30 s
//     after it stopped. Under RecoverRefuse a lapsed claim is refused with
//     ErrIncomplete instead.
//   - A stale owner never overwrites: every claim takes a new fencing
//     token, and the owner's renewals and completion name it; a completion
//     after a takeover is refused with ErrFenced. fn's context ends
//     with cause ErrLeaseLost when a renewal is refused, or the moment the
//     lease has passed unrenewed (a renewal that hangs on a starved pool or
//     a dead network is not waited for; fn resumed after a freeze finds it
//     ended on its first look), so that fn can stop; an outbox handler's
//     context ends so at its message claim's end. Ownership is per engine: two
//     engines with the same Options.Owner label never share a claim. After
//     fn panics, or returns once its context ended, the engine ends its
//     lease at once, so another process recovers the key without waiting.
//   - DoTx is exactly once for what fn writes through its pgx.Tx: fn's
//     writes, its outbox messages and the done record commit in one
//     transaction, or none of them (a crash, a stopped process past
//     idle_in_transaction_session_timeout, a lost connection: the server
//     rolls back). Effects outside the database are at least once, as in
//     Do.
//   - The outbox is at least once and never loses a message: several
//     processes drain it, each message of an ordering key is delivered after
//     the ones before it were delivered or died (only the head of an
//     ordering key is claimable, FOR UPDATE SKIP LOCKED), and a dispatcher
//     that dies mid-delivery lets the message go after one lease. A
//     dispatcher's late failure of a message whose claim lapsed and was
//     taken since writes nothing (fenced by the claim's token), so it never
//     undoes an operator's RetryDead.
//   - One truth across processes: every replay reads the database (an
//     engine keeps no replay cache; idemcore.Options.ReplayCacheBytes is
//     ignored), so once an operator's Forget or Resolve has returned in one
//     process, every engine's next call sees it.
//   - An ambiguous COMMIT (the connection dropped after the statement was
//     sent) is resolved by reading the record back by its fencing token,
//     never by a blind rewrite: done with the claim's token, the caller gets
//     its outcome; another token, ErrFenced; still started with the claim's
//     token (the write never ran), Do's done record is written again on a
//     fresh connection, fenced by the same token. A done write or release
//     that fails on a dead connection (a server restart) is retried so,
//     for up to one Lease.
//
// # Caveats
//
//   - Isolation: DoTx runs at READ COMMITTED, Postgres's default: each of
//     fn's statements sees what committed before it began. fn cannot raise
//     the level (the backend's own statements come first in the
//     transaction); it locks what it reads instead (SELECT … FOR UPDATE).
//   - DoTx calls run in transactions of their own, up to one per two
//     connections of the pool at once; calls that find all of those busy
//     share a transaction (up to 16), each fn under a savepoint of its own
//     and one after the other, so a slow fn delays the calls queued behind
//     it (keep waits on other systems out of DoTx fns: the outbox is for
//     them). A fn
//     sees the writes of the calls before it in the same transaction, which
//     commit with it. A fn that fails is rolled back to its savepoint and the
//     others commit without running again; a COMMIT that fails (a deferred
//     constraint one fn broke) fails every call of its transaction, and
//     their keys stay free. fn must not Commit or Rollback the pgx.Tx it is
//     given (those fail); a nested Begin is a savepoint. A statement fn
//     already sent is not cut off by fn's context (that would break the
//     connection the other calls share); the next one is refused. A fn must
//     not wait for another DoTx call of the same engine: it may be queued
//     behind fn, as on the bbolt engine, whose commits are shared too.
//   - Do and DoTx claim without a lookup first (idemcore.Info.ClaimFirst)
//     while most calls find no record: Do's claim inserts the started row
//     (INSERT … ON CONFLICT DO NOTHING), and only for a key with a row does
//     a second statement replace it if expired or answer it, writing
//     nothing, if live; so a fresh key costs two round trips (claim,
//     completion). Up to one claim statement and one completion statement
//     per eight connections of the pool run at once, and two of each once
//     twice as many calls as that are in them or waiting; calls that find
//     those busy share the next one (one INSERT or UPDATE, one commit per
//     batch); a lone call's statements go at once, unbatched.
//     Every transaction the
//     backend runs sets lock_timeout (Options.LockTimeout) and
//     idle_in_transaction_session_timeout (Options.IdleInTransactionTimeout),
//     so that a stopped process holding row locks blocks the others for at
//     most those. A pool of the engine's own may set both for each session
//     instead (AfterConnect in its pgxpool.Config): Do's claims and
//     completions then carry no setting, which saves 18-37 µs of each
//     statement on the bench machine; the settings then bind every
//     statement sent on the pool.
//   - A key held by another process's DoTx transaction (not yet committed)
//     is in progress for others: their claim waits up to LockTimeout, then
//     waits on (InFlightWait) or fails with an *InProgressError.
//   - Waiters in other processes wake on LISTEN/NOTIFY, with a poll every
//     Options.PollInterval as the fallback. A waiter marks the started
//     record it waits on (one write), and only a change of a marked record
//     notifies: Postgres serialises the commits of transactions that
//     notify, so completions nobody waits for send none. PgBouncer in transaction pooling
//     mode (tested in CI) and CockroachDB (documented, not tested here) need
//     Options.PollOnly: no LISTEN, no prepared statements; the pool must use
//     pgx.QueryExecModeExec or QueryExecModeSimpleProtocol.
//
// # Clocks
//
// Every time is the database's clock, never a client's, so that processes on
// machines whose clocks disagree agree on it: leases (now()), and the times
// of records and messages (statement_timestamp(), stored as Unix
// nanoseconds in whole microseconds), which the database stamps as it
// writes them: Record.StartedAt and CompletedAt, Message.EnqueuedAt,
// NextAttemptAt and DeadAt. Retention, liveness, pruning, the outbox's due
// times and dead-letter retention are judged by it too: a record written by
// any process lives its whole window for every other, and a process whose
// clock runs ahead neither re-runs the others' keys nor prunes their records
// (the retention window is a floor, idem's doc.go). idemcore.Options.Now is not
// read for any of these on Postgres; tests that move time move the
// database's. Each Lookup reads the clock with the record, so a replay costs
// no extra round trip; the operator calls (Records, Resolve, Messages,
// RetryDead, Prune) and a failed delivery read it once more. The engine
// keeps no replay cache here: it could not judge a cached record's expiry
// without reading that clock. Schema version 4 marks the change: a build
// that judged by its own clock refuses a schema migrated to it.
// fn's context (and an outbox handler's) learns its lease's end from this
// machine's monotonic clock, counted from a reading taken before the claim
// or renewal was sent plus the lease left by the database's clock, so it
// ends no later than the lease does there.
package idempg
