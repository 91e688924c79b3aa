package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// Lookup implements idemcore.Backend: one SELECT by key of the record's
// columns and no more (recordValues), which reads the database's clock too
// (at), by which the engine judges the record.
func (b *backend) Lookup(ctx context.Context, q idemcore.Lookup) (*idemcore.Record, time.Time, error) {
	if !storable(q.Key) {
		return nil, time.Time{}, nil
	}
	var (
		r  scanned
		at int64
	)
	err := queryRow(ctx, b.pool, b.stmts().lookup, b.s.args(q.Key), append(r.values(), &at)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	r.rec.Key = q.Key
	rec, err := r.record()
	return rec, fromNs(at), err
}

// lookupSQL is Lookup's statement.
const lookupSQL = `SELECT ` + recordValues + `, {now_ns} FROM {schema}.idem_records WHERE key = $1::text`

// Owner implements idemcore.Backend: a started record is owned while its lease
// has not lapsed by the database's clock.
func (b *backend) Owner(ctx context.Context, rec *idemcore.Record) (idemcore.Ownership, error) {
	var (
		owner  *string
		left   *int64 // µs until the lease lapses; ≤ 0 once it has
		before = time.Now()
	)
	err := b.pool.QueryRow(ctx, b.sql(`SELECT owner, (extract(epoch FROM lease_until - {now}) * 1000000)::bigint
		FROM {schema}.idem_records WHERE key = $1::text AND state <> 2 AND attempt = $2::integer AND started_ns = $3::bigint`),
		b.s.args(rec.Key, rec.Attempt, toNs(rec.StartedAt))...).Scan(&owner, &left)
	if errors.Is(err, pgx.ErrNoRows) {
		// The record changed since it was read: Claim says how.
		return idemcore.Ownership{}, nil
	}
	if err != nil {
		return idemcore.Ownership{}, err
	}
	if owner == nil || left == nil {
		// No claim writes a started row without both (the table's CHECK
		// constraints said so until version 7): a row broken by hand.
		return idemcore.Ownership{}, fmt.Errorf("%w: key %q: a started record without an owner or a lease", idemcore.ErrCorrupt, rec.Key)
	}
	if *left <= 0 || *owner == b.owner {
		// Lapsed; or claimed by this engine, whose calls the engine knows:
		// none runs for the key while it asks (it holds the key), so the
		// record is an interrupted execution of this engine's, recovered at
		// once, as on bbolt.
		return idemcore.Ownership{Owner: *owner}, nil
	}
	return idemcore.Ownership{Owned: true, Owner: *owner, Until: before.Add(time.Duration(*left) * time.Microsecond)}, nil
}
