package idempg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// RetryDead implements idemcore.Backend: the dead letter, locked, revived, and
// put back in the outbox under its old seq (its place in its ordering key).
func (b *backend) RetryDead(ctx context.Context, seq uint64, revive func(m *idemcore.Message) error) error {
	return b.inTx(ctx, pgx.TxOptions{}, func(tx pgx.Tx) error {
		m, err := scanDead(tx.QueryRow(ctx, b.sql(`SELECT `+deadColumns+` FROM {schema}.idem_dead_letters WHERE seq = $1::bigint FOR UPDATE`), b.s.args(int64(seq))...))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: dead letter %d", idemcore.ErrMessageNotFound, seq)
		}
		if err != nil {
			return err
		}
		if err := revive(m); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, b.sql(`DELETE FROM {schema}.idem_dead_letters WHERE seq = $1::bigint`), b.s.args(int64(seq))...); err != nil {
			return err
		}
		q := `INSERT INTO {schema}.idem_outbox (seq, key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, next_attempt_ns, trace)
			VALUES ($1::bigint, $2::text, $3::integer, $4::text, $5::text, $6::bytea, $7::integer, $8::bytea, $9::bigint, $10::bigint, $11::bytea)`
		if !b.s.PollOnly {
			q = `WITH m AS (` + q + ` RETURNING seq) SELECT pg_notify('` + b.s.channel() + `_outbox', '') FROM m`
		}
		_, err = tx.Exec(ctx, b.sql(q), b.s.args(int64(seq), m.Key, m.Index, m.OrderingKey, m.Topic, m.Payload, m.Failures, errBytes(m.LastError),
			toNs(m.EnqueuedAt), toNs(m.NextAttemptAt), traceBytes(m.Trace))...)
		return err
	})
}

// DropDead implements idemcore.Backend.
func (b *backend) DropDead(ctx context.Context, seq uint64) error {
	tag, err := b.exec(ctx, `DELETE FROM {schema}.idem_dead_letters WHERE seq = $1::bigint`, int64(seq))
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: dead letter %d", idemcore.ErrMessageNotFound, seq)
	}
	return nil
}

// PruneDead implements idemcore.Backend: batches of at most limit dead letters
// by seq, each judged by expired and the expired ones deleted in the
// batch's transaction.
func (b *backend) PruneDead(ctx context.Context, expired func(m *idemcore.Message) bool, limit int) (int, error) {
	if limit <= 0 {
		limit = b.s.PruneBatch
	}
	deleted := 0
	after := int64(-1)
	for {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		n := 0
		err := b.inTx(ctx, pgx.TxOptions{}, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, b.sql(`SELECT `+deadColumns+` FROM {schema}.idem_dead_letters WHERE seq > $1::bigint ORDER BY seq LIMIT $2::integer FOR UPDATE SKIP LOCKED`), b.s.args(after, limit)...)
			if err != nil {
				return err
			}
			ms, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*idemcore.Message, error) { return scanDead(row) })
			if err != nil {
				return err
			}
			n = len(ms)
			var gone []int64
			for _, m := range ms {
				after = int64(m.Seq)
				if expired(m) {
					gone = append(gone, int64(m.Seq))
				}
			}
			if len(gone) == 0 {
				return nil
			}
			tag, err := tx.Exec(ctx, b.sql(`DELETE FROM {schema}.idem_dead_letters WHERE seq = ANY($1::bigint[])`), b.s.args(gone)...)
			if err == nil {
				deleted += int(tag.RowsAffected())
			}
			return err
		})
		if err != nil {
			return deleted, err
		}
		if n < limit {
			return deleted, nil
		}
	}
}
