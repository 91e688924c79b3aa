package idempg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// Forget implements idemcore.Backend: a started row whose lease another engine
// holds, unlapsed, is not deleted (ErrInProgress).
func (b *backend) Forget(ctx context.Context, key string) (bool, error) {
	if !storable(key) {
		return false, nil
	}
	tag, err := b.exec(ctx, b.notifying(`DELETE FROM {schema}.idem_records WHERE key = $1::text AND NOT `+liveElsewhereSQL), key, b.owner)
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() > 0 {
		return true, nil
	}
	var held bool
	err = b.pool.QueryRow(ctx, b.sql(`SELECT `+liveElsewhereSQL+` FROM {schema}.idem_records WHERE key = $1::text`), b.s.args(key, b.owner)...).Scan(&held)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	case held:
		return false, fmt.Errorf("%w: a live call of another engine holds the key", idemcore.ErrInProgress)
	}
	return false, nil
}

// liveElsewhereSQL is true for a row (its columns unqualified) that is a
// started record whose lease, held by another engine than $2, has not
// lapsed: a call running elsewhere, which no operator write may touch.
const liveElsewhereSQL = `(state = 1 AND lease_until > {now} AND owner IS DISTINCT FROM $2::text)`

// Resolve implements idemcore.Backend: fn runs with the row locked (FOR
// UPDATE); its record replaces the row with a new token, so that a claim
// still running is fenced off. A started row whose lease another engine
// holds, unlapsed, is refused with ErrInProgress before fn runs.
func (b *backend) Resolve(ctx context.Context, key string, fn func(cur *idemcore.Record) (*idemcore.Record, error)) error {
	if !storable(key) {
		_, err := fn(nil)
		if err == nil {
			err = fmt.Errorf("%w: key %q cannot be stored in Postgres", idemcore.ErrInvalidKey, key)
		}
		return err
	}
	return b.inTx(ctx, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var (
			r   scanned
			cur *idemcore.Record
		)
		var held bool
		err := tx.QueryRow(ctx, b.sql(`SELECT `+recordColumns+`, `+liveElsewhereSQL+` FROM {schema}.idem_records WHERE key = $1::text FOR UPDATE`),
			b.s.args(key, b.owner)...).Scan(append(r.dest(), &held)...)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		case held:
			return fmt.Errorf("%w: a live call of another engine holds the key", idemcore.ErrInProgress)
		default:
			if cur, err = r.record(); err != nil {
				return err
			}
		}
		rec, err := fn(cur)
		if err != nil {
			return err
		}
		if rec == nil {
			_, err = tx.Exec(ctx, b.sql(b.notifying(`DELETE FROM {schema}.idem_records WHERE key = $1::text`)), b.s.args(key)...)
			return err
		}
		return b.put(ctx, tx, rec)
	})
}

// put stores rec in tx in place of any row of its key, with a new token
// and, for a started record, a lapsed lease (no live call holds it).
func (b *backend) put(ctx context.Context, tx pgx.Tx, rec *idemcore.Record) error {
	has, code, msg := errFields(rec)
	var owner, lease any
	if rec.State == idemcore.StateStarted {
		owner, lease = b.owner, "epoch"
	}
	_, err := tx.Exec(ctx, b.sql(b.notifying(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns, response, has_error, error_code, error_message)
		VALUES ($1::text, $2::bigint, $3::smallint, $4::integer, nextval('{schema}.idem_fence'), $5::text, $6::timestamptz,
			$7::bigint, $8::bigint, $9::bigint, $10::boolean, $11::bigint, $12::bytea, $13::boolean, $14::bytea, $15::bytea)
		ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, state = EXCLUDED.state, attempt = EXCLUDED.attempt,
			fence = EXCLUDED.fence, owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until, started_ns = EXCLUDED.started_ns,
			completed_ns = EXCLUDED.completed_ns, retention_ns = EXCLUDED.retention_ns,
			kept_until_resolved = EXCLUDED.kept_until_resolved, expires_ns = EXCLUDED.expires_ns, response = EXCLUDED.response,
			has_error = EXCLUDED.has_error, error_code = EXCLUDED.error_code, error_message = EXCLUDED.error_message`)),
		b.s.args(rec.Key, int64(rec.Fingerprint), int16(rec.State), rec.Attempt, owner, lease,
			toNs(rec.StartedAt), toNs(rec.CompletedAt), int64(rec.Retention), rec.KeptUntilResolved, expiresNs(rec),
			rec.Response, has, code, msg)...)
	return err
}
