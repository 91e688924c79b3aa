package idempg

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
)

// SetClockOffset makes the backends opened with o add offset() to the
// database's clock in every statement that judges a lease: the tests' way
// to move the database's clock, never its client's.
func SetClockOffset(o *Options, offset func() time.Duration) { o.clockOffset = offset }

// OpenWrapped is Open with the state machine over wrap(the backend), for
// the conformance suite's test backends.
func OpenWrapped(ctx context.Context, pool *pgxpool.Pool, opts *Options, eo *idemcore.Options, wrap func(idemcore.Backend[pgx.Tx]) idemcore.Backend[pgx.Tx]) (*Engine, error) {
	return open(ctx, pool, opts, eo, wrap)
}
