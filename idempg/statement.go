package idempg

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sql returns q with {schema}, {now} and {now_ns} replaced.
func (b *backend) sql(q string) string {
	q = b.s.sql(q)
	if strings.Contains(q, "{now_ns}") {
		q = strings.ReplaceAll(q, "{now_ns}", b.nowNs())
	}
	return strings.ReplaceAll(q, "{now}", b.now())
}

// exec runs the write q with args (see write) and returns the rows it
// changed (a notifying statement's rows count as its changed rows).
func (b *backend) exec(ctx context.Context, q string, args ...any) (tag pgconn.CommandTag, err error) {
	err = b.write(ctx, q, args, func(br pgx.BatchResults) error {
		tag, err = br.Exec()
		return err
	})
	return tag, err
}

// writeRow runs the write q with args (see write) and scans its one row
// into dest; no row gives pgx.ErrNoRows.
func (b *backend) writeRow(ctx context.Context, q string, args []any, dest ...any) error {
	return b.write(ctx, q, args, func(br pgx.BatchResults) error { return br.QueryRow().Scan(dest...) })
}

// limitSQL sets lock_timeout and idle_in_transaction_session_timeout for the
// current transaction only (is_local).
const limitSQL = `SELECT set_config('lock_timeout', $1::text, true), set_config('idle_in_transaction_session_timeout', $2::text, true)`

// write sends limitSQL and q in one batch: one round trip, and one implicit
// transaction, so that q's wait for a row lock (a DoTx transaction of
// another process holding the key) is bounded by Options.LockTimeout
// without session state (PgBouncer in transaction pooling mode keeps none).
func (b *backend) write(ctx context.Context, q string, args []any, read func(pgx.BatchResults) error) error {
	batch := &pgx.Batch{}
	batch.Queue(limitSQL, ms(b.s.LockTimeout), ms(b.s.IdleInTransactionTimeout))
	batch.Queue(b.sql(q), args...)
	br := b.pool.SendBatch(ctx, batch)
	_, err := br.Exec()
	if err == nil {
		err = read(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// inTx runs fn in a transaction with the session limits set (SET LOCAL
// lock_timeout and idle_in_transaction_session_timeout), committing if it
// returns nil.
func (b *backend) inTx(ctx context.Context, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, b.pool, opts, func(tx pgx.Tx) error {
		if err := b.limit(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

// limit sets the transaction's lock_timeout and
// idle_in_transaction_session_timeout, for this transaction only.
//
// It also sets idem.schema to Options.Schema, so that a DoTx fn can find
// the engine's schema: current_setting('idem.schema').
func (b *backend) limit(ctx context.Context, tx pgx.Tx) error {
	_, err := b.limitXid(ctx, tx)
	return err
}

// limitXid is limit, returning the transaction's id (txid_current) from
// the same statement: one round trip.
func (b *backend) limitXid(ctx context.Context, tx pgx.Tx) (xid int64, err error) {
	err = tx.QueryRow(ctx, `SELECT txid_current() FROM (SELECT set_config('lock_timeout', $1::text, true), set_config('idle_in_transaction_session_timeout', $2::text, true),
		set_config('idem.schema', $3::text, true), set_config('idem.tx', 'on', true)) AS s`,
		b.s.args(ms(b.s.LockTimeout), ms(b.s.IdleInTransactionTimeout), b.s.Schema)...).Scan(&xid)
	return xid, err
}

// ms is d in whole milliseconds (at least 1), as a setting's text.
func ms(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }
