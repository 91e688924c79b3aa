package idem

// A call's records on bbolt: the backend's Lookup, Complete, Release and
// RunTx (the claim is lock.go's), and WaitChange.

import (
	"context"
	"time"
	"unsafe"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/fault"
)

// Lookup reads the key's newest version in one read transaction; a live
// done record of another fingerprint is refused from its header alone. The
// engine's clock judges (no Info.Clock): at is zero.
func (b *boltBackend) Lookup(_ context.Context, q idemcore.Lookup) (rec *Record, at time.Time, err error) {
	err = b.viewRecords(func(tx recTx) error {
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

// Complete makes done durable (journal.go) in place of the claim's started record.
func (b *boltBackend) Complete(_ context.Context, c *idemcore.Claim, done *Record) error {
	return b.record(func(tx recTx) error {
		if err := fault.Err("do-done-commit"); err != nil {
			return err // as a failed write: its writes are dropped
		}
		return b.st.put(tx, done, c.Started)
	})
}

// Release puts back the interrupted execution the claim recovered, or
// deletes the claim's started record.
func (b *boltBackend) Release(_ context.Context, c *idemcore.Claim, restore *Record) error {
	return b.record(func(tx recTx) error {
		if restore != nil {
			return b.st.put(tx, restore, c.Started)
		}
		return b.st.del(tx, c.Started)
	})
}

// RunTx runs fn in the journal's next group, its writes and the done record
// it returns one caller's writes of the frame (fn runs once, unless another
// fn of its group calls runtime.Goexit); with the journal off, in a write
// transaction of the commit pipeline, shared with concurrent writers (group
// commit: fn may run again, at most maxRuns times), and puts the done
// record in it. A claim of Token zero needs no write of its own: the core
// holds the key, and the file has one writer.
func (b *boltBackend) RunTx(_ context.Context, c *idemcore.Claim, fn func(tx *Tx) (*Record, error)) error {
	if b.j != nil {
		var msgs int
		err := b.j.doAs(func(w *jtx) error {
			tx := &Tx{v: w.view(), b: b, key: c.Key, trace: c.Trace}
			done, err := fn(tx)
			tx.v, msgs = nil, tx.msgs
			if err != nil {
				return err
			}
			return b.st.put(w, done, c.Started)
		}, true)
		if err == nil && msgs > 0 {
			b.committed() // the dispatcher reads the outbox after a checkpoint (settleOutbox)
		}
		return storageErr(err, b.maxSize)
	}
	return b.write(func(btx *bbolt.Tx) error {
		tx := &Tx{tx: btx, b: b, key: c.Key, trace: c.Trace}
		done, err := fn(tx)
		tx.tx = nil
		if err != nil {
			return err
		}
		return b.st.put(boltRec{btx}, done, c.Started)
	})
}

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
