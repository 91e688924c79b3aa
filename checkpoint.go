package idem

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"syscall"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/internal/fault"
)

// The checkpoint: a goroutine of the journal's brings bbolt up to date with
// the overlay, off the callers' path, in one bbolt transaction committed and
// fsync'ed as any other (never NoSync: a NoSync commit may reuse a page the
// last durable meta still points to, and a power cut then tears the file).
// The transaction writes the overlay's entries and, beside them, the
// sequence number of the last frame they cover (the journal meta, layout.go),
// so bbolt holds a frame's writes exactly when it holds the checkpoint that
// covers it. Then the overlay lets go of those entries and the journal of
// the segments they came from (segment.go).
//
// It runs catchUpDelay after the first frame it has not covered (so one
// checkpoint serves many calls), at once when the journal is full (its
// writers wait: back-pressure), before a direct write, Backup and Close.
// A checkpoint that fails fails the engine closed, as a failed commit does;
// the frames it did not cover stay in the journal, and the next Open
// replays them. Only a full disk (ENOSPC) while no writer waits for room in
// the journal is tried again instead: the writes are durable in the
// journal, and the file is as its last checkpoint left it.

// errCheckpointLater is the error of a checkpoint that a full disk refused
// while no writer waited for it: nothing failed closed.
var errCheckpointLater = errors.New("journal: checkpoint refused by a full disk; it is tried again")

// kick asks for a checkpoint: urgent when writers wait for it.
func (j *journal) kick(urgent bool) {
	c := j.kickc
	if urgent {
		c = j.urgentc
	}
	select {
	case c <- struct{}{}:
	default:
	}
}

// loop runs the checkpoints until close.
func (j *journal) loop() {
	defer close(j.done)
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-j.quit:
			return
		case <-j.urgentc:
		case <-j.kickc:
			t.Reset(time.Duration(j.delay.Load()))
			select {
			case <-j.quit:
				t.Stop()
				return
			case <-j.urgentc:
				t.Stop()
			case <-t.C:
			}
		}
		if err := j.catchUp(); errors.Is(err, errCheckpointLater) {
			j.log.Warn("idem: journal: checkpoint failed; its frames stay in the journal and the next one tries again", "err", err)
		} else if err != nil {
			j.log.Error("idem: journal: checkpoint failed; the engine refuses writes until it is reopened, which replays the journal", "err", err)
			return
		}
	}
}

// catchUp commits the overlay's entries to bbolt with the checkpoint at the
// last frame they cover, then drops them from the overlay and releases the
// segments the checkpoint covers.
func (j *journal) catchUp() error {
	j.ckMu.Lock()
	defer j.ckMu.Unlock()
	if err := j.pipe.Failed(); err != nil {
		return err
	}
	j.ov.mu.RLock()
	upTo := j.ov.last
	var (
		snap  []bucketSnap
		usnap []userSnap
	)
	if upTo > j.ckpt.Load() {
		snap, usnap = j.ov.snapshot(nil), j.ov.snapshotUser()
	}
	j.ov.mu.RUnlock()
	if upTo <= j.ckpt.Load() {
		return nil
	}
	if err := fault.Err("checkpoint-before-commit"); err != nil {
		err = j.pipe.fail(err) // as a commit that failed
		j.segs.wake()
		return err
	}
	err := update(j.db, func(tx *bbolt.Tx) error {
		for _, b := range snap {
			for _, e := range b.kvs {
				if err := applyMutation(tx, []byte(b.name), []byte(e.key), e.e.value, e.e.del); err != nil {
					return err
				}
			}
		}
		if err := applyUserSnap(tx, usnap); err != nil {
			return err
		}
		return putJournalMeta(tx, j.id, upTo)
	})
	if err == nil {
		err = fault.Err("checkpoint-after-commit") // as an fsync error reported once the pages reached the file
	}
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) && j.waiting.Load() == 0 {
			// A full disk refused bbolt's growth: nothing is lost (the
			// frames stay in the journal, the overlay serves them) and the
			// next checkpoint tries again, unless writers wait for this one.
			return fmt.Errorf("%w: %w", errCheckpointLater, err)
		}
		err = j.pipe.fail(err)
		j.segs.wake() // writers waiting for room get the failure
		return err
	}
	j.ckpt.Store(upTo)
	j.checkpoints.Add(1)
	j.ov.mu.Lock()
	j.ov.drop(upTo)
	j.ov.mu.Unlock()
	j.segs.release(upTo)
	return nil
}

// backup writes a copy of the file that needs no journal to w: with no
// group or direct write running (mode), every frame checkpointed into bbolt,
// then, in one write transaction, the copy of the committed file (its
// journal id the old one) and the file's new journal id, which the frames
// after it carry (their salt): the copy, restored beside this journal,
// finds none of them its own.
func (j *journal) backup(w io.Writer) (n int64, err error) {
	j.mode.Lock()
	defer j.mode.Unlock()
	if err := j.drain(); err != nil {
		return 0, err
	}
	j.ckMu.Lock()
	defer j.ckMu.Unlock()
	fresh := newJournalID()
	var copyErr error
	err = update(j.db, func(tx *bbolt.Tx) error {
		if n, copyErr = tx.WriteTo(w); copyErr != nil { // the committed file: this tx has changed nothing yet
			return copyErr
		}
		return putJournalMeta(tx, fresh, j.ckpt.Load())
	})
	switch {
	case copyErr != nil:
		return n, copyErr // rolled back: the file keeps its journal id
	case err != nil:
		// The new id may or may not be on disk: which salt the next frame
		// needs is unknown, so the engine fails closed, as after any
		// failed commit.
		return n, j.pipe.fail(err)
	}
	j.id, j.salt = fresh, journalSalt(fresh)
	return n, nil
}

// update is db.Update, turning a panic of bbolt's (a damaged page) into an
// error.
func update(db *bbolt.DB, fn func(tx *bbolt.Tx) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &commitPanic{Value: v, Stack: debug.Stack()}
		}
	}()
	return db.Update(fn)
}

// applyMutation makes one journaled write in bbolt: a put creates its bucket
// under the engine's root if need be; a delete of a key or bucket that is not
// there does nothing (so a replay may apply a frame twice).
func applyMutation(tx *bbolt.Tx, bucket, key, value []byte, del bool) error {
	root := rootBucket(tx)
	if del {
		if b := root.Bucket(bucket); b != nil {
			return b.Delete(key)
		}
		return nil
	}
	b, err := root.CreateBucketIfNotExists(bucket)
	if err != nil {
		return err
	}
	return b.Put(key, value)
}

// applyOrdered applies one write of a frame to bbolt, in the frame's order.
func applyOrdered(tx *bbolt.Tx, m mutation) error {
	if m.op != 0 {
		return applyUserMutation(tx, m)
	}
	return applyMutation(tx, m.bucket, m.key, m.value, m.del)
}

// boltGet reads key in bucket under the engine's root, or nil.
func boltGet(tx *bbolt.Tx, bucket, key []byte) []byte {
	if b := rootBucket(tx).Bucket(bucket); b != nil {
		return b.Get(key)
	}
	return nil
}

// The journal meta (layout.go): the file's journal id and the checkpoint,
// 8 bytes big endian each.

// putJournalMeta records the journal id and the checkpoint in tx.
func putJournalMeta(tx *bbolt.Tx, id, ckpt uint64) error {
	v := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(make([]byte, 0, 16), id), ckpt)
	return rootBucket(tx).Bucket(metaName).Put(journalKey, v)
}

// journalMeta reads the journal id and the checkpoint; ok is false for a
// file without them (before format version 3).
func journalMeta(tx *bbolt.Tx) (id, ckpt uint64, ok bool, err error) {
	v := rootBucket(tx).Bucket(metaName).Get(journalKey)
	if v == nil {
		return 0, 0, false, nil
	}
	if len(v) != 16 {
		return 0, 0, false, fmt.Errorf("%w: journal meta of %d bytes, not 16", ErrCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:]), true, nil
}

// journalSalt is the frames' checksum seed of journal id.
func journalSalt(id uint64) uint32 { return uint32(id) ^ uint32(id>>32) }

// newJournalID is a random journal id, never 0.
func newJournalID() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // crypto/rand's Read never fails
		if id := binary.BigEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}
