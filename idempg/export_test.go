package idempg

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
)

// SetClockOffset makes the backends opened with o add offset() to the
// database's clock in every statement that reads it (leases, the times of
// records and messages): the tests' way to move the database's clock, never
// its client's.
func SetClockOffset(o *Options, offset func() time.Duration) { o.clockOffset = offset }

// SetClock makes the backends opened with o read now() instead of the
// database's clock for the times of records and messages (their stamps,
// retention, due times): a clock the test stops and moves, so that a
// window's last nanosecond can be told from the next (the conformance
// suite's clock seam). Leases keep the database's clock, plus
// SetClockOffset's offset: moving now() by hours lapses no running call's
// lease and no dispatcher's claim.
func SetClock(o *Options, now func() time.Time) { o.clock = now }

// OpenWrapped is Open with the state machine over wrap(the backend), for
// the conformance suite's test backends.
func OpenWrapped(ctx context.Context, pool *pgxpool.Pool, opts *Options, eo *idemcore.Options, wrap func(idemcore.Backend[pgx.Tx]) idemcore.Backend[pgx.Tx]) (*Engine, error) {
	return open(ctx, pool, opts, eo, wrap)
}

// MigrationVersions is the versions of the build's migrations, ascending.
func MigrationVersions() []int {
	var vs []int
	for _, m := range migrations {
		vs = append(vs, m.version)
	}
	return vs
}
