package idempg

import (
	"context"
	"fmt"
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

// stmts returns the backend's statements that carry their own settings
// (stmtsIn).
func (b *backend) stmts() *statements { return b.stmtsIn(false) }

// stmtsIn returns the backend's statements for a connection whose session
// has the backend's settings (AfterConnect), or for any other: made once,
// or per call while the tests move the database's clock (export_test.go),
// whose SQL then changes from call to call.
func (b *backend) stmtsIn(session bool) *statements {
	if f := b.fixed[boolIndex(session)]; f != nil {
		return f
	}
	return b.makeStatements(session)
}

func boolIndex(v bool) int {
	if v {
		return 1
	}
	return 0
}

// makeStatements makes the backend's statements, for a connection whose
// session has the backend's settings if session.
func (b *backend) makeStatements(session bool) *statements {
	fresh, claim := limit{session: session, param: 7}, limit{session: session, param: 7}
	done := limit{session: session, param: 9}
	return &statements{
		lookup:         b.sql(lookupSQL),
		claimFreshOne:  b.sql(b.claimFreshSQL(oneSrc, fresh)),
		claimFreshMany: b.sql(b.claimFreshSQL(manySrc, fresh)),
		claimOne:       b.sql(b.claimSQL(oneSrc, `ARRAY[$2::text]`, claim)),
		claimMany:      b.sql(b.claimSQL(manySrc, `$2::text[]`, claim)),
		complete:       b.sql(b.completeOneSQL(done)),
		completeMany:   b.sql(b.completeManySQL(done)),
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

// limit is how one of Do's statements bounds its lock waits: with limitCTE
// from its parameter param (the last), or, in a session whose settings do
// (session: AfterConnect), with nothing of its own and no such parameter.
type limit struct {
	session bool
	param   int
}

// with starts the statement: WITH limitCTE (unless session) and ctes.
func (l limit) with(ctes ...string) string {
	if !l.session {
		ctes = append([]string{fmt.Sprintf(limitCTE, l.param)}, ctes...)
	}
	if len(ctes) == 0 {
		return ""
	}
	return "WITH " + strings.Join(ctes, ",\n") + " "
}

// join is the CTE's place among the rows of a FROM list (after a comma).
func (l limit) join() string {
	if l.session {
		return ""
	}
	return ", idem_limit"
}

// from is the CTE as an UPDATE's FROM clause.
func (l limit) from() string {
	if l.session {
		return ""
	}
	return " FROM idem_limit"
}

// where is the WHERE clause of cond (none if empty) and the CTE's join
// condition, which makes the rows wait for the setting.
func (l limit) where(cond string) string {
	switch {
	case !l.session && cond != "":
		return " WHERE idem_limit.v IS NOT NULL AND " + cond
	case !l.session:
		return " WHERE idem_limit.v IS NOT NULL"
	case cond != "":
		return " WHERE " + cond
	}
	return ""
}

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

// beginSQL is how DoTx's transactions begin: BEGIN and the transaction's
// settings (those of limitXidSQL, lock_timeout and
// idle_in_transaction_session_timeout left out if session: AfterConnect set
// them for the session) in one simple query, one round trip, as pgx sends
// TxOptions.BeginQuery. The values are the backend's own (whole ms, and a
// schema name of [a-z_][a-z0-9_]*, quoted), so newBackend makes both texts
// once (backend.begins).
func (b *backend) beginSQL(session bool) string {
	set := "set_config('idem.schema', '" + b.s.Schema + "', true), set_config('idem.tx', 'on', true)"
	if !session {
		set = "set_config('lock_timeout', '" + ms(b.s.LockTimeout) + "', true), set_config('idle_in_transaction_session_timeout', '" +
			ms(b.s.IdleInTransactionTimeout) + "', true), " + set
	}
	return "BEGIN; SELECT " + set
}

// ms is d in whole milliseconds (at least 1), as a setting's text.
func ms(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }
