package idempg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/idemcore"
)

// Release implements idemcore.Backend. Like Complete, it is written again on
// a fresh connection when its connection dies (again).
func (b *backend) Release(ctx context.Context, c *idemcore.Claim, restore *idemcore.Record) error {
	return b.again(ctx, func() error { return b.release(ctx, c, restore) },
		func(cause error) error { return b.readBackGone(ctx, c, restore == nil, cause) })
}

// release is one attempt of Release.
func (b *backend) release(ctx context.Context, c *idemcore.Claim, restore *idemcore.Record) error {
	var (
		tag pgconn.CommandTag
		err error
	)
	if restore == nil {
		tag, err = b.exec(ctx, b.notifying(`DELETE FROM {schema}.idem_records WHERE `+heldSQL), c.Key, int64(c.Token))
	} else {
		// Back to the interrupted execution, with a lapsed lease and a
		// token nobody holds.
		tag, err = b.exec(ctx, b.notifying(`UPDATE {schema}.idem_records SET fingerprint = $3::bigint, attempt = $4::integer,
			fence = nextval('{schema}.idem_fence'), lease_until = 'epoch', started_ns = $5::bigint,
			retention_ns = $6::bigint, kept_until_resolved = $7::boolean, expires_ns = $8::bigint
		WHERE `+heldSQL), c.Key, int64(c.Token), int64(restore.Fingerprint),
			restore.Attempt, toNs(restore.StartedAt), int64(restore.Retention), restore.KeptUntilResolved, expiresNs(restore))
	}
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: releasing the key", idemcore.ErrFenced)
	}
	return nil
}

// readBackGone resolves a Release whose answer was lost: the row is gone
// (deleted) or no longer holds c's token (restored), or the write did not
// happen (cause).
func (b *backend) readBackGone(ctx context.Context, c *idemcore.Claim, deleted bool, cause error) error {
	var fence int64
	err := b.readRow(ctx, `SELECT fence FROM {schema}.idem_records WHERE key = $1::text`, []any{c.Key}, &fence)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if deleted {
			return nil
		}
		return fmt.Errorf("%w: the key's record is gone", idemcore.ErrFenced)
	case err != nil:
		return fmt.Errorf("the write's answer was lost (%w), and so was the read back: %v", cause, err)
	case idemcore.Fence(fence) == c.Token:
		return cause
	case deleted:
		return fmt.Errorf("%w: the write's answer was lost: %v", idemcore.ErrFenced, cause)
	}
	// Restored (a new token), or another owner's: the restore is the only
	// write that gives the row a token of no claim, and another owner's
	// claim fences this one either way.
	return nil
}
