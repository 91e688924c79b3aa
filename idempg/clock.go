package idempg

import (
	"context"
	"strconv"
	"time"
)

// The database's clock judges every time the backend stores or compares,
// for every process alike (see doc.go, "Clocks"): leases by {now}, the
// transaction's now(); the times of records and messages (the *_ns
// columns) by {now_ns}, statement_timestamp() in Unix nanoseconds (whole
// microseconds), so that each statement of a long transaction (DoTx's
// claim, then its done write) is stamped when it runs, and a statement that
// reads it twice reads one value.

// now is the SQL for the database's clock of leases, the tests' offset
// added.
func (b *backend) now() string {
	if d := b.offsetNow(); d != 0 {
		return "(now() + interval '" + strconv.FormatInt(d.Microseconds(), 10) + " microseconds')"
	}
	return "now()"
}

// nowNs is the SQL for the database's clock of records and messages, Unix
// ns, the tests' offset added (or their clock instead).
func (b *backend) nowNs() string {
	if b.fake != nil {
		return strconv.FormatInt(toNs(b.fake()), 10) + "::bigint"
	}
	ts := "statement_timestamp()"
	if d := b.offsetNow(); d != 0 {
		ts = "(statement_timestamp() + interval '" + strconv.FormatInt(d.Microseconds(), 10) + " microseconds')"
	}
	return "((extract(epoch FROM " + ts + ") * 1000000)::bigint * 1000)"
}

func (b *backend) offsetNow() time.Duration {
	if b.offset == nil {
		return 0
	}
	return b.offset()
}

// Clock reads the database's clock for the engine (idemcore.Info.Clock): the
// clock of every time the engine stamps or judges without a statement of
// its own to read it in.
func (b *backend) Clock(ctx context.Context) (time.Time, error) {
	var ns int64
	err := b.pool.QueryRow(ctx, b.sql(`SELECT {now_ns}`), b.s.args()...).Scan(&ns)
	return fromNs(ns), err
}

// leaseSQL is the SQL of a new lease's end.
func (b *backend) leaseSQL() string {
	return "(" + b.now() + " + interval '" + strconv.FormatInt(b.s.Lease.Microseconds(), 10) + " microseconds')"
}

// leftSQL is the time left until the instant in column col, in
// microseconds by the database's clock (negative once it has passed).
func leftSQL(col string) string {
	return "(extract(epoch FROM " + col + " - {now}) * 1000000)::bigint"
}
