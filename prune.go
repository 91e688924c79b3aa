package idem

import (
	"context"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/internal/layout"
)

// pruneBatch bounds the started records deleted per write transaction, so the
// pruner never holds the writer for long.
const pruneBatch = 1000

// Prune reclaims the space of expired records now and returns how many it
// removed. Done records are held in time slots as wide as the retention window
// was when the file was created; a slot is dropped whole (one bucket delete,
// one commit) once every record in it has expired, so a record may outlive its
// window by up to one slot width: retention is a floor. Expired interrupted
// executions are deleted in transactions of at most 1,000, skipping keys a call
// holds, and never under RecoverRefuse. Readers treat expired records as absent
// whether or not Prune has run. Prune stops early with ctx.Err().
func (e *Engine) Prune(ctx context.Context) (int, error) {
	if err := e.enter(); err != nil {
		return 0, &OpError{Op: "prune", Err: err}
	}
	defer e.calls.Done()
	return e.prune(ctx)
}

func (e *Engine) prune(ctx context.Context) (int, error) {
	total := 0
	defer func() { e.n.pruned.Add(uint64(total)) }()
	now := e.now()
	e.pruneDeadLetters(ctx, now) // outbox.go: dead letters past their retention

	// Whole slots first: find them and count their records in a read
	// transaction (a slot that ended a window ago takes no more writes).
	type slot struct {
		name []byte
		n    int
	}
	var expired []slot
	err := e.db.View(func(tx *bbolt.Tx) error {
		c := slotsBucket(tx).Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			i, ok := layout.ParseU64(k)
			if !ok || layout.SlotEnd(i, e.st.slotWidth).Add(e.opts.Retention).After(now) {
				break
			}
			expired = append(expired, slot{name: layout.U64(i), n: c.Bucket().Bucket(k).Stats().KeyN})
		}
		return nil
	})
	if err != nil {
		return total, err
	}
	for _, s := range expired {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		err := e.pipe.Do(func(tx *bbolt.Tx) error { return slotsBucket(tx).DeleteBucket(s.name) })
		if err != nil {
			return total, e.writeErr("prune", "", err)
		}
		total += s.n
	}

	// Then interrupted executions past the window, in bounded batches.
	if e.opts.Recovery == RecoverRefuse {
		return total, nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		var keys [][]byte
		err := e.db.View(func(tx *bbolt.Tx) error {
			return startedBucket(tx).ForEach(func(k, v []byte) error {
				if len(keys) == pruneBatch {
					return nil
				}
				if r, err := decodeRecord(string(k), v); err == nil && !e.live(r, now) && !e.locks.owned(r.Key) {
					keys = append(keys, []byte(r.Key))
				}
				return nil
			})
		})
		if err != nil || len(keys) == 0 {
			return total, err
		}
		n := 0
		err = e.pipe.Do(func(tx *bbolt.Tx) error {
			n = 0
			b := startedBucket(tx)
			for _, k := range keys {
				// Check again in the writer: a call may have taken the key since.
				if r, err := decodeRecord(string(k), b.Get(k)); err != nil || e.live(r, now) || e.locks.owned(r.Key) {
					continue
				}
				if err := b.Delete(k); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		if err != nil {
			return total, e.writeErr("prune", "", err)
		}
		total += n
		if len(keys) < pruneBatch {
			return total, nil
		}
	}
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
