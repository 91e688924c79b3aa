package idempg

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// statements are the SQL texts of the statements every Do sends, with the
// schema, the clock and the channel substituted once per backend, so that
// a call neither builds nor substitutes them again and pgx's statement
// cache (prepared once per connection) finds them by the same text.
type statements struct {
	lookup                        string // Lookup
	claimFreshOne, claimFreshMany string // a lone claim of a key no row holds, a batch's (claim.go)
	claimOne, claimMany           string // a lone claim of a free key, a batch's (claim.go)
	complete, completeMany        string // a lone completion, a batch's (complete.go)
	// DoTx's claim of a free key, its completion, and its completion that
	// wakes the other processes' dispatchers (tx.go).
	txClaim, txComplete, txCompleteWake string
}

// stmts returns the backend's statements: made once, or per call while the
// tests move the database's clock (export_test.go), whose SQL then changes
// from call to call.
func (b *backend) stmts() *statements {
	if b.fixed != nil {
		return b.fixed
	}
	return b.makeStatements()
}

// makeStatements makes the backend's statements.
func (b *backend) makeStatements() *statements {
	return &statements{
		lookup:         b.sql(lookupSQL),
		claimFreshOne:  b.sql(b.claimFreshSQL(oneSrc)),
		claimFreshMany: b.sql(b.claimFreshSQL(manySrc)),
		claimOne:       b.sql(b.claimSQL(oneSrc, `ARRAY[$2::text]`)),
		claimMany:      b.sql(b.claimSQL(manySrc, `$2::text[]`)),
		complete:       b.sql(b.completeOneSQL()),
		completeMany:   b.sql(b.completeManySQL()),
		txClaim:        b.sql(b.txClaimSQL()),
		txComplete:     b.sql(b.txCompleteSQL(false)),
		txCompleteWake: b.sql(b.txCompleteSQL(true)),
	}
}

// oneSrc and manySrc are the claim statements' rows of keys: one claim's
// values ($2 to $6), or the unnest of a batch's arrays.
const (
	oneSrc  = `(VALUES ($2::text, $3::bigint, $4::integer, $5::bigint, $6::boolean))`
	manySrc = `unnest($2::text[], $3::bigint[], $4::integer[], $5::bigint[], $6::boolean[])`
)

// limitCTE sets lock_timeout for the statement's own (implicit) transaction,
// from the statement's parameter $%d (milliseconds, as text): a CTE the
// statement's rows join (FROM idem_limit WHERE idem_limit.v IS NOT NULL),
// so that it is set before any row is written or locked, with no statement
// of its own (a round trip's parse, bind and execute, and no session state,
// which PgBouncer in transaction pooling mode does not keep). A statement
// alone in its transaction is never idle in it:
// idle_in_transaction_session_timeout has nothing to bound there.
const limitCTE = `idem_limit AS MATERIALIZED (SELECT set_config('lock_timeout', $%d::text, true) AS v)`

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
	err = tx.QueryRow(ctx, limitXidSQL, b.s.args(ms(b.s.LockTimeout), ms(b.s.IdleInTransactionTimeout), b.s.Schema)...).Scan(&xid)
	return xid, err
}

// limitXidSQL is limitXid's statement: $1 lock_timeout and $2
// idle_in_transaction_session_timeout (ms, as text), $3 the schema.
const limitXidSQL = `SELECT txid_current() FROM (SELECT set_config('lock_timeout', $1::text, true), set_config('idle_in_transaction_session_timeout', $2::text, true),
		set_config('idem.schema', $3::text, true), set_config('idem.tx', 'on', true)) AS s`

// ms is d in whole milliseconds (at least 1), as a setting's text.
func ms(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }
