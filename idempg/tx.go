package idempg

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
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
	// txBatchShare sets how many DoTx batch transactions run at once: one
	// per txBatchShare connections of the pool (at least two), so that the
	// other half keeps Do's statements, lease renewals and the dispatcher
	// going. A batch forms only from calls that find every slot taken, so
	// with slots to spare calls run side by side and a slow fn delays no
	// one (a batch runs its fns one after the other).
	txBatchShare = 2
)

// txReq is one RunTx call, queued for or running in a batch.
type txReq struct {
	c     *idemcore.Claim
	fn    func(tx pgx.Tx) (*idemcore.Record, error)
	token idemcore.Fence // the claim's, once made
	err   error
	done  chan struct{}
}

// RunTx implements idemcore.Backend for DoTx.
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
// reported as idemcore.ErrGoexit), while the caller waits. It receives the
// transaction through a wrapper that refuses Commit and Rollback (the
// transaction is not fn's alone; a nested Begin is a savepoint, as in pgx:
// the error wraps ErrTxEnded) and that stops sending statements once fn's context ended (a statement
// already sent runs to its end, bounded by lock_timeout for locks: a
// statement cut off mid-way would break the connection the other calls
// share). A fn that ends the transaction with SQL anyway (COMMIT, ROLLBACK,
// END, COMMIT AND CHAIN through tx) is detected after it returns (the
// connection's transaction status, and an idem.tx marker set with SET LOCAL
// that the done write requires): its call fails with ErrTxEnded and stores
// no outcome, and the calls before it in the batch are read back.
func (b *backend) RunTx(ctx context.Context, c *idemcore.Claim, fn func(tx pgx.Tx) (*idemcore.Record, error)) error {
	r := &txReq{c: c, fn: fn, token: c.Token, done: make(chan struct{})}
	if err := b.dotx.do(ctx, r, r.done); err != nil {
		return err // not sent (the engine's ctx does not end: WithoutCancel)
	}
	return r.err
}

// runBatch runs reqs in transactions and answers each: as many calls in
// one as run within about a commit's time (segment), so that a call
// stored early is not held for long behind the fns of the calls after it.
func (b *backend) runBatch(reqs []*txReq) {
	for len(reqs) > 0 {
		reqs = b.runSegment(reqs)
	}
}

// runSegment runs the first calls of reqs in one transaction and answers
// them, and returns the calls it left for the next: it commits once the
// calls it stored have run longer than a commit takes (commitTime), as a
// commit then costs less than their answers' wait for more fns.
func (b *backend) runSegment(reqs []*txReq) (rest []*txReq) {
	ctx := context.Background()
	answer := func(r *txReq, err error) {
		r.err = err
		close(r.done)
	}
	tx, release, err := b.begin(ctx)
	if err != nil {
		for _, r := range reqs {
			answer(r, err)
		}
		return nil
	}
	defer release()
	defer func() { _ = tx.Rollback(ctx) }() // after Commit: a no-op
	// xid is the transaction's id (txid_current), by which an ambiguous
	// COMMIT is resolved (commitOutcome); each call's completion answers
	// it (a savepoint's subtransaction answers its top transaction's).
	var (
		xid    int64
		note   = &outboxNote{}
		stored []*txReq
		start  = time.Now()
		alone  = len(reqs) == 1
	)
	for i, r := range reqs {
		if len(stored) > 0 && time.Since(start) > b.commitTime() {
			rest = reqs[i:]
			break
		}
		sp := "idem_fn_" + strconv.Itoa(i)
		if alone {
			sp = "" // the transaction is the call's: no savepoint
		}
		err := b.runOne(ctx, tx, sp, r, &xid, note)
		var broken *batchBroken
		if errors.As(err, &broken) {
			// The transaction is lost: nothing of it commits.
			answer(r, broken.err)
			for _, r := range stored {
				if broken.ended {
					answer(r, b.readBackDone(ctx, r, broken.cause))
					continue
				}
				answer(r, broken.cause)
			}
			for _, r := range reqs[i+1:] {
				answer(r, broken.cause)
			}
			return nil
		}
		if err != nil {
			answer(r, err)
			continue
		}
		stored = append(stored, r)
	}
	if len(stored) == 0 {
		return rest
	}
	before := time.Now()
	err = tx.Commit(ctx)
	if err == nil {
		b.committed()
		b.commitTook(time.Since(before))
		b.observeCommit(before, len(stored))
	}
	for _, r := range stored {
		rerr := err
		if err != nil && ambiguous(err) {
			rerr = b.commitOutcome(ctx, xid, &idemcore.Claim{Key: r.c.Key, Token: r.token}, err)
		}
		answer(r, rerr)
	}
	return rest
}

// commitTime is how long a DoTx COMMIT takes, a moving average of the last
// ones (initialCommitTime before the first).
func (b *backend) commitTime() time.Duration {
	if d := b.commitAvg.Load(); d > 0 {
		return time.Duration(d)
	}
	return initialCommitTime
}

// commitTook adds a COMMIT's duration d to commitTime's average (weight
// 1/8, as TCP's smoothed round-trip time).
func (b *backend) commitTook(d time.Duration) {
	for {
		old := b.commitAvg.Load()
		avg := int64(d)
		if old > 0 {
			avg = old + (int64(d)-old)/8
		}
		if b.commitAvg.CompareAndSwap(old, avg) {
			return
		}
	}
}

// initialCommitTime is commitTime before a COMMIT was timed: a WAL flush on
// a disk that syncs (fsync on).
const initialCommitTime = 2 * time.Millisecond

// readBackDone answers a call stored in a batch whose transaction another
// call's fn ended: nil if its done record (its token) committed with the
// COMMIT fn sent, else cause (nothing of it was stored).
func (b *backend) readBackDone(ctx context.Context, r *txReq, cause error) error {
	var (
		fence int64
		state idemcore.State
	)
	err := b.pool.QueryRow(ctx, b.sql(`SELECT fence, state FROM {schema}.idem_records WHERE key = $1::text`), b.s.args(r.c.Key)...).Scan(&fence, &state)
	if err == nil && idemcore.Fence(fence) == r.token && state == idemcore.StateDone {
		return nil
	}
	return fmt.Errorf("a DoTx call sharing the transaction: %w", cause)
}

// batchBroken is runOne's error when the transaction itself failed (a
// savepoint could not be rolled back to): err is the call's own answer,
// cause the others'.
type batchBroken struct {
	err, cause error
	// ended: a DoTx fn ended the transaction with SQL; the calls before it
	// in the batch may have committed with it, and are read back.
	ended bool
}

func (e *batchBroken) Error() string { return e.cause.Error() }

// begin begins a DoTx transaction with its settings (beginSQL) in one
// round trip, on a connection of the pool that release gives back once the
// transaction has ended.
func (b *backend) begin(ctx context.Context) (tx pgx.Tx, release func(), err error) {
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	tx, err = conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: b.begins[boolIndex(b.sessionSet(conn.Conn()))]})
	if err != nil {
		conn.Release()
		return nil, nil, err
	}
	return tx, conn.Release, nil
}

// runOne runs r in tx under savepoint sp: claim (Token zero), fn, done
// record. On an error the savepoint is rolled back to, so that nothing of r
// stays in tx; if that fails too, the error is a *batchBroken. With sp
// empty the transaction is r's alone: no savepoint, and an error leaves
// the transaction to be rolled back (its caller commits nothing without a
// call stored). The done write sets xid to the transaction's id. note is
// the transaction's outbox notification, which the done write of its first
// call that enqueued sends.
func (b *backend) runOne(ctx context.Context, tx pgx.Tx, sp string, r *txReq, xid *int64, note *outboxNote) error {
	fail := func(err error) error {
		if sp == "" {
			return err
		}
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+sp); rerr != nil {
			return &batchBroken{err: err, cause: fmt.Errorf("rolling back a DoTx call in a shared transaction: %w", rerr)}
		}
		return err
	}
	batch := &pgx.Batch{}
	if sp != "" {
		batch.Queue("SAVEPOINT " + sp)
	}
	if r.token == 0 {
		batch.Queue(b.stmts().txClaim, r.c.Key, int64(r.c.Fingerprint), b.owner, int64(b.s.retention))
	}
	var err error
	if batch.Len() > 0 {
		br := tx.SendBatch(ctx, batch)
		if sp != "" {
			_, err = br.Exec()
		}
		if err == nil && r.token == 0 {
			var fence int64
			err = br.QueryRow().Scan(&fence)
			switch {
			case errors.Is(err, pgx.ErrNoRows), isLockWait(err):
				// A live record, or a row another transaction holds (lock
				// timeout, or this one chosen to end a deadlock over keys).
				err = idemcore.ErrClaimTaken
			case err == nil:
				r.token = idemcore.Fence(fence)
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fail(err)
	}
	ft := &fnTx{Tx: tx}
	st := &txState{b: b, key: r.c.Key, trace: r.c.Trace, note: note}
	txs.Store(ft, st)
	done, err := b.runFn(ft, r.fn)
	txs.Delete(ft)
	ft.end()
	if ended := b.txEnded(ctx, tx, false); ended != nil {
		return ended
	}
	if err != nil {
		// fn's writes go with its savepoint (or its transaction), unless
		// fn ended the transaction and chained a new one (COMMIT AND CHAIN,
		// ROLLBACK AND CHAIN), which only the transaction's marker tells:
		// one round trip more, on this path only.
		if ended := b.txEnded(ctx, tx, true); ended != nil {
			return ended
		}
		return fail(err)
	}
	// The nil destinations skip pg_notify's void.
	var startedNs, completedNs int64
	q, dest := b.stmts().txComplete, []any{&startedNs, &completedNs, nil, xid}
	wake := st.next > 0 && !note.sent && !b.s.PollOnly // its messages wake the other processes' dispatchers
	if wake {
		q = b.stmts().txCompleteWake
		dest = append(dest, nil)
	}
	err = queryRow(ctx, tx, q, b.s.args(append([]any{r.c.Key, int64(r.token)}, doneArgs(done)...)...), dest...)
	if err == nil && wake {
		note.sent = true
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if ended := b.txEnded(ctx, tx, true); ended != nil {
			return ended
		}
		err = fmt.Errorf("%w: completing the call", idemcore.ErrFenced)
	}
	if err != nil {
		return fail(err)
	}
	stamped(done, startedNs, completedNs)
	return nil
}

// txClaimSQL is DoTx's claim of a free key in its transaction ($1 key, $2
// fingerprint, $3 owner, $4 the engine's retention, ns), answering the
// fence. Stamped by the database's clock, which judges the row it may
// replace too (expired, by the longer window of its and the engine's). The
// replaced row's fingerprint and attempt go: the key is new.
func (b *backend) txClaimSQL() string {
	return `INSERT INTO {schema}.idem_records AS r (key, fingerprint, state, attempt, fence, owner, lease_until,
				started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns)
			VALUES ($1::text, $2::bigint, 1, 1, nextval('{schema}.idem_fence'), $3::text, ` + b.leaseSQL() + `, {now_ns}, 0, 0, false, 0)
			ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, state = 1, attempt = 1, fence = EXCLUDED.fence,
				owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until, started_ns = EXCLUDED.started_ns, completed_ns = 0,
				response = NULL, has_error = false, waiters = false
			WHERE ` + fmt.Sprintf(expiredSQL, "r", "$4::bigint", "EXCLUDED.started_ns", "$3::text") + `
			RETURNING fence`
}

// txCompleteSQL is DoTx's completion in its transaction (completeStmt of
// completeSQL and txLiveSQL), answering the transaction's id too
// (txid_current), and, if wake, notifying the other processes' dispatchers
// (a column more).
func (b *backend) txCompleteSQL(wake bool) string {
	if wake {
		return b.completeWith("", completeSQL+txLiveSQL, `, txid_current(), pg_notify('`+b.s.channel()+`_outbox', '')`)
	}
	return b.completeWith("", completeSQL+txLiveSQL, `, txid_current()`)
}

// txLiveSQL ends DoTx's completion statement's WHERE: it matches only in
// the transaction the backend began (limit sets idem.tx there with SET
// LOCAL; a COMMIT AND CHAIN fn sent starts one without it), so that a done
// record is never written outside it.
const txLiveSQL = ` AND current_setting('idem.tx', true) = 'on'`

// txEnded returns a *batchBroken wrapping ErrTxEnded if fn ended the
// batch's transaction with SQL (COMMIT, ROLLBACK, END, COMMIT AND CHAIN):
// the connection's status says so at no cost, and, if ask, a read of the
// transaction's idem.tx marker (for a chained transaction).
func (b *backend) txEnded(ctx context.Context, tx pgx.Tx, ask bool) error {
	ended := tx.Conn().PgConn().TxStatus() == 'I'
	if !ended && ask {
		var mark *string
		if err := tx.QueryRow(ctx, "SELECT current_setting('idem.tx', true)", b.s.args()...).Scan(&mark); err == nil {
			ended = mark == nil || *mark != "on"
		}
	}
	if !ended {
		return nil
	}
	err := fmt.Errorf("%w: it sent COMMIT or ROLLBACK through tx; nothing was stored for the call", ErrTxEnded)
	return &batchBroken{err: err, cause: err, ended: true}
}

// runFn runs fn(tx) on a goroutine of its own and waits: a panic comes back
// as a *idemcore.PanicError with fn's stack, runtime.Goexit as idemcore.ErrGoexit.
// Meanwhile Holding reports true on that goroutine.
func (b *backend) runFn(tx pgx.Tx, fn func(tx pgx.Tx) (*idemcore.Record, error)) (done *idemcore.Record, err error) {
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
				err = &idemcore.PanicError{Value: v, Stack: debug.Stack()}
			} else if !returned {
				err = idemcore.ErrGoexit
			}
			close(ch)
		}()
		done, err = fn(tx)
		returned = true
	}()
	<-ch
	return done, err
}
