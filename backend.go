package idem

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/internal/commit"
	"github.com/idemkit/idem/internal/core"
	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/layout"
)

// boltBackend is the engine's storage in one bbolt file: core.Backend over
// the store's time slots (store.go), the commit pipeline's shared write
// transactions (internal/commit), and the outbox buckets. DoTx's
// transaction is *Tx, a bbolt write transaction.
// The claim rule is in lock.go.
type boltBackend struct {
	db       *bbolt.DB
	st       *store
	pipe     *commit.Pipeline
	e        *Engine // for the Tx a DoTx fn gets (Enqueue's clock)
	readOnly bool
	onCommit atomic.Pointer[func()]
}

var _ core.Backend[*Tx] = (*boltBackend)(nil)

// Info: no heartbeat, no poll: a bbolt claim never lapses and is never
// owned elsewhere.
func (b *boltBackend) Info() core.Info { return core.Info{Name: "bbolt", ReadOnly: b.readOnly} }

// Lookup reads the key's newest version in one read transaction; a live
// done record of another fingerprint is refused from its header alone.
func (b *boltBackend) Lookup(_ context.Context, q core.Lookup) (rec *Record, err error) {
	err = b.db.View(func(tx *bbolt.Tx) error {
		// bbolt only compares the key: a view of the string's bytes saves
		// the copy on every lookup.
		v := b.st.rawLookup(tx, unsafe.Slice(unsafe.StringData(q.Key), len(q.Key)), time.Time{})
		if v == nil {
			return nil
		}
		if st, rfp, completed, ok := peekRecord(v); q.CheckFingerprint && ok && st == StateDone && rfp != q.Fingerprint &&
			q.Now.Before(completed.Add(q.Retention)) {
			return core.ErrFingerprintMismatch
		}
		var err error
		rec, err = decodeRecord(q.Key, v)
		return err
	})
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// Complete commits done in place of the claim's started record.
func (b *boltBackend) Complete(_ context.Context, c *core.Claim, done *Record) error {
	return b.write(func(tx *bbolt.Tx) error {
		if err := fault.Err("do-done-commit"); err != nil {
			return err // as a failed write: the transaction rolls back
		}
		return b.st.put(tx, done, c.Started)
	})
}

// Release puts back the interrupted execution the claim recovered, or
// deletes the claim's started record.
func (b *boltBackend) Release(_ context.Context, c *core.Claim, restore *Record) error {
	return b.write(func(tx *bbolt.Tx) error {
		if restore != nil {
			return b.st.put(tx, restore, c.Started)
		}
		return b.st.del(tx, c.Started)
	})
}

// RunTx runs fn in a write transaction of the commit pipeline, shared with
// concurrent writers (group commit: fn may run again, at most
// commit.MaxRuns times), and puts the done record fn returns in it. A claim
// of Token zero needs no write of its own: the core holds the key, and the
// file has one writer.
func (b *boltBackend) RunTx(_ context.Context, c *core.Claim, fn func(tx *Tx) (*Record, error)) error {
	return b.write(func(btx *bbolt.Tx) error {
		tx := &Tx{tx: btx, e: b.e, key: c.Key}
		done, err := fn(tx)
		tx.tx = nil
		if err != nil {
			return err
		}
		return b.st.put(btx, done, c.Started)
	})
}

// Holding reports whether the caller runs inside a commit of the pipeline.
func (b *boltBackend) Holding() bool { return b.pipe.Holding() }

// WaitChange is never needed (Owner never answers Owned); it sleeps a
// moment, for a wrapper that reports owners elsewhere.
func (b *boltBackend) WaitChange(ctx context.Context, _ string) error {
	t := time.NewTimer(10 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Forget deletes every version of key, in every slot.
func (b *boltBackend) Forget(_ context.Context, key string) (found bool, err error) {
	err = b.write(func(tx *bbolt.Tx) error {
		var err error
		found, err = b.st.deleteAll(tx, key)
		return err
	})
	return found, err
}

// Resolve reads the key's newest version and writes fn's record in its
// place, in one write transaction.
func (b *boltBackend) Resolve(_ context.Context, key string, fn func(cur *Record) (*Record, error)) error {
	return b.write(func(tx *bbolt.Tx) error {
		cur, err := b.st.lookup(tx, key, time.Time{})
		if err != nil {
			return err
		}
		next, err := fn(cur)
		if err != nil {
			return err
		}
		return b.st.put(tx, next, cur)
	})
}

// Prune is the slot pruner (prune.go), with the engine's options: the
// request's Retention and KeepStarted are the engine's Retention and
// RecoverRefuse, which the pruner reads itself (the core and this backend
// are built from one Options).
func (b *boltBackend) Prune(ctx context.Context, _ core.PruneRequest) (core.PruneResult, error) {
	n, err := b.e.prune(ctx)
	return core.PruneResult{Deleted: n}, err
}

// Scan walks every stored record in one read transaction, slot by slot from
// the oldest, by key within a slot.
func (b *boltBackend) Scan(_ context.Context, fn func(r *Record, err error) error) error {
	defer b.e.reads.unmark(b.e.reads.mark()) // fn runs inside the read transaction
	return b.db.View(func(tx *bbolt.Tx) error { return b.st.forEach(tx, fn) })
}

// Enqueue puts m in the outbox bucket inside the DoTx transaction.
func (b *boltBackend) Enqueue(tx *Tx, m *core.Message) error {
	if tx.tx == nil {
		return ErrTxClosed
	}
	if err := fault.Err("outbox-enqueue"); err != nil {
		return err // as a failed write: fn gets the error
	}
	ob := outboxBucket(tx.tx)
	seq, err := ob.NextSequence()
	if err != nil {
		return err
	}
	m.Seq = seq
	return ob.Put(layout.U64(seq), encodeMessage(nil, m))
}

// OnCommit registers the dispatcher's wake-up, called after every commit.
func (b *boltBackend) OnCommit(fn func()) { b.onCommit.Store(&fn) }

// committed runs after every commit of the pipeline.
func (b *boltBackend) committed() {
	if fn := b.onCommit.Load(); fn != nil {
		(*fn)()
	}
}

// ClaimDue reads the outbox in one read transaction and returns the due
// heads of its ordering keys, by Seq. One dispatcher drains a file, so the
// claim is the caller's alone.
func (b *boltBackend) ClaimDue(_ context.Context, now time.Time, limit int) ([]*core.Message, error) {
	var due []*core.Message
	seen := make(map[string]bool)
	err := b.db.View(func(tx *bbolt.Tx) error {
		c := outboxBucket(tx).Cursor()
		for k, v := c.First(); k != nil && len(due) < limit; k, v = c.Next() {
			seq, ok := layout.ParseU64(k)
			if !ok {
				continue
			}
			m, err := decodeMessage(seq, v)
			if err != nil {
				continue // reported by Messages, quarantined by the dispatcher
			}
			if seen[m.OrderingKey] {
				continue
			}
			seen[m.OrderingKey] = true
			if m.NextAttemptAt.IsZero() || !m.NextAttemptAt.After(now) {
				due = append(due, m)
			}
		}
		return nil
	})
	return due, err
}

// Delivered deletes pending message m.
func (b *boltBackend) Delivered(_ context.Context, m *core.Message) error {
	return b.write(func(tx *bbolt.Tx) error {
		ob, k := outboxBucket(tx), layout.U64(m.Seq)
		if ob.Get(k) == nil {
			return fmt.Errorf("%w: message %d", ErrMessageNotFound, m.Seq)
		}
		return ob.Delete(k)
	})
}

// Failed stores m back, or moves it to the dead letters if m.Dead.
func (b *boltBackend) Failed(_ context.Context, m *core.Message) error {
	return b.write(func(tx *bbolt.Tx) error {
		ob, k := outboxBucket(tx), layout.U64(m.Seq)
		if ob.Get(k) == nil {
			return fmt.Errorf("%w: message %d", ErrMessageNotFound, m.Seq)
		}
		if m.Dead {
			if err := deadBucket(tx).Put(k, encodeMessage(nil, m)); err != nil {
				return err
			}
			return ob.Delete(k)
		}
		return ob.Put(k, encodeMessage(nil, m))
	})
}

// Messages walks the pending messages, then the dead letters, by Seq.
func (b *boltBackend) Messages(_ context.Context, fn func(m *core.Message, err error) error) error {
	defer b.e.reads.unmark(b.e.reads.mark()) // fn runs inside the read transaction
	return b.db.View(func(tx *bbolt.Tx) error {
		for _, dead := range []bool{false, true} {
			bk := outboxBucket(tx)
			if dead {
				bk = deadBucket(tx)
			}
			c := bk.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				seq, _ := layout.ParseU64(k)
				m, err := decodeMessage(seq, v)
				if err != nil {
					m = &core.Message{Seq: seq, Dead: dead}
				}
				if err := fn(m, err); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// RetryDead moves dead letter seq back to the outbox, as revive leaves it.
func (b *boltBackend) RetryDead(_ context.Context, seq uint64, revive func(m *core.Message) error) error {
	return b.write(func(tx *bbolt.Tx) error {
		k := layout.U64(seq)
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
}

// DropDead deletes dead letter seq.
func (b *boltBackend) DropDead(_ context.Context, seq uint64) error {
	return b.write(func(tx *bbolt.Tx) error {
		k := layout.U64(seq)
		if deadBucket(tx).Get(k) == nil {
			return fmt.Errorf("%w: message %d", ErrMessageNotFound, seq)
		}
		return deadBucket(tx).Delete(k)
	})
}

// PruneDead deletes the dead letters expired says so, limit per commit.
func (b *boltBackend) PruneDead(ctx context.Context, expired func(m *core.Message) bool, limit int) (int, error) {
	var keys [][]byte
	err := b.db.View(func(tx *bbolt.Tx) error {
		return deadBucket(tx).ForEach(func(k, v []byte) error {
			seq, ok := layout.ParseU64(k)
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

// Close stops the commit pipeline and closes the file.
func (b *boltBackend) Close() error {
	b.pipe.Stop()
	return b.db.Close()
}

// write runs fn in the commit pipeline; its errors are mapped by storageErr.
func (b *boltBackend) write(fn commit.Func) error {
	return storageErr(b.pipe.Do(fn), b.e.opts.MaxSize)
}

// storageErr maps the commit pipeline's errors onto the engine's sentinels,
// keeping the cause in the chain: a stopped pipeline is ErrClosed, a failed
// commit ErrStorageFailed, bbolt's ErrMaxSizeReached ErrFileFull.
func storageErr(err error, maxSize int) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, commit.ErrStopped):
		return ErrClosed
	case errors.Is(err, commit.ErrFailed):
		return fmt.Errorf("%w: %w", ErrStorageFailed, err)
	case errors.Is(err, bolterrors.ErrMaxSizeReached):
		return fmt.Errorf("%w (Options.MaxSize is %d bytes): %w", ErrFileFull, maxSize, err)
	}
	return err
}
