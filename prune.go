package idem

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/layout"
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
	if err := e.enterOp(); err != nil {
		return 0, &OpError{Op: "prune", Err: err}
	}
	defer e.exitOp()
	n, err := e.prune(ctx)
	return n, opError("prune", "", err)
}

// expiredSlot is a slot the pruner found past its window.
type expiredSlot struct {
	sl layout.Slot
	// n counts its records; interrupted, the expired started ones.
	n, interrupted int
	// kept: the slot holds records that are still live (kept until resolved,
	// or of a longer window) or undecodable (kept for `idem check`); only
	// its expired records, dead, are deleted, one by one.
	kept bool
	dead [][]byte
}

func (e *Engine) prune(ctx context.Context) (int, error) {
	e.pruneMu.Lock() // Prune and the background pruner take turns
	defer e.pruneMu.Unlock()
	total := 0
	defer func() { e.core.Counters().Pruned.Add(uint64(total)) }()
	defer e.observePrune(&total, e.observeStart())
	now := e.now()
	e.pruneDeadLetters(ctx, now) // outbox.go: dead letters past their retention

	// Find the expired slots and judge their records in a read transaction:
	// a slot that ended a window ago takes no more writes.
	var expired []expiredSlot
	err := e.db.View(func(tx *bbolt.Tx) error {
		return e.st.forEachSlot(tx, func(sl layout.Slot, b *bbolt.Bucket) error {
			if sl.EndTime().Add(max(sl.Width(), e.opts.Retention)).After(now) {
				return nil // some record in it may be live
			}
			expired = append(expired, e.judgeSlot(sl, b, now))
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
			if err := fault.Err("prune-before-drop"); err != nil {
				return total, e.writeErr("prune", "", err) // as a failed drop
			}
			err := e.pipe.Do(func(tx *bbolt.Tx) error {
				if err := rootBucket(tx).DeleteBucket(s.sl.Name()); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
					return err
				}
				return nil
			})
			if err == nil {
				err = fault.Err("prune-after-drop") // as a drop whose answer was lost
			}
			if err != nil {
				return total, e.writeErr("prune", "", err)
			}
			e.st.removeSlot(s.sl)
			total += s.n
			e.warnInterrupted(s)
			continue
		}
		for len(s.dead) > 0 {
			if err := ctx.Err(); err != nil {
				return total, err
			}
			batch := s.dead[:min(pruneBatch, len(s.dead))]
			s.dead = s.dead[len(batch):]
			if err := fault.Err("prune-before-drop"); err != nil {
				return total, e.writeErr("prune", "", err) // as a failed drop
			}
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
			if err == nil {
				err = fault.Err("prune-after-drop") // as a drop whose answer was lost
			}
			if err != nil {
				return total, e.writeErr("prune", "", err)
			}
			total += len(batch)
		}
		e.warnInterrupted(s)
	}
	return total, nil
}

// judgeSlot reads the records of slot bucket b, past its window at now:
// whether one is still live, and which ones are expired.
func (e *Engine) judgeSlot(sl layout.Slot, b *bbolt.Bucket, now time.Time) expiredSlot {
	s := expiredSlot{sl: sl}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			continue // a nested bucket: not ours, never dropped by key
		}
		s.n++
		l, ok := peekLife(v, sl.Width())
		switch {
		case !ok || e.live(&l, now):
			s.kept = true
		case l.State == StateStarted:
			s.interrupted++
		}
	}
	if !s.kept {
		return s
	}
	s.interrupted = 0 // counted again below, of what is deleted
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			continue
		}
		if l, ok := peekLife(v, sl.Width()); ok && !e.live(&l, now) {
			s.dead = append(s.dead, append([]byte(nil), k...))
			if l.State == StateStarted {
				s.interrupted++
			}
		}
	}
	return s
}

// warnInterrupted logs, at warn level, the interrupted executions that s's
// pruning dropped: the evidence that fn may have had its effect is gone, and
// the next call with one of those keys runs as attempt 1, not recovered.
// Only the count is logged, never a key.
func (e *Engine) warnInterrupted(s expiredSlot) {
	if s.interrupted == 0 {
		return
	}
	e.log.Warn("idem: pruned interrupted executions past the retention window; their keys run as new, not recovered",
		"interrupted", s.interrupted, "slot_end", s.sl.EndTime().UTC(), "retention", max(s.sl.Width(), e.opts.Retention))
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
