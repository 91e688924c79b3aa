package idempg

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// Enqueue implements idemcore.Backend: an INSERT in fn's transaction, stamped
// by the database's clock. The notification that wakes the dispatchers of
// other processes (at the commit) is sent once per transaction, not per
// message: by the done write of the transaction's first call that enqueued
// (runOne), outside fn's own savepoints, which fn may roll back. A tx that
// is not a RunTx fn's notifies here.
func (b *backend) Enqueue(tx pgx.Tx, m *idemcore.Message) error {
	ctx := context.Background()
	_, inRunTx := txs.Load(tx)
	notify := !b.s.PollOnly && !inRunTx
	q := `INSERT INTO {schema}.idem_outbox (key, idx, ordering_key, topic, payload, enqueued_ns, next_attempt_ns, trace)
		VALUES ($1::text, $2::integer, $3::text, $4::text, $5::bytea, {now_ns}, $6::bigint, $7::bytea) RETURNING seq, enqueued_ns`
	if notify {
		q = `WITH m AS (` + q + `) SELECT seq, enqueued_ns, pg_notify('` + b.s.channel() + `_outbox', '') FROM m`
	} else {
		q = `WITH m AS (` + q + `) SELECT seq, enqueued_ns, NULL FROM m`
	}
	var (
		seq, enqueued int64
		ignored       any
	)
	args := b.s.args(m.Key, m.Index, m.OrderingKey, m.Topic, m.Payload, toNs(m.NextAttemptAt), traceBytes(m.Trace))
	if err := tx.QueryRow(ctx, b.sql(q), args...).Scan(&seq, &enqueued, &ignored); err != nil {
		return err
	}
	m.Seq, m.EnqueuedAt = uint64(seq), fromNs(enqueued)
	return nil
}

// Messages implements idemcore.Backend: one REPEATABLE READ snapshot.
func (b *backend) Messages(ctx context.Context, fn func(m *idemcore.Message, err error) error) error {
	return b.inTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		for _, part := range []struct {
			q    string
			scan func(pgx.Row) (*idemcore.Message, error)
		}{
			{`SELECT ` + outboxColumns + ` FROM {schema}.idem_outbox ORDER BY seq`, scanMessage},
			{`SELECT ` + deadColumns + ` FROM {schema}.idem_dead_letters ORDER BY seq`, scanDead},
		} {
			rows, err := tx.Query(ctx, b.sql(part.q), b.s.args()...)
			if err != nil {
				return err
			}
			for rows.Next() {
				m, err := part.scan(rows)
				if err != nil {
					rows.Close()
					return err
				}
				if err := fn(m, nil); err != nil {
					rows.Close()
					return err
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		return nil
	})
}
