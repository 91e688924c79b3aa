package idempg

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/core"
	"github.com/idemkit/idem/internal/goid"
)

// Batching of DoTx calls: concurrent calls share one transaction, each fn
// under a savepoint of its own.
const (
	// maxTxBatch is the most calls one transaction carries. Each call's
	// savepoint that writes takes a subtransaction id, and Postgres caches
	// at most 64 of them per transaction (PGPROC_MAX_CACHED_SUBXIDS) before
	// every other session's snapshots get slower: 16 leaves fn room for
	// savepoints of its own.
	maxTxBatch = 16
	// txBatchShare sets how many batch transactions run at once: one per
	// txBatchShare connections of the pool (at least two), so that Do's
	// statements and the dispatcher keep connections of their own.
	txBatchShare = 8
)

// txReq is one RunTx call, queued for or running in a batch.
type txReq struct {
	c     *core.Claim
	fn    func(tx pgx.Tx) (*core.Record, error)
	token core.Fence // the claim's, once made
	err   error
	done  chan struct{}
}

// RunTx implements core.Backend for DoTx.
//
// Concurrent calls share one transaction (at most maxTxBatch each; a lone
// call runs in its own at once): the transaction sets lock_timeout and
// idle_in_transaction_session_timeout, then each call in turn takes a
// savepoint, claims its key there if c.Token is zero (a started row
// inserted, so that another process's claim of the key waits for the
// transaction's end, bounded by its lock_timeout, after which it sees the
// key as owned), runs fn, and replaces the row with the done record. A call
// whose claim, fn or completion fails is rolled back to its savepoint and
// answered at once; the others go on and commit together, so no fn runs
// twice: Postgres runs fn once. If COMMIT fails, every call left in the
// transaction gets the error (an ambiguous one is resolved per call by
// reading its record back by token).
//
// Isolation: READ COMMITTED, Postgres's default. Each of fn's statements
// sees what committed before it began, and the writes of the calls before it
// in the same transaction (they commit with it). fn that needs more takes
// row locks (SELECT … FOR UPDATE); a deferred constraint that one fn breaks
// fails the COMMIT of every call in its transaction.
//
// fn runs once, on a goroutine of its own (so that runtime.Goexit in it is
// reported as core.ErrGoexit), while the caller waits. It receives the
// transaction through a wrapper that refuses Commit and Rollback (the
// transaction is not fn's alone; a nested Begin is a savepoint, as in pgx)
// and that stops sending statements once fn's context ended (a statement
// already sent runs to its end, bounded by lock_timeout for locks: a
// statement cut off mid-way would break the connection the other calls
// share).
func (b *backend) RunTx(ctx context.Context, c *core.Claim, fn func(tx pgx.Tx) (*core.Record, error)) error {
	r := &txReq{c: c, fn: fn, token: c.Token, done: make(chan struct{})}
	b.dotx.do(r, r.done)
	return r.err
}

// runBatch runs reqs in one transaction and answers each.
func (b *backend) runBatch(reqs []*txReq) {
	ctx := context.Background()
	answer := func(r *txReq, err error) {
		r.err = err
		close(r.done)
	}
	tx, err := b.pool.Begin(ctx)
	if err == nil {
		if err = b.limit(ctx, tx); err != nil {
			_ = tx.Rollback(ctx)
		}
	}
	if err != nil {
		for _, r := range reqs {
			answer(r, err)
		}
		return
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit: a no-op
	var stored []*txReq
	for i, r := range reqs {
		err := b.runOne(ctx, tx, "idem_fn_"+strconv.Itoa(i), r)
		var broken *batchBroken
		if errors.As(err, &broken) {
			// The transaction is lost: nothing of it commits.
			answer(r, broken.err)
			for _, r := range stored {
				answer(r, broken.cause)
			}
			for _, r := range reqs[i+1:] {
				answer(r, broken.cause)
			}
			return
		}
		if err != nil {
			answer(r, err)
			continue
		}
		stored = append(stored, r)
	}
	if len(stored) == 0 {
		return
	}
	err = tx.Commit(ctx)
	if err == nil {
		b.committed()
	}
	for _, r := range stored {
		rerr := err
		if err != nil && ambiguous(err) {
			rerr = b.readBack(ctx, &core.Claim{Key: r.c.Key, Token: r.token}, core.StateDone, err)
		}
		answer(r, rerr)
	}
}

// batchBroken is runOne's error when the transaction itself failed (a
// savepoint could not be rolled back to): err is the call's own answer,
// cause the others'.
type batchBroken struct{ err, cause error }

func (e *batchBroken) Error() string { return e.cause.Error() }

// runOne runs r in tx under savepoint sp: claim (Token zero), fn, done
// record. On an error the savepoint is rolled back to, so that nothing of r
// stays in tx; if that fails too, the error is a *batchBroken.
func (b *backend) runOne(ctx context.Context, tx pgx.Tx, sp string, r *txReq) error {
	fail := func(err error) error {
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+sp); rerr != nil {
			return &batchBroken{err: err, cause: fmt.Errorf("rolling back a DoTx call in a shared transaction: %w", rerr)}
		}
		return err
	}
	batch := &pgx.Batch{}
	batch.Queue("SAVEPOINT " + sp)
	if r.token == 0 {
		batch.Queue(b.sql(`INSERT INTO {schema}.idem_records AS r (key, fingerprint, state, attempt, fence, owner, lease_until,
				started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns)
			VALUES ($1::text, $2::bigint, 1, 1, nextval('{schema}.idem_fence'), $3::text, `+b.leaseSQL()+`, 0, 0, 0, false, 0)
			ON CONFLICT (key) DO UPDATE SET state = 1, fence = EXCLUDED.fence, owner = EXCLUDED.owner,
				lease_until = EXCLUDED.lease_until, response = NULL, has_error = false, waiters = false
			WHERE `+fmt.Sprintf(expiredSQL, "r", "$4::bigint", "$5::bigint", "$3::text")+`
			RETURNING fence`), r.c.Key, int64(r.c.Fingerprint), b.owner, int64(b.s.retention), toNs(b.s.engineNow()))
	}
	br := tx.SendBatch(ctx, batch)
	_, err := br.Exec()
	if err == nil && r.token == 0 {
		var fence int64
		err = br.QueryRow().Scan(&fence)
		switch {
		case errors.Is(err, pgx.ErrNoRows), isLockWait(err):
			// A live record, or a row another transaction holds (lock
			// timeout, or this one chosen to end a deadlock over keys).
			err = core.ErrClaimTaken
		case err == nil:
			r.token = core.Fence(fence)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	ft := &fnTx{Tx: tx}
	txs.Store(ft, &txState{b: b, key: r.c.Key})
	done, err := b.runFn(ft, r.fn)
	txs.Delete(ft)
	ft.end()
	if err != nil {
		return fail(err)
	}
	tag, err := tx.Exec(ctx, b.sql(b.notifying(completeSQL)), b.s.args(append([]any{r.c.Key, int64(r.token)}, doneArgs(done)...)...)...)
	if err == nil && tag.RowsAffected() == 0 {
		err = fmt.Errorf("%w: completing the call", core.ErrFenced)
	}
	if err != nil {
		return fail(err)
	}
	return nil
}

// errFnEndsTx is the error of a DoTx fn's Commit or Rollback of the
// transaction it was given.
var errFnEndsTx = errors.New("idempg: a DoTx fn must not commit or roll back its transaction (the engine does, with the done record)")

// fnTx is the transaction a DoTx fn receives: the batch's, without Commit
// and Rollback, and with statements refused once fn's context ended or fn
// returned (core.ErrTxClosed).
type fnTx struct {
	pgx.Tx
	nested bool // a savepoint fn began: its Commit and Rollback are fn's
	mu     sync.Mutex
	ended  bool
}

func (t *fnTx) end() {
	t.mu.Lock()
	t.ended = true
	t.mu.Unlock()
}

// use checks that a statement may be sent with ctx, and returns the context
// to send it with: ctx without its cancellation (see RunTx).
func (t *fnTx) use(ctx context.Context) (context.Context, error) {
	t.mu.Lock()
	ended := t.ended
	t.mu.Unlock()
	if ended {
		return nil, fmt.Errorf("%w: the DoTx fn returned", core.ErrTxClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return context.WithoutCancel(ctx), nil
}

// Begin starts a nested transaction: a savepoint of the batch's.
func (t *fnTx) Begin(ctx context.Context) (pgx.Tx, error) {
	c, err := t.use(ctx)
	if err != nil {
		return nil, err
	}
	nt, err := t.Tx.Begin(c)
	if err != nil {
		return nil, err
	}
	return &fnTx{Tx: nt, nested: true}, nil
}

// Commit and Rollback fail with errFnEndsTx, unless t is a savepoint fn
// began: the transaction is the engine's.
func (t *fnTx) Commit(ctx context.Context) error {
	if !t.nested {
		return errFnEndsTx
	}
	c, err := t.use(ctx)
	if err != nil {
		return err
	}
	return t.Tx.Commit(c)
}

func (t *fnTx) Rollback(ctx context.Context) error {
	if !t.nested {
		return errFnEndsTx
	}
	return t.Tx.Rollback(context.WithoutCancel(ctx))
}

func (t *fnTx) CopyFrom(ctx context.Context, name pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	c, err := t.use(ctx)
	if err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(c, name, cols, src)
}

func (t *fnTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c, err := t.use(ctx)
	if err != nil {
		return errBatch{err}
	}
	return t.Tx.SendBatch(c, b)
}

func (t *fnTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	c, err := t.use(ctx)
	if err != nil {
		return nil, err
	}
	return t.Tx.Prepare(c, name, sql)
}

func (t *fnTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, err := t.use(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.Tx.Exec(c, sql, args...)
}

func (t *fnTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c, err := t.use(ctx)
	if err != nil {
		return nil, err
	}
	return t.Tx.Query(c, sql, args...)
}

func (t *fnTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c, err := t.use(ctx)
	if err != nil {
		return errRow{err}
	}
	return t.Tx.QueryRow(c, sql, args...)
}

// errRow and errBatch carry an error refused before sending.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

// runFn runs fn(tx) on a goroutine of its own and waits: a panic comes back
// as a *core.PanicError with fn's stack, runtime.Goexit as core.ErrGoexit.
// Meanwhile Holding reports true on that goroutine.
func (b *backend) runFn(tx pgx.Tx, fn func(tx pgx.Tx) (*core.Record, error)) (done *core.Record, err error) {
	ch := make(chan struct{})
	go func() {
		id := goid.ID()
		b.fnGoroutines.Store(id, struct{}{})
		b.inFn.Add(1)
		returned := false
		defer func() {
			b.inFn.Add(-1)
			b.fnGoroutines.Delete(id)
			if v := recover(); v != nil {
				err = &core.PanicError{Value: v, Stack: debug.Stack()}
			} else if !returned {
				err = core.ErrGoexit
			}
			close(ch)
		}()
		done, err = fn(tx)
		returned = true
	}()
	<-ch
	return done, err
}
