package idem

// A claimed message's end on bbolt: delivered (deleted), or failed (stored
// back for a later attempt, or moved to the dead letters).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/idemcore"
)

// Delivered deletes pending message m and drops it from the index.
func (b *boltBackend) Delivered(_ context.Context, m *idemcore.Message) error {
	err := b.write(func(tx *bbolt.Tx) error {
		ob, k := outboxBucket(tx), u64Key(m.Seq)
		if ob.Get(k) == nil {
			return fmt.Errorf("%w: message %d", ErrMessageNotFound, m.Seq)
		}
		return ob.Delete(k)
	})
	if err == nil || errors.Is(err, ErrMessageNotFound) {
		b.ix.mu.Lock()
		b.ix.remove(m.Seq)
		b.ix.mu.Unlock()
	}
	return err
}

// RenewClaim implements idemcore.Backend: bbolt's claims are in memory and
// last until Delivered or Failed, so there is nothing to renew.
func (b *boltBackend) RenewClaim(context.Context, *idemcore.Message) (time.Time, error) {
	return time.Time{}, nil
}

// Failed stores m back, or moves it to the dead letters if m.Dead, and ends
// its claim in the index, whatever the write's outcome (due again at
// m.NextAttemptAt). A message given back unchanged is not written again.
func (b *boltBackend) Failed(_ context.Context, m *idemcore.Message) error {
	enc := encodeMessage(nil, m)
	same := false
	if !m.Dead {
		_ = view(b.db, func(tx *bbolt.Tx) error {
			same = bytes.Equal(outboxBucket(tx).Get(u64Key(m.Seq)), enc)
			return nil
		})
	}
	var err error
	if !same {
		err = b.write(func(tx *bbolt.Tx) error {
			ob, k := outboxBucket(tx), u64Key(m.Seq)
			if ob.Get(k) == nil {
				return fmt.Errorf("%w: message %d", ErrMessageNotFound, m.Seq)
			}
			if m.Dead {
				if err := deadBucket(tx).Put(k, enc); err != nil {
					return err
				}
				return ob.Delete(k)
			}
			return ob.Put(k, enc)
		})
	}
	b.ix.mu.Lock()
	if (err == nil && m.Dead) || errors.Is(err, ErrMessageNotFound) {
		b.ix.remove(m.Seq)
	} else {
		b.ix.release(m.Seq, m.NextAttemptAt)
	}
	b.ix.mu.Unlock()
	return err
}
