package idempg

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// Scan implements idemcore.Backend: one REPEATABLE READ transaction, by key.
func (b *backend) Scan(ctx context.Context, fn func(r *idemcore.Record, err error) error) error {
	return b.inTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, b.sql(`SELECT `+recordColumns+` FROM {schema}.idem_records ORDER BY key`), b.s.args()...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r scanned
			if err := rows.Scan(r.dest()...); err != nil {
				return err
			}
			if err := fn(r.record()); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}
