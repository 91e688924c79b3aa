package idem

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/internal/layout"
)

// pruneBatch bounds the records deleted one by one per write transaction, so
// the pruner never holds the writer for long.
const pruneBatch = 1000

// Prune reclaims the space of expired records now and returns how many it
// removed. Records are held in time slots as wide as the retention window was
// when each slot was made (done records by completion, started ones by
// start); a slot is dropped whole, in one commit, once every record in it has
// expired, so a record may outlive its window by up to one slot width:
// retention is a floor. Under RecoverRefuse a slot that holds an interrupted
// execution is kept for it (its other records are deleted in transactions of
// at most 1,000) until the key is resolved or forgotten. Readers treat expired
// records as absent whether or not Prune has run. Prune stops early with
// ctx.Err().
func (e *Engine) Prune(ctx context.Context) (int, error) {
	if err := e.enterOp(); err != nil {
		return 0, &OpError{Op: "prune", Err: err}
	}
	defer e.exitOp()
	return e.prune(ctx)
}

func (e *Engine) prune(ctx context.Context) (int, error) {
	e.pruneMu.Lock() // Prune and the background pruner take turns
	defer e.pruneMu.Unlock()
	total := 0
	defer func() { e.core.Counters().Pruned.Add(uint64(total)) }()
	defer e.observePrune(&total, e.observeStart())
	now := e.now()
	e.pruneDeadLetters(ctx, now) // outbox.go: dead letters past their retention

	// Find the expired slots and count their records in a read transaction: a
	// slot that ended a window ago takes no more writes.
	type slot struct {
		sl layout.Slot
		n  int
		// kept: the slot holds an interrupted execution under RecoverRefuse;
		// only its done records, dones, are deleted, one by one.
		kept  bool
		dones [][]byte
	}
	var expired []slot
	err := e.db.View(func(tx *bbolt.Tx) error {
		return e.st.forEachSlot(tx, func(sl layout.Slot, b *bbolt.Bucket) error {
			if sl.EndTime().Add(e.opts.Retention).After(now) {
				return nil // some record in it may be live
			}
			s := slot{sl: sl, n: b.Stats().KeyN}
			if e.opts.Recovery == RecoverRefuse && holdsStarted(b) {
				s.kept, s.dones = true, doneKeys(b)
			}
			expired = append(expired, s)
			return nil
		})
	})
	if err != nil {
		return total, err
	}
	for _, s := range expired {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		if !s.kept {
			err := e.pipe.Do(func(tx *bbolt.Tx) error {
				if err := rootBucket(tx).DeleteBucket(s.sl.Name()); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
					return err
				}
				return nil
			})
			if err != nil {
				return total, e.writeErr("prune", "", err)
			}
			e.st.removeSlot(s.sl)
			total += s.n
			continue
		}
		for len(s.dones) > 0 {
			if err := ctx.Err(); err != nil {
				return total, err
			}
			batch := s.dones[:min(pruneBatch, len(s.dones))]
			s.dones = s.dones[len(batch):]
			err := e.pipe.Do(func(tx *bbolt.Tx) error {
				b := rootBucket(tx).Bucket(s.sl.Name())
				if b == nil {
					return nil // dropped meanwhile
				}
				for _, k := range batch {
					if err := b.Delete(k); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return total, e.writeErr("prune", "", err)
			}
			total += len(batch)
		}
	}
	return total, nil
}

// holdsStarted reports whether slot bucket b holds a started record.
func holdsStarted(b *bbolt.Bucket) bool {
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if st, _, _, ok := peekRecord(v); !ok || st == StateStarted {
			return true // an undecodable record is kept for `idem check` too
		}
	}
	return false
}

// doneKeys returns the keys of b's done records.
func doneKeys(b *bbolt.Bucket) [][]byte {
	var keys [][]byte
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if st, _, _, ok := peekRecord(v); ok && st == StateDone {
			keys = append(keys, append([]byte(nil), k...))
		}
	}
	return keys
}

// pruneLoop is the background pruner; it stops on Close.
func (e *Engine) pruneLoop(every time.Duration) {
	defer e.bg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-e.stopBg:
			return
		case <-t.C:
			n, err := e.prune(e.ctx)
			if err != nil && e.ctx.Err() == nil {
				e.log.Warn("idem: prune failed", "err", err)
			} else if n > 0 {
				e.log.Debug("idem: pruned expired records", "records", n)
			}
		}
	}
}
