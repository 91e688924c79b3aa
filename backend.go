package idem

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
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
	ix       *outboxIndex // pending messages, for ClaimDue (outboxindex.go)
}

var _ core.Backend[*Tx] = (*boltBackend)(nil)

// Info: no heartbeat, no poll: a bbolt claim never lapses and is never
// owned elsewhere.
func (b *boltBackend) Info() core.Info { return core.Info{Name: "bbolt", ReadOnly: b.readOnly} }

// Lookup reads the key's newest version in one read transaction; a live
// done record of another fingerprint is refused from its header alone. The
// engine's clock judges (no Info.Clock): at is zero.
func (b *boltBackend) Lookup(_ context.Context, q core.Lookup) (rec *Record, at time.Time, err error) {
	err = view(b.db, func(tx *bbolt.Tx) error {
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
		return nil, time.Time{}, err
	}
	return rec, time.Time{}, nil
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

// Prune is the slot pruner (prune.go).
func (b *boltBackend) Prune(ctx context.Context, req core.PruneRequest) (core.PruneResult, error) {
	return b.prune(ctx, req)
}

// Scan walks every stored record in one read transaction, slot by slot from
// the oldest, by key within a slot.
func (b *boltBackend) Scan(_ context.Context, fn func(r *Record, err error) error) error {
	defer b.e.reads.unmark(b.e.reads.mark()) // fn runs inside the read transaction
	var inUser bool
	return viewUser(b.db, &inUser, func(tx *bbolt.Tx) error {
		return b.st.forEach(tx, func(r *Record, err error) error {
			inUser = true
			err = fn(r, err)
			inUser = false
			return err
		})
	})
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

// committed runs after every commit of the pipeline: the outbox index
// reads what it may have enqueued at the next ClaimDue.
func (b *boltBackend) committed() {
	b.ix.dirty.Store(true)
	if fn := b.onCommit.Load(); fn != nil {
		(*fn)()
	}
}

// ClaimDue claims the due heads from the outbox index (outboxindex.go),
// brought up to date first, and reads them in one read transaction. The
// claims are in memory: one dispatcher drains a file. A message that fails
// to decode, found by the index's load or when claimed, is moved to the
// dead letters as it is (quarantine). After a failed commit
// (ErrStorageFailed) nothing is claimed: a message may come from a commit
// that never reached the disk, and nothing is delivered until a reopen reads
// what did.
func (b *boltBackend) ClaimDue(_ context.Context, now time.Time, limit int) (core.Due, error) {
	if err := b.pipe.Failed(); err != nil {
		return core.Due{}, storageErr(err, b.e.opts.Bolt.MaxSize)
	}
	ix := b.ix
	ix.mu.Lock()
	defer ix.mu.Unlock()
	corrupt, err := ix.load(b.db)
	if err != nil {
		return core.Due{}, err
	}
	seqs, next := ix.due(now, limit)
	var due core.Due
	err = view(b.db, func(tx *bbolt.Tx) error {
		ob := outboxBucket(tx)
		for _, seq := range seqs {
			v := ob.Get(layout.U64(seq))
			if v == nil {
				ix.remove(seq) // gone since the load read it
				continue
			}
			m, err := decodeMessage(seq, v)
			if err != nil {
				ix.remove(seq)
				corrupt = append(corrupt, seq)
				continue
			}
			due.Messages = append(due.Messages, m)
		}
		return nil
	})
	if err != nil {
		for _, m := range due.Messages {
			ix.release(m.Seq, m.NextAttemptAt)
		}
		return core.Due{}, err
	}
	slices.SortFunc(due.Messages, func(a, b *core.Message) int { return cmp.Compare(a.Seq, b.Seq) })
	if next.After(now) {
		due.Next = next
	}
	if len(corrupt) > 0 {
		due.Quarantined, err = b.quarantine(corrupt)
		if err != nil {
			ix.rescan.Store(true)
			b.e.log.Warn("idem: outbox: moving corrupt messages to the dead letters failed", "err", err)
		}
	}
	return due, nil
}

// quarantine moves the pending messages seqs that still fail to decode to
// the dead letters as they are, so they hold nothing back (`idem outbox ls`
// shows them, DropDead deletes them), and returns the seqs moved.
func (b *boltBackend) quarantine(seqs []uint64) (moved []uint64, err error) {
	err = b.write(func(tx *bbolt.Tx) error {
		moved = moved[:0]
		for _, seq := range seqs {
			k := layout.U64(seq)
			v := outboxBucket(tx).Get(k)
			if v == nil {
				continue
			}
			if _, err := decodeMessage(seq, v); err == nil {
				continue
			}
			if err := moveRaw(tx, k); err != nil {
				return err
			}
			moved = append(moved, seq)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return moved, nil
}

// Delivered deletes pending message m and drops it from the index.
func (b *boltBackend) Delivered(_ context.Context, m *core.Message) error {
	err := b.write(func(tx *bbolt.Tx) error {
		ob, k := outboxBucket(tx), layout.U64(m.Seq)
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

// RenewClaim implements core.Backend: bbolt's claims are in memory and
// last until Delivered or Failed, so there is nothing to renew.
func (b *boltBackend) RenewClaim(context.Context, *core.Message) (time.Time, error) {
	return time.Time{}, nil
}

// Failed stores m back, or moves it to the dead letters if m.Dead, and ends
// its claim in the index, whatever the write's outcome (due again at
// m.NextAttemptAt). A message given back unchanged is not written again.
func (b *boltBackend) Failed(_ context.Context, m *core.Message) error {
	enc := encodeMessage(nil, m)
	same := false
	if !m.Dead {
		_ = view(b.db, func(tx *bbolt.Tx) error {
			same = bytes.Equal(outboxBucket(tx).Get(layout.U64(m.Seq)), enc)
			return nil
		})
	}
	var err error
	if !same {
		err = b.write(func(tx *bbolt.Tx) error {
			ob, k := outboxBucket(tx), layout.U64(m.Seq)
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

// Messages walks the pending messages, then the dead letters, by Seq.
func (b *boltBackend) Messages(_ context.Context, fn func(m *core.Message, err error) error) error {
	defer b.e.reads.unmark(b.e.reads.mark()) // fn runs inside the read transaction
	var inUser bool
	return viewUser(b.db, &inUser, func(tx *bbolt.Tx) error {
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
				inUser = true
				err = fn(m, err)
				inUser = false
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// RetryDead moves dead letter seq back to the outbox, as revive leaves it.
func (b *boltBackend) RetryDead(_ context.Context, seq uint64, revive func(m *core.Message) error) error {
	err := b.write(func(tx *bbolt.Tx) error {
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
	if err == nil {
		b.ix.rescan.Store(true) // an old seq is back: the index reads it all again
	}
	return err
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
	err := view(b.db, func(tx *bbolt.Tx) error {
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
	return storageErr(b.pipe.Do(fn), b.e.opts.Bolt.MaxSize)
}

// storageErr maps the commit pipeline's errors onto the engine's sentinels,
// keeping the cause in the chain: a stopped pipeline is ErrClosed, a failed
// commit ErrStorageFailed, bbolt's ErrMaxSizeReached ErrFileFull, a panic of
// bbolt's in a write (a damaged page) ErrCorrupt.
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
	// A write's panic is bbolt's on a damaged page (a DoTx fn's own panic
	// is the core's *PanicError, re-raised in its caller): the transaction
	// rolled back, the file is as it was.
	// (A failpoint's injected panic stays what it is.)
	if pe, ok := errors.AsType[*commit.PanicError](err); ok {
		if _, injected := pe.Value.(*fault.Panic); !injected {
			return damaged(pe.Value)
		}
	}
	return err
}
