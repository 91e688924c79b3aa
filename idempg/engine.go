package idempg

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
)

// Engine is idem's engine on Postgres: the engine of idemcore (the same
// state machine as the bbolt engine's) over records that several processes
// share. It is safe for concurrent use, and offers the bbolt engine's
// methods (idemcore.Engine) with the same meaning; the backend's own are Schema
// and Dispatch's sharing of one outbox among processes.
type Engine struct {
	c *idemcore.Engine[pgx.Tx]
	b *backend
}

var _ idemcore.TxDoer[pgx.Tx] = (*Engine)(nil)

// Open returns an engine on the schema opts.Schema of the database pool
// reaches, with the engine settings eo (nil for defaults; idemcore.Options
// documents each, and they mean what they mean for the bbolt engine, except
// Now, which is not read for any time stored or judged: on Postgres every
// time is the database's clock (see "Clocks" in the package doc);
// Outbox.PollInterval is also how often a dispatcher looks for messages
// other processes enqueued when no NOTIFY comes; ReplayCacheBytes is not
// used: there is no replay cache on Postgres). The schema must be at
// SchemaVersion (run Migrate first), else the error wraps ErrSchemaVersion;
// settings that have no meaning give an error wrapping ErrOptions. Errors
// are *idemcore.OpError with Op "open". The engine does not close pool. nil
// opts mean defaults. The pool's own settings decide its size; in PollOnly
// mode (PgBouncer in transaction pooling mode) set its DefaultQueryExecMode
// to pgx.QueryExecModeExec or
// QueryExecModeSimpleProtocol, for fn's statements in DoTx too.
func Open(ctx context.Context, pool *pgxpool.Pool, opts *Options, eo *idemcore.Options) (*Engine, error) {
	return open(ctx, pool, opts, eo, nil)
}

// open is Open with the state machine over wrap(backend) if wrap is set
// (the conformance suite's test backends); the outbox uses the backend.
func open(ctx context.Context, pool *pgxpool.Pool, opts *Options, eo *idemcore.Options, wrap func(idemcore.Backend[pgx.Tx]) idemcore.Backend[pgx.Tx]) (*Engine, error) {
	s, err := resolve(opts)
	if err != nil {
		return nil, &idemcore.OpError{Op: "open", Err: err}
	}
	var o idemcore.Options
	if eo != nil {
		o = *eo
	}
	if err := o.Validate(); err != nil {
		return nil, &idemcore.OpError{Op: "open", Err: err}
	}
	o = o.WithDefaults()
	s.retention = o.Retention
	b, err := newBackend(ctx, pool, s, false)
	if err != nil {
		return nil, &idemcore.OpError{Op: "open", Err: err}
	}
	b.observer = o.Observer
	var cb idemcore.Backend[pgx.Tx] = b
	if wrap != nil {
		cb = wrap(b)
	}
	c, err := idemcore.New(cb, o)
	if err != nil {
		_ = b.Close()
		return nil, &idemcore.OpError{Op: "open", Err: err}
	}
	return &Engine{c: c, b: b}, nil
}

// Do runs fn once per idempotency key across every process that shares the
// schema (idemcore.Engine.Do gives the contract). While fn runs, its claim's
// lease is renewed every Options.Heartbeat; fn's context ends with cause
// ErrLeaseLost the moment the lease has passed unrenewed (or a renewal is
// refused), since another process may now take the key over. A call whose
// key another process holds
// waits for it (LISTEN/NOTIFY, polling every Options.PollInterval), or
// fails with an *InProgressError under InFlightFail. A claim whose lease
// lapsed (its process died or stalled) is taken over as an interrupted
// execution: fn runs again with CallFrom's Recovered set, and the stalled
// owner's completion is refused (ErrFenced) and never overwrites.
func (e *Engine) Do(ctx context.Context, key string, fingerprint []byte, fn func(context.Context) ([]byte, error)) (idemcore.Result, error) {
	return e.c.Do(ctx, key, fingerprint, fn)
}

// DoTx runs fn inside a Postgres transaction in which fn's writes, its
// outbox messages (Enqueue) and the done record commit together, or not at
// all (idemcore.Engine.DoTx gives the outcomes); see Backend.RunTx in this
// package for the isolation level (READ COMMITTED) and the timeouts. fn
// runs once per call; a crash, a lost connection or a stopped process
// leaves nothing behind (the server rolls the transaction back), so no
// interrupted execution exists to take over. fn must use only tx for the
// database, and not keep it after returning. An error fn returns that wraps
// a *pgconn.PgError whose SQLSTATE means "try again" (55P03
// lock_not_available, which Options.LockTimeout raises; 40001
// serialization_failure; 40P01 deadlock_detected) is not stored as the
// key's outcome: the call's error wraps idemcore.ErrRetryable and the
// driver's error, the transaction rolls back, and the key stays free. fn
// must not end tx: tx.Commit and tx.Rollback fail with ErrTxEnded (Begin is
// a savepoint), and a COMMIT or ROLLBACK fn sends as SQL fails the call
// with ErrTxEnded, with no outcome stored (see ErrTxEnded for what is left).
func (e *Engine) DoTx(ctx context.Context, key string, fingerprint []byte, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) (idemcore.Result, error) {
	return e.c.DoTx(ctx, key, fingerprint, fn)
}

// Schema is the schema that holds the engine's tables (Options.Schema). A
// DoTx fn reads it as current_setting('idem.schema').
func (e *Engine) Schema() string { return e.b.s.Schema }

// Retention is the retention window the engine was opened with.
func (e *Engine) Retention() time.Duration { return e.c.Retention() }

// Get returns key's live record, or an error wrapping ErrNotFound.
func (e *Engine) Get(key string) (*idemcore.Record, error) { return e.c.Get(key) }

// Forget deletes key's record in any state, as idemcore.Engine.Forget: once it
// returns, the next call of every engine on the schema, in any process, runs
// fn as new (replays read the database; no engine keeps a replay cache). A
// call that runs with the key, in this engine or in another process (its
// started record's lease has not lapsed by the database's clock), is not
// touched: the error wraps idemcore.ErrInProgress.
func (e *Engine) Forget(key string) error { return e.c.Forget(key) }

// Resolve completes key's interrupted execution by hand, as
// idemcore.Engine.Resolve: outcome nil for no stored error; once it returns,
// every engine on the schema replays the resolution. A started record
// whose lease another process holds, unlapsed, is a running call, not an
// interrupted one: the error wraps idemcore.ErrInProgress (wait for the lease
// to lapse, or for the call to end).
func (e *Engine) Resolve(key string, response []byte, outcome *idemcore.Error) error {
	return e.c.Resolve(key, response, outcome)
}

// Records walks every live record, by key, in one snapshot.
func (e *Engine) Records(fn func(r *idemcore.Record, err error) error) error { return e.c.Records(fn) }

// Prune deletes expired records now, in batches of Options.PruneBatch.
func (e *Engine) Prune(ctx context.Context) (int, error) { return e.c.Prune(ctx) }

// Stats returns the engine's counters since Open (idemcore.Stats; Commits
// and Writes are zero: this backend does not count them).
func (e *Engine) Stats() idemcore.Stats { return e.c.Stats() }

// Close is Shutdown without a deadline.
func (e *Engine) Close() error { return e.c.Close() }

// Shutdown stops the engine: new calls fail with ErrClosed, running fns' and
// handlers' contexts are cancelled, and Shutdown waits for them, then stops
// listening and returns the backend's close error. It does not close the
// pool. If ctx ends first, it returns ctx.Err() and the engine finishes
// closing in the background. It is idempotent.
func (e *Engine) Shutdown(ctx context.Context) error { return e.c.Shutdown(ctx) }
