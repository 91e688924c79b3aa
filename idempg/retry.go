package idempg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/idemcore"
)

// again runs the fenced write w, and runs it again while it fails because
// its connection failed (connLost), for at most one Lease from the first
// failure, backing off from 10ms to 1s: the pool replaces a dead connection
// with a fresh one. A write whose answer was lost after it may have reached
// the server (ambiguous) is first resolved by readBack (nil: it committed;
// an error wrapping ErrFenced: another claim holds the key; the cause
// itself: not committed, so write again). Writing again is safe: each write
// is fenced by the claim's token, so it never overwrites another claim's
// record, however late. The last error is returned.
func (b *backend) again(ctx context.Context, w func() error, readBack func(cause error) error) error {
	p := connPace{lease: b.s.Lease}
	for retried := false; ; retried = true {
		err := w()
		if retried && errors.Is(err, idemcore.ErrFenced) {
			// The write this one repeats arrived late and landed first
			// (the read back came before it): done with this claim's
			// token is the outcome; another token is a real fence.
			return readBack(err)
		}
		if err == nil || !connLost(err) {
			return err
		}
		if ambiguous(err) {
			if rerr := readBack(err); rerr == nil || errors.Is(rerr, idemcore.ErrFenced) {
				return rerr
			}
		}
		if !p.wait(ctx) {
			return err
		}
	}
}

// connLost reports whether err is the failure of a statement's connection,
// not the statement's: an error the server did not answer (a dropped or
// reset connection, a write on a dead one, pgx's "conn closed"), a
// connection exception (SQLSTATE class 08), an administrator's or crash
// shutdown (57P01, 57P02, 57P03), or any FATAL or PANIC error (the server
// ended the session). A context's end is not one.
func connLost(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		var ne net.Error
		var ce *pgconn.ConnectError
		return errors.As(err, &ne) || errors.As(err, &ce) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
			errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err) || strings.Contains(err.Error(), "conn closed")
	}
	switch {
	case strings.HasPrefix(pe.Code, "08"), pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03":
		return true
	}
	return pe.Severity == "FATAL" || pe.Severity == "PANIC"
}

// readBack resolves a write whose outcome is unknown (cause) by reading the
// key's row: with c's token and state want, the write committed (nil; done,
// if not nil, gets the times the database stamped); with c's token and
// another state, it did not (cause); with another token or none, another
// owner took the key (ErrFenced).
func (b *backend) readBack(ctx context.Context, c *idemcore.Claim, want idemcore.State, cause error, done *idemcore.Record) error {
	var (
		fence              int64
		state              idemcore.State
		started, completed int64
	)
	err := b.readRow(ctx, `SELECT fence, state, started_ns, completed_ns FROM {schema}.idem_records WHERE key = $1::text`, []any{c.Key}, &fence, &state, &started, &completed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: the key's record is gone (the write's answer was lost: %v)", idemcore.ErrFenced, cause)
	case err != nil:
		return fmt.Errorf("the write's answer was lost (%w), and so was the read back: %v", cause, err)
	case idemcore.Fence(fence) != c.Token:
		return fmt.Errorf("%w: the write's answer was lost: %v", idemcore.ErrFenced, cause)
	case state == want:
		if done != nil {
			stamped(done, started, completed)
		}
		return nil
	}
	return cause
}

// connPace paces the tries of a statement whose connection failed (again,
// readRow): for at most one lease from the first failure, backing off from
// 10ms to 1s, while the pool replaces the dead connection.
type connPace struct {
	lease    time.Duration
	deadline time.Time
	backoff  time.Duration
}

// wait sleeps before the next try and reports whether to make it: false
// once the lease is used up or ctx ended.
func (p *connPace) wait(ctx context.Context) bool {
	if p.deadline.IsZero() {
		p.deadline, p.backoff = time.Now().Add(p.lease), 10*time.Millisecond
	}
	if !time.Now().Add(p.backoff).Before(p.deadline) {
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(p.backoff):
	}
	p.backoff = min(2*p.backoff, time.Second)
	return true
}

// readRow reads one row of q (with {schema} and {now}) into dest for a
// read back, trying again on a fresh connection while its connection fails
// (connLost), for at most one Lease, backing off from 10ms to 1s: the
// server that lost a write's answer may be restarting.
func (b *backend) readRow(ctx context.Context, q string, args []any, dest ...any) error {
	p := connPace{lease: b.s.Lease}
	for {
		err := b.pool.QueryRow(ctx, b.sql(q), b.s.args(args...)...).Scan(dest...)
		if err == nil || !connLost(err) || errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if !p.wait(ctx) {
			return err
		}
	}
}

// ambiguous reports whether err leaves a statement's outcome unknown: the
// connection failed after the statement may have reached the server. A
// FATAL error ends the session with the statement unanswered (the server
// may have ended it after a COMMIT it had not yet acknowledged), so it is
// ambiguous too; another error the server answered is the statement's own.
func ambiguous(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return connLost(err)
	}
	// pgconn.SafeToRetry cannot tell: a statement whose answer was lost to
	// an asynchronous read failure says "conn closed", safe to retry,
	// although it reached the server. A read back costs one query.
	return true
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
func (b *backend) commitOutcome(ctx context.Context, xid int64, c *idemcore.Claim, cause error) error {
	deadline := time.Now().Add(b.s.IdleInTransactionTimeout + b.s.LockTimeout)
	for {
		var status *string
		err := b.pool.QueryRow(ctx, `SELECT txid_status($1::bigint)`, b.s.args(xid)...).Scan(&status)
		switch {
		case err != nil:
			return fmt.Errorf("the COMMIT's answer was lost (%w), and so was the read back of its outcome: %v", cause, err)
		case status == nil: // too old to tell: the record says
			return b.readBack(ctx, c, idemcore.StateDone, cause, nil) // done's times came with its write
		case *status == "committed":
			return b.readBack(ctx, c, idemcore.StateDone, cause, nil) // done's times came with its write
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
