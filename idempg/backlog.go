package idempg

import (
	"context"

	"github.com/idemkit/idem/idemcore"
)

var _ idemcore.BacklogCounter = (*backend)(nil)

// OutboxBacklog implements idemcore.BacklogCounter: one statement, one
// round trip, counting the rows of idem_outbox and idem_dead_letters in one
// snapshot. Each count(*) reads its whole table (an index-only scan at best,
// with a vacuumed visibility map): its cost grows with the backlog, so read
// it at a metrics exporter's interval (seconds), not per call.
func (b *backend) OutboxBacklog(ctx context.Context) (idemcore.OutboxBacklog, error) {
	var n idemcore.OutboxBacklog
	err := b.pool.QueryRow(ctx, b.sql(`SELECT (SELECT count(*) FROM {schema}.idem_outbox), (SELECT count(*) FROM {schema}.idem_dead_letters)`), b.s.args()...).Scan(&n.Pending, &n.Dead)
	return n, err
}

// OutboxBacklog counts the outbox's pending messages and dead letters
// (idemcore.Engine.OutboxBacklog): one statement that reads both tables
// whole, its cost growing with the backlog; for a gauge read at an
// exporter's interval. After Close it returns idemcore.ErrClosed.
func (e *Engine) OutboxBacklog(ctx context.Context) (idemcore.OutboxBacklog, error) {
	return e.c.OutboxBacklog(ctx)
}
