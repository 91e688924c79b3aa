package idem

import (
	"context"
	"errors"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/fault"
)

// pruneBatch bounds the records deleted one by one per write transaction, so
// the pruner never holds the writer for long.
const pruneBatch = 1000

// Prune reclaims the space of expired records now and returns how many it
// removed. A record expires the longer of the retention window it was written
// under (recorded with it) and Options.Retention after it completed (after it
// started, while started); a started record written under RecoverRefuse, or
// any started record while this engine refuses, never expires. Records are
// held in time slots as wide as their window (done records by completion,
// started ones by start); a slot is dropped whole, in one commit, once every
// record in it has expired, so a record may outlive its window by up to one
// slot width: retention is a floor. A slot that holds a record that never
// expires is kept for it, and its expired records are deleted in transactions
// of at most 1,000. When a dropped slot held interrupted executions, their
// count (never their keys) is logged at warn level: their keys are new again.
// Readers treat expired records as absent whether or not Prune has run. Prune
// stops early with ctx.Err().
func (e *Engine) Prune(ctx context.Context) (int, error) {
	return e.c.Prune(ctx)
}

// expiredSlot is a slot the pruner found past its window.
type expiredSlot struct {
	sl timeSlot
	// n counts its records; interrupted, the expired started ones.
	n, interrupted int
	// kept: the slot holds records that are still live (kept until resolved,
	// or of a longer window) or undecodable (kept for `idem check`); only
	// its expired records, dead, are deleted, one by one.
	kept bool
	dead []deadKey
}

// deadKey is an expired record's key in a kept slot.
type deadKey struct {
	key     []byte
	started bool // an interrupted execution
}

// prune is the slot pruner, the bbolt backend's Prune: it honours req (its
// clock reading, retention window, KeepStarted and batch Limit), never the
// engine's options.
func (b *boltBackend) prune(ctx context.Context, req idemcore.PruneRequest) (idemcore.PruneResult, error) {
	var res idemcore.PruneResult
	if b.j != nil {
		// The slots are judged in bbolt: the journal's frames first.
		if err := b.j.drain(); err != nil {
			return res, storageErr(err, b.maxSize)
		}
	}
	limit := req.Limit
	if limit <= 0 {
		limit = pruneBatch
	}
	// Find the expired slots and judge their records in a read transaction:
	// a slot that ended a window ago takes no more writes.
	var expired []expiredSlot
	err := view(b.db, func(tx *bbolt.Tx) error {
		return b.st.forEachSlot(tx, func(sl timeSlot, bk *bbolt.Bucket) error {
			if sl.EndTime().Add(max(sl.Width(), req.Retention)).After(req.Now) {
				return nil // some record in it may be live
			}
			expired = append(expired, judgeSlot(sl, bk, req))
			return nil
		})
	})
	if err != nil {
		return res, err
	}
	for _, s := range expired {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if !s.kept {
			if err := fault.Err("prune-before-drop"); err != nil {
				return res, err // as a failed drop
			}
			err := b.write(func(tx *bbolt.Tx) error {
				if err := rootBucket(tx).DeleteBucket(s.sl.Name()); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
					return err
				}
				return nil
			})
			if err == nil {
				err = fault.Err("prune-after-drop") // as a drop whose answer was lost
			}
			if err != nil {
				return res, err
			}
			b.st.removeSlot(s.sl)
			res.Deleted += s.n
			res.Interrupted += s.interrupted
			continue
		}
		for len(s.dead) > 0 {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			batch := s.dead[:min(limit, len(s.dead))]
			s.dead = s.dead[len(batch):]
			if err := fault.Err("prune-before-drop"); err != nil {
				return res, err // as a failed drop
			}
			err := b.write(func(tx *bbolt.Tx) error {
				bk := rootBucket(tx).Bucket(s.sl.Name())
				if bk == nil {
					return nil // dropped meanwhile
				}
				for _, k := range batch {
					if err := bk.Delete(k.key); err != nil {
						return err
					}
				}
				return nil
			})
			if err == nil {
				err = fault.Err("prune-after-drop") // as a drop whose answer was lost
			}
			if err != nil {
				return res, err
			}
			res.Deleted += len(batch)
			for _, k := range batch {
				if k.started {
					res.Interrupted++
				}
			}
		}
	}
	return res, nil
}

// judgeSlot reads the records of slot bucket b, past its window at req.Now:
// whether one is still live, and which ones are expired.
func judgeSlot(sl timeSlot, b *bbolt.Bucket, req idemcore.PruneRequest) expiredSlot {
	s := expiredSlot{sl: sl}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			continue // a nested bucket: not ours, never dropped by key
		}
		s.n++
		l, ok := peekLife(v, sl.Width())
		switch {
		case !ok || !req.Expired(&l):
			s.kept = true
		case l.State == StateStarted:
			s.interrupted++
		}
	}
	if !s.kept {
		return s
	}
	s.interrupted = 0 // counted as they are deleted
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			continue
		}
		if l, ok := peekLife(v, sl.Width()); ok && req.Expired(&l) {
			s.dead = append(s.dead, deadKey{key: append([]byte(nil), k...), started: l.State == StateStarted})
		}
	}
	return s
}

// Prune is the slot pruner (prune.go).
func (b *boltBackend) Prune(ctx context.Context, req idemcore.PruneRequest) (idemcore.PruneResult, error) {
	return b.prune(ctx, req)
}
