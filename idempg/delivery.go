package idempg

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/idemcore"
)

// Delivered implements idemcore.Backend. It is not fenced: the handler's
// success is the message's delivery, whoever holds it now (another
// dispatcher delivering it meanwhile finds it gone). A failure keeps the
// claim's entry, for the Failed that follows.
func (b *backend) Delivered(ctx context.Context, m *idemcore.Message) error {
	tag, err := b.exec(ctx, `DELETE FROM {schema}.idem_outbox WHERE seq = $1::bigint`, int64(m.Seq))
	if err != nil {
		return err
	}
	b.endClaim(m)
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: outbox message %d", idemcore.ErrMessageNotFound, m.Seq)
	}
	return nil
}

// Failed implements idemcore.Backend: the message's new attempt count, error
// and next attempt, its claim dropped; or, if m.Dead, its move to the dead
// letters in one statement. Both are fenced by the claim's token: a claim
// that lapsed and was taken since (another dispatcher's, or an operator's
// RetryDead of the dead letter another dispatcher made of it) is not this
// dispatcher's to write, and gives ErrMessageNotFound, writing nothing. The
// claim's entry ends either way.
func (b *backend) Failed(ctx context.Context, m *idemcore.Message) error {
	token, known, stale := b.endClaim(m)
	if stale {
		return fmt.Errorf("%w: outbox message %d: claimed again since", idemcore.ErrMessageNotFound, m.Seq)
	}
	var n int64
	var err error
	if m.Dead {
		err = b.writeRow(ctx, `WITH d AS (DELETE FROM {schema}.idem_outbox WHERE seq = $1::bigint AND (claim_token = $6::bigint OR NOT $7::boolean) RETURNING *),
			i AS (INSERT INTO {schema}.idem_dead_letters (seq, key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, dead_ns, retention_ns, expires_ns, trace)
				SELECT seq, key, idx, ordering_key, topic, payload, $2::integer, $3::bytea, enqueued_ns, $4::bigint, $5::bigint, $4::bigint + $5::bigint, trace FROM d RETURNING 1)
			SELECT count(*) FROM i`,
			[]any{int64(m.Seq), m.Failures, errBytes(m.LastError), toNs(m.DeadAt), int64(m.DeadLetterRetention), token, known}, &n)
	} else {
		var tag interface{ RowsAffected() int64 }
		tag, err = b.exec(ctx, `UPDATE {schema}.idem_outbox SET attempt = $2::integer, last_error = $3::bytea,
			next_attempt_ns = $4::bigint, claimed_by = NULL, claim_until = NULL
			WHERE seq = $1::bigint AND (claim_token = $5::bigint OR NOT $6::boolean)`,
			int64(m.Seq), m.Failures, errBytes(m.LastError), toNs(m.NextAttemptAt), token, known)
		if err == nil {
			n = tag.RowsAffected()
		}
	}
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: outbox message %d (or its claim was taken since)", idemcore.ErrMessageNotFound, m.Seq)
	}
	return nil
}
