package idempg

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/core"
	"github.com/idemkit/idem/internal/goid"
)

// RunTx implements core.Backend for DoTx: one transaction per call, at
// READ COMMITTED (Postgres's default: each statement of fn sees what
// committed before it began; fn that needs more takes row locks with SELECT
// … FOR UPDATE), with lock_timeout and
// idle_in_transaction_session_timeout set for the transaction. For a new
// key (c.Token zero) a started row is inserted first, so that another
// process's claim of the key waits for this transaction's end (bounded by
// its lock_timeout, after which it sees the key as owned); fn runs under a
// savepoint, and the done record replaces the row. fn runs once, on a
// goroutine of its own (so that runtime.Goexit in it is reported as
// core.ErrGoexit), while the caller waits.
func (b *backend) RunTx(ctx context.Context, c *core.Claim, fn func(tx pgx.Tx) (*core.Record, error)) error {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after Commit: a no-op
	if err := b.limit(ctx, tx); err != nil {
		return err
	}
	// xid is the transaction's id (txid_current), by which an ambiguous
	// COMMIT is resolved (commitOutcome).
	var xid int64
	token := c.Token
	if token == 0 {
		var fence int64
		err := tx.QueryRow(ctx, b.sql(`INSERT INTO {schema}.idem_records AS r (key, fingerprint, state, attempt, fence, owner, lease_until,
				started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns)
			VALUES ($1::text, $2::bigint, 1, 1, nextval('{schema}.idem_fence'), $3::text, `+b.leaseSQL()+`, 0, 0, 0, false, 0)
			ON CONFLICT (key) DO UPDATE SET state = 1, fence = EXCLUDED.fence, owner = EXCLUDED.owner,
				lease_until = EXCLUDED.lease_until, response = NULL, has_error = false
			WHERE `+fmt.Sprintf(expiredSQL, "r", "$4::bigint", "$5::bigint", "$3::text")+`
			RETURNING fence, txid_current()`), b.s.args(c.Key, int64(c.Fingerprint), b.owner, int64(b.s.retention), toNs(b.s.engineNow()))...).Scan(&fence, &xid)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return core.ErrClaimTaken
		case isLockTimeout(err):
			return core.ErrClaimTaken
		case err != nil:
			return err
		}
		token = core.Fence(fence)
	} else if err := tx.QueryRow(ctx, `SELECT txid_current()`, b.s.args()...).Scan(&xid); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "SAVEPOINT idem_fn"); err != nil {
		return err
	}
	txs.Store(tx, &txState{b: b, key: c.Key})
	done, err := b.runFn(tx, fn)
	txs.Delete(tx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT idem_fn"); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, b.sql(b.notifying(completeSQL)), b.s.args(append([]any{c.Key, int64(token)}, doneArgs(done)...)...)...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: completing the call", core.ErrFenced)
	}
	err = tx.Commit(ctx)
	if err != nil && ambiguous(err) {
		err = b.commitOutcome(ctx, xid, &core.Claim{Key: c.Key, Token: token}, err)
	}
	if err == nil {
		b.committed()
	}
	return err
}

// commitOutcome resolves a COMMIT whose answer was lost (cause) by the
// transaction's status on the server (txid_status of xid), waiting while
// it is still in progress: the COMMIT may not have arrived yet (a
// connection cut while it was on its way), and a read back before it
// arrives would see the transaction's writes missing although they commit
// a moment later. Committed, the record is read back by the claim's token
// (readBack: done with it, nil); aborted, nothing of fn's committed and the
// error is cause's. The wait is bounded by the transaction's
// idle_in_transaction_session_timeout, after which the server aborts a
// transaction whose COMMIT never came, and LockTimeout more; past it, or if
// the status cannot be read, the outcome stays unknown and the error says
// so. It only reads: the outcome is never decided by writing again.
func (b *backend) commitOutcome(ctx context.Context, xid int64, c *core.Claim, cause error) error {
	deadline := time.Now().Add(b.s.IdleInTransactionTimeout + b.s.LockTimeout)
	for {
		var status *string
		err := b.pool.QueryRow(ctx, `SELECT txid_status($1::bigint)`, b.s.args(xid)...).Scan(&status)
		switch {
		case err != nil:
			return fmt.Errorf("the COMMIT's answer was lost (%w), and so was the read back of its outcome: %v", cause, err)
		case status == nil: // too old to tell: the record says
			return b.readBack(ctx, c, core.StateDone, cause)
		case *status == "committed":
			return b.readBack(ctx, c, core.StateDone, cause)
		case *status == "aborted":
			return fmt.Errorf("the transaction rolled back, its COMMIT's answer lost: %w", cause)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the COMMIT's answer was lost (%w), and its transaction is still in progress", cause)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the COMMIT's answer was lost (%w), and so was the wait for its outcome: %v", cause, ctx.Err())
		case <-time.After(b.s.PollInterval):
		}
	}
}

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
