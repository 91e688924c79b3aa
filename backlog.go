package idem

import (
	"context"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/idemcore"
)

var _ idemcore.BacklogCounter = (*boltBackend)(nil)

// OutboxBacklog implements idemcore.BacklogCounter: one read transaction
// that counts the keys of the outbox and dead buckets (bbolt's
// Bucket.Stats, which walks each bucket's pages: its cost grows with the
// backlog, and no write waits for it).
func (b *boltBackend) OutboxBacklog(context.Context) (idemcore.OutboxBacklog, error) {
	var n idemcore.OutboxBacklog
	if err := b.settle(true); err != nil {
		return n, err
	}
	err := b.db.View(func(tx *bbolt.Tx) error {
		if bk := outboxBucket(tx); bk != nil {
			n.Pending = int64(bk.Stats().KeyN)
		}
		if bk := deadBucket(tx); bk != nil {
			n.Dead = int64(bk.Stats().KeyN)
		}
		return nil
	})
	return n, err
}

// OutboxBacklog counts the outbox's pending messages and dead letters
// (idemcore.Engine.OutboxBacklog) in one read transaction that walks the
// outbox's pages: for a gauge read at an exporter's interval. After Close
// it returns ErrClosed.
func (e *Engine) OutboxBacklog(ctx context.Context) (idemcore.OutboxBacklog, error) {
	return e.c.OutboxBacklog(ctx)
}
