package idempg

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// Outbox columns, in the order scanMessage reads them.
const outboxColumns = `seq, key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, next_attempt_ns`

// Dead letter columns, in the order scanDead reads them.
const deadColumns = `seq, key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, dead_ns, retention_ns`

func scanMessage(row pgx.Row) (*idemcore.Message, error) { return scanMessageAnd(row) }

// scanMessageAnd scans the outbox columns of row, then its further columns
// into extra.
func scanMessageAnd(row pgx.Row, extra ...any) (*idemcore.Message, error) {
	var (
		m             idemcore.Message
		seq, enq, nxt int64
		lastErr       []byte // bytea: any bytes (migration 3)
	)
	if err := row.Scan(append([]any{&seq, &m.Key, &m.Index, &m.OrderingKey, &m.Topic, &m.Payload, &m.Failures, &lastErr, &enq, &nxt}, extra...)...); err != nil {
		return nil, err
	}
	m.LastError = string(lastErr)
	m.Seq, m.EnqueuedAt, m.NextAttemptAt = uint64(seq), fromNs(enq), fromNs(nxt)
	return &m, nil
}

func scanDead(row pgx.Row) (*idemcore.Message, error) {
	var (
		m                   idemcore.Message
		seq, enq, dead, ret int64
		lastErr             []byte // bytea: any bytes (migration 3)
	)
	if err := row.Scan(&seq, &m.Key, &m.Index, &m.OrderingKey, &m.Topic, &m.Payload, &m.Failures, &lastErr, &enq, &dead, &ret); err != nil {
		return nil, err
	}
	m.LastError = string(lastErr)
	m.Seq, m.EnqueuedAt, m.DeadAt, m.DeadLetterRetention, m.Dead = uint64(seq), fromNs(enq), fromNs(dead), time.Duration(ret), true
	return &m, nil
}

// errBytes is a last error for its bytea column: never NULL, any bytes.
func errBytes(s string) []byte { return append([]byte{}, s...) }

// Enqueue implements idemcore.Backend: an INSERT in fn's transaction, stamped
// by the database's clock, and a notification (at its commit) that wakes
// the dispatchers of other processes.
func (b *backend) Enqueue(tx pgx.Tx, m *idemcore.Message) error {
	ctx := context.Background()
	q := `INSERT INTO {schema}.idem_outbox (key, idx, ordering_key, topic, payload, enqueued_ns, next_attempt_ns)
		VALUES ($1::text, $2::integer, $3::text, $4::text, $5::bytea, {now_ns}, $6::bigint) RETURNING seq, enqueued_ns`
	if !b.s.PollOnly {
		q = `WITH m AS (` + q + `) SELECT seq, enqueued_ns, pg_notify('` + b.s.channel() + `_outbox', '') FROM m`
	} else {
		q = `WITH m AS (` + q + `) SELECT seq, enqueued_ns, NULL FROM m`
	}
	var (
		seq, enqueued int64
		ignored       any
	)
	args := b.s.args(m.Key, m.Index, m.OrderingKey, m.Topic, m.Payload, toNs(m.NextAttemptAt))
	if err := tx.QueryRow(ctx, b.sql(q), args...).Scan(&seq, &enqueued, &ignored); err != nil {
		return err
	}
	m.Seq, m.EnqueuedAt = uint64(seq), fromNs(enqueued)
	return nil
}

// ClaimDue implements idemcore.Backend: the due heads of ordering keys (the
// pending message of lowest seq of each, not held by a live claim), locked
// with FOR UPDATE SKIP LOCKED so that dispatchers of several processes
// never claim one message at once, then marked as claimed for one lease
// (database clock), stamped in Due.ClaimUntil from a local reading taken
// before the statement was sent. A claim whose dispatcher died lapses with
// its lease and the message is claimed again: delivery is at least once.
// While a handler runs, the dispatcher renews its claim every
// Options.Heartbeat (RenewClaim), so a handler slower than Options.Lease
// keeps its message; only a dispatcher cut off from the database (or
// frozen) longer than a lease loses it to another, and its handler's
// context ends then. Rows always decode: nothing is quarantined, and
// Due.Next is left zero (the dispatcher polls). A message is due by the
// database's clock (now is not read).
func (b *backend) ClaimDue(ctx context.Context, _ time.Time, limit int) (idemcore.Due, error) {
	if limit <= 0 {
		return idemcore.Due{}, nil
	}
	before := time.Now()
	rows, err := b.pool.Query(ctx, b.sql(`WITH heads AS (
			SELECT o.seq FROM {schema}.idem_outbox AS o
			WHERE o.next_attempt_ns <= {now_ns}
				AND (o.claim_until IS NULL OR o.claim_until <= {now})
				AND NOT EXISTS (SELECT 1 FROM {schema}.idem_outbox AS p WHERE p.ordering_key = o.ordering_key AND p.seq < o.seq)
			ORDER BY o.seq LIMIT $1::integer
			FOR UPDATE OF o SKIP LOCKED)
		UPDATE {schema}.idem_outbox AS o SET claimed_by = $2::text, claim_until = `+b.leaseSQL()+`,
			claim_token = nextval('{schema}.idem_fence')
		FROM heads WHERE o.seq = heads.seq
		RETURNING o.seq, o.key, o.idx, o.ordering_key, o.topic, o.payload, o.attempt, o.last_error, o.enqueued_ns, o.next_attempt_ns,
			`+leftSQL("o.claim_until")+`, o.claim_token`),
		b.s.args(limit, b.owner)...)
	if err != nil {
		return idemcore.Due{}, err
	}
	left := int64(math.MaxInt64)
	var tokens []int64
	ms, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*idemcore.Message, error) {
		var l, token int64
		m, err := scanMessageAnd(row, &l, &token)
		left = min(left, l)
		tokens = append(tokens, token)
		return m, err
	})
	if err != nil {
		return idemcore.Due{}, err
	}
	if len(ms) == 0 {
		return idemcore.Due{}, nil
	}
	for i, m := range ms {
		b.outboxClaims.Store(m.Seq, outboxClaim{m: m, token: tokens[i]})
	}
	// RETURNING follows no order: deliver in seq order.
	sortBySeq(ms)
	return idemcore.Due{Messages: ms, ClaimUntil: before.Add(time.Duration(left) * time.Microsecond)}, nil
}

func sortBySeq(ms []*idemcore.Message) {
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && ms[j].Seq < ms[j-1].Seq; j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
}

// RenewClaim implements idemcore.Backend: one UPDATE moves m's claim, if it is
// still this engine's (claimed_by, and a claim not lapsed), to a new lease
// from the database's clock, whose end it returns stamped as ClaimDue's.
func (b *backend) RenewClaim(ctx context.Context, m *idemcore.Message) (time.Time, error) {
	before := time.Now()
	var left int64
	err := b.writeRow(ctx, `UPDATE {schema}.idem_outbox SET claim_until = `+b.leaseSQL()+`
		WHERE seq = $1::bigint AND claimed_by = $2::text AND claim_until > {now}
		RETURNING `+leftSQL("claim_until"), []any{int64(m.Seq), b.owner}, &left)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, fmt.Errorf("%w: renewing the claim of outbox message %d", idemcore.ErrFenced, m.Seq)
	}
	if err != nil {
		return time.Time{}, err
	}
	return before.Add(time.Duration(left) * time.Microsecond), nil
}

// outboxClaim is a claim of the dispatcher's, as ClaimDue made it: the
// message it handed out and the claim's token.
type outboxClaim struct {
	m     *idemcore.Message
	token int64
}

// endClaim ends the entry of m's claim and returns its token: known is
// false for a message this dispatcher's ClaimDue did not hand out (then the
// write is not fenced); stale is true when it has claimed m's seq again
// since (m is an older claim's, which lapsed; the newer entry stays).
func (b *backend) endClaim(m *idemcore.Message) (token int64, known, stale bool) {
	v, ok := b.outboxClaims.Load(m.Seq)
	if !ok {
		return 0, false, false
	}
	c := v.(outboxClaim)
	if c.m != m {
		return 0, true, true
	}
	b.outboxClaims.CompareAndDelete(m.Seq, c)
	return c.token, true, false
}

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
			i AS (INSERT INTO {schema}.idem_dead_letters (seq, key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, dead_ns, retention_ns, expires_ns)
				SELECT seq, key, idx, ordering_key, topic, payload, $2::integer, $3::bytea, enqueued_ns, $4::bigint, $5::bigint, $4::bigint + $5::bigint FROM d RETURNING 1)
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
		q := `INSERT INTO {schema}.idem_outbox (seq, key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, next_attempt_ns)
			VALUES ($1::bigint, $2::text, $3::integer, $4::text, $5::text, $6::bytea, $7::integer, $8::bytea, $9::bigint, $10::bigint)`
		if !b.s.PollOnly {
			q = `WITH m AS (` + q + ` RETURNING seq) SELECT pg_notify('` + b.s.channel() + `_outbox', '') FROM m`
		}
		_, err = tx.Exec(ctx, b.sql(q), b.s.args(int64(seq), m.Key, m.Index, m.OrderingKey, m.Topic, m.Payload, m.Failures, errBytes(m.LastError),
			toNs(m.EnqueuedAt), toNs(m.NextAttemptAt))...)
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

// leftSQL is the time left until the instant in column col, in
// microseconds by the database's clock (negative once it has passed).
func leftSQL(col string) string {
	return "(extract(epoch FROM " + col + " - {now}) * 1000000)::bigint"
}
