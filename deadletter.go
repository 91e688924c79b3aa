package idem

// The dead letters on bbolt: retried, dropped and pruned, and pending
// messages moved there as they are.

import (
	"bytes"
	"context"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/idemcore"
)

// RetryDead moves dead letter seq back to the outbox, as revive leaves it.
func (b *boltBackend) RetryDead(_ context.Context, seq uint64, revive func(m *idemcore.Message) error) error {
	err := b.write(func(tx *bbolt.Tx) error {
		k := u64Key(seq)
		v := deadBucket(tx).Get(k)
		if v == nil {
			return fmt.Errorf("%w: message %d", ErrMessageNotFound, seq)
		}
		m, err := decodeMessage(seq, v)
		if err != nil {
			return err
		}
		if err := revive(m); err != nil {
			return err
		}
		if err := outboxBucket(tx).Put(k, encodeMessage(nil, m)); err != nil {
			return err
		}
		return deadBucket(tx).Delete(k)
	})
	if err == nil {
		b.ix.rescan.Store(true) // an old seq is back: the index reads it all again
	}
	return err
}

// DropDead deletes dead letter seq.
func (b *boltBackend) DropDead(_ context.Context, seq uint64) error {
	return b.write(func(tx *bbolt.Tx) error {
		k := u64Key(seq)
		if deadBucket(tx).Get(k) == nil {
			return fmt.Errorf("%w: message %d", ErrMessageNotFound, seq)
		}
		return deadBucket(tx).Delete(k)
	})
}

// PruneDead deletes the dead letters expired says so, limit per commit.
func (b *boltBackend) PruneDead(ctx context.Context, expired func(m *idemcore.Message) bool, limit int) (int, error) {
	var keys [][]byte
	err := view(b.db, func(tx *bbolt.Tx) error {
		return deadBucket(tx).ForEach(func(k, v []byte) error {
			seq, ok := parseU64Key(k)
			if !ok {
				return nil
			}
			if m, err := decodeMessage(seq, v); err == nil && expired(m) {
				keys = append(keys, append([]byte(nil), k...))
			}
			return nil
		})
	})
	n := 0
	for err == nil && len(keys) > 0 {
		if err = ctx.Err(); err != nil {
			break
		}
		batch := keys[:min(limit, len(keys))]
		keys = keys[len(batch):]
		err = b.write(func(tx *bbolt.Tx) error {
			for _, k := range batch {
				if err := deadBucket(tx).Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			n += len(batch)
		}
	}
	return n, err
}

// moveRaw moves pending message k, as it is, to the dead letters.
func moveRaw(tx *bbolt.Tx, k []byte) error {
	v := bytes.Clone(outboxBucket(tx).Get(k))
	if err := deadBucket(tx).Put(k, v); err != nil {
		return err
	}
	return outboxBucket(tx).Delete(k)
}
