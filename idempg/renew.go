package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// Renew implements idemcore.Backend: it extends c's lease, fenced. A failure
// other than the fence is tried again, every quarter of a heartbeat, until
// the lease would lapse; then the last error is returned.
func (b *backend) Renew(ctx context.Context, c *idemcore.Claim) error {
	for {
		before := time.Now()
		var left int64
		err := b.writeRow(ctx, `UPDATE {schema}.idem_records SET lease_until = `+b.leaseSQL()+`
			WHERE `+heldSQL+`
			RETURNING (extract(epoch FROM lease_until - {now}) * 1000000)::bigint`, []any{c.Key, int64(c.Token)}, &left)
		if err == nil {
			c.LeaseUntil = before.Add(time.Duration(left) * time.Microsecond)
			return nil
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: renewing the lease", idemcore.ErrFenced)
		}
		wait := b.s.Heartbeat / 4
		if time.Now().Add(wait).After(c.LeaseUntil) || ctx.Err() != nil {
			return fmt.Errorf("%w: %w", idemcore.ErrLeaseLost, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", idemcore.ErrLeaseLost, err)
		case <-time.After(wait):
		}
	}
}
