package idem

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
	"unsafe"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/fault"
)

// boltBackend is the engine's storage in one bbolt file: idemcore.Backend over
// the store's time slots (store.go), the commit pipeline's shared write
// transactions (commit.go), and the outbox buckets. DoTx's
// transaction is *Tx, a bbolt write transaction.
// The claim rule is in lock.go. It knows nothing of the engine above it: the
// engine calls it, never the reverse.
type boltBackend struct {
	db       *bbolt.DB
	st       *store
	pipe     *pipeline
	readOnly bool
	maxSize  int              // BoltOptions.MaxSize, for ErrFileFull's text
	now      func() time.Time // the engine clock, for Tx.Enqueue
	log      *slog.Logger
	commits  chan struct{} // Committed's: capacity 1
	ix       *outboxIndex  // pending messages, for ClaimDue (outboxindex.go)
	reads    readGuard     // goroutines inside Records, View and Messages callbacks
}

var _ idemcore.Backend[*Tx] = (*boltBackend)(nil)

// newBoltBackend returns the backend over db, opened with f, for an engine
// with options o (defaults filled in): its clock, its logger, its observer
// (which gets an EventCommit for every commit of the pipeline).
func newBoltBackend(db *bbolt.DB, st *store, f *BoltOptions, o *Options) *boltBackend {
	clock := o.Now
	b := &boltBackend{db: db, st: st, readOnly: f.ReadOnly, maxSize: f.MaxSize,
		now: func() time.Time { return clock().Round(0) }, log: o.Logger, ix: newOutboxIndex(),
		commits: make(chan struct{}, 1)}
	b.pipe = newPipeline(db, b.committed)
	if ob := o.Observer; ob != nil {
		b.pipe.Observe = func(n int, d time.Duration) {
			ob.Observe(idemcore.Event{Kind: idemcore.EventCommit, N: n, Duration: d})
		}
	}
	return b
}

// Info: no heartbeat, no poll: a bbolt claim never lapses and is never
// owned elsewhere. The commits are the pipeline's.
func (b *boltBackend) Info() idemcore.Info {
	return idemcore.Info{Name: "bbolt", ReadOnly: b.readOnly, Commits: b.pipe.Stats}
}

// Guard refuses a call from inside a Records, View or Messages callback
// (errInsideRead), and fails closed after a failed commit
// (ErrStorageFailed): every call, replays from the cache too, is refused
// until a reopen.
func (b *boltBackend) Guard() error {
	if b.reads.holding() {
		return errInsideRead
	}
	if err := b.pipe.Failed(); err != nil {
		return storageErr(err, b.maxSize)
	}
	return nil
}

// Lookup reads the key's newest version in one read transaction; a live
// done record of another fingerprint is refused from its header alone. The
// engine's clock judges (no Info.Clock): at is zero.
func (b *boltBackend) Lookup(_ context.Context, q idemcore.Lookup) (rec *Record, at time.Time, err error) {
	err = view(b.db, func(tx *bbolt.Tx) error {
		// bbolt only compares the key: a view of the string's bytes saves
		// the copy on every lookup.
		v := b.st.rawLookup(tx, unsafe.Slice(unsafe.StringData(q.Key), len(q.Key)), time.Time{})
		if v == nil {
			return nil
		}
		if st, rfp, completed, ok := peekRecord(v); q.CheckFingerprint && ok && st == StateDone && rfp != q.Fingerprint &&
			q.Now.Before(completed.Add(q.Retention)) {
			return idemcore.ErrFingerprintMismatch
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
func (b *boltBackend) Complete(_ context.Context, c *idemcore.Claim, done *Record) error {
	return b.write(func(tx *bbolt.Tx) error {
		if err := fault.Err("do-done-commit"); err != nil {
			return err // as a failed write: the transaction rolls back
		}
		return b.st.put(tx, done, c.Started)
	})
}

// Release puts back the interrupted execution the claim recovered, or
// deletes the claim's started record.
func (b *boltBackend) Release(_ context.Context, c *idemcore.Claim, restore *Record) error {
	return b.write(func(tx *bbolt.Tx) error {
		if restore != nil {
			return b.st.put(tx, restore, c.Started)
		}
		return b.st.del(tx, c.Started)
	})
}

// RunTx runs fn in a write transaction of the commit pipeline, shared with
// concurrent writers (group commit: fn may run again, at most
// maxRuns times), and puts the done record fn returns in it. A claim
// of Token zero needs no write of its own: the core holds the key, and the
// file has one writer.
func (b *boltBackend) RunTx(_ context.Context, c *idemcore.Claim, fn func(tx *Tx) (*Record, error)) error {
	return b.write(func(btx *bbolt.Tx) error {
		tx := &Tx{tx: btx, b: b, key: c.Key}
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
func (b *boltBackend) Prune(ctx context.Context, req idemcore.PruneRequest) (idemcore.PruneResult, error) {
	return b.prune(ctx, req)
}

// Scan walks every stored record in one read transaction, slot by slot from
// the oldest, by key within a slot.
func (b *boltBackend) Scan(_ context.Context, fn func(r *Record, err error) error) error {
	defer b.reads.unmark(b.reads.mark()) // fn runs inside the read transaction
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
func (b *boltBackend) Enqueue(tx *Tx, m *idemcore.Message) error {
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
	return ob.Put(u64Key(seq), encodeMessage(nil, m))
}

// Committed is signalled after every commit of the pipeline.
func (b *boltBackend) Committed() <-chan struct{} { return b.commits }

// committed runs after every commit of the pipeline: the outbox index
// reads what it may have enqueued at the next ClaimDue, and the dispatcher
// is woken (Committed), without blocking.
func (b *boltBackend) committed() {
	b.ix.dirty.Store(true)
	select {
	case b.commits <- struct{}{}:
	default:
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
func (b *boltBackend) ClaimDue(_ context.Context, now time.Time, limit int) (idemcore.Due, error) {
	if err := b.pipe.Failed(); err != nil {
		return idemcore.Due{}, storageErr(err, b.maxSize)
	}
	ix := b.ix
	ix.mu.Lock()
	defer ix.mu.Unlock()
	corrupt, err := ix.load(b.db)
	if err != nil {
		return idemcore.Due{}, err
	}
	seqs, next := ix.due(now, limit)
	var due idemcore.Due
	err = view(b.db, func(tx *bbolt.Tx) error {
		ob := outboxBucket(tx)
		for _, seq := range seqs {
			v := ob.Get(u64Key(seq))
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
		return idemcore.Due{}, err
	}
	slices.SortFunc(due.Messages, func(a, b *idemcore.Message) int { return cmp.Compare(a.Seq, b.Seq) })
	if next.After(now) {
		due.Next = next
	}
	if len(corrupt) > 0 {
		due.Quarantined, err = b.quarantine(corrupt)
		if err != nil {
			ix.rescan.Store(true)
			b.log.Warn("idem: outbox: moving corrupt messages to the dead letters failed", "err", err)
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
			k := u64Key(seq)
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

// Messages walks the pending messages, then the dead letters, by Seq.
func (b *boltBackend) Messages(_ context.Context, fn func(m *idemcore.Message, err error) error) error {
	defer b.reads.unmark(b.reads.mark()) // fn runs inside the read transaction
	var inUser bool
	return viewUser(b.db, &inUser, func(tx *bbolt.Tx) error {
		for _, dead := range []bool{false, true} {
			bk := outboxBucket(tx)
			if dead {
				bk = deadBucket(tx)
			}
			c := bk.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				seq, _ := parseU64Key(k)
				m, err := decodeMessage(seq, v)
				if err != nil {
					m = &idemcore.Message{Seq: seq, Dead: dead}
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

// Close stops the commit pipeline and closes the file.
func (b *boltBackend) Close() error {
	b.pipe.Stop()
	return b.db.Close()
}

// write runs fn in the commit pipeline; its errors are mapped by storageErr.
func (b *boltBackend) write(fn commitFunc) error {
	return storageErr(b.pipe.Do(fn), b.maxSize)
}

// storageErr maps the commit pipeline's errors onto the engine's sentinels,
// keeping the cause in the chain: a stopped pipeline is ErrClosed, a failed
// commit ErrStorageFailed, bbolt's ErrMaxSizeReached ErrFileFull, a panic of
// bbolt's in a write (a damaged page) ErrCorrupt.
func storageErr(err error, maxSize int) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errPipelineStopped):
		return ErrClosed
	case errors.Is(err, errCommitFailed):
		return fmt.Errorf("%w: %w", ErrStorageFailed, err)
	case errors.Is(err, bolterrors.ErrMaxSizeReached):
		return fmt.Errorf("%w (BoltOptions.MaxSize is %d bytes): %w", ErrFileFull, maxSize, err)
	}
	// A write's panic is bbolt's on a damaged page (a DoTx fn's own panic
	// is the core's *PanicError, re-raised in its caller): the transaction
	// rolled back, the file is as it was.
	// (A failpoint's injected panic stays what it is.)
	if pe, ok := errors.AsType[*commitPanic](err); ok {
		if _, injected := pe.Value.(*fault.Panic); !injected {
			return damaged(pe.Value)
		}
	}
	return err
}
