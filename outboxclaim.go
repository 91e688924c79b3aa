package idem

// The dispatcher's claims on bbolt: the due messages, from the outbox index
// (outboxindex.go), after every commit; messages that fail to decode are
// quarantined in the dead letters.

import (
	"cmp"
	"context"
	"slices"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/idemcore"
)

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
	if err := b.settle(true); err != nil {
		return idemcore.Due{}, err
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
