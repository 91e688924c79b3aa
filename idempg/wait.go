package idempg

import (
	"context"
	"time"
)

// WaitChange implements idemcore.Backend: a notification for key, or one poll
// period, or the end of ctx.
//
// Unless PollOnly, it subscribes to key's notifications, then marks the
// started row as waited on (waiters), so that the change that ends it
// notifies. If the row is no longer started (the change came first) it
// returns at once. The mark waits for a change in progress (its row lock)
// at most LockTimeout; a mark that cannot be set leaves the wait to the
// poll period.
func (b *backend) WaitChange(ctx context.Context, key string) error {
	var ch <-chan struct{}
	if b.l != nil && storable(key) {
		var unsub func()
		ch, unsub = b.l.subscribe(key)
		defer unsub()
		tag, err := b.exec(ctx, `UPDATE {schema}.idem_records SET waiters = true WHERE key = $1::text AND state <> 2`, key)
		switch {
		case err == nil && tag.RowsAffected() == 0:
			return nil // changed already: read it again
		case ctx.Err() != nil:
			return ctx.Err()
		}
	}
	t := time.NewTimer(b.s.PollInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-ch:
	case <-t.C:
	}
	return nil
}
