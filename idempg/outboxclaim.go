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
		RETURNING o.seq, o.key, o.idx, o.ordering_key, o.topic, o.payload, o.attempt, o.last_error, o.enqueued_ns, o.next_attempt_ns, o.trace,
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
