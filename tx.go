package idem

import (
	"bytes"
	"context"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/idemcore"
)

// Tx is the write transaction a DoTx fn runs in: its writes are made durable
// with the call's done record, together or not at all (in one frame of the
// write-ahead journal, or with the journal off in the bbolt transaction that
// stores the record). It is valid only until fn returns.
type Tx struct {
	tx   *bbolt.Tx // journal off
	v    *uview    // journal on
	b    *boltBackend
	key  string
	msgs int // outbox messages enqueued by this call, for their index
	// trace is the call's trace context, stored with each message
	// (idemcore.Claim.Trace).
	trace []byte
}

// Bucket returns the user's top-level bucket name, creating it if needed. The
// engine's own bucket ("idem") is refused with ErrReservedBucket. The bucket
// is valid only inside fn; write to it freely: the writes commit with the
// record, or not at all. A nested bucket is the Bucket's (Bucket.Bucket,
// CreateBucket, ...).
func (t *Tx) Bucket(name []byte) (*Bucket, error) {
	if t.tx == nil && t.v == nil {
		return nil, &OpError{Op: "bucket", Key: t.key, Err: ErrTxClosed}
	}
	if bytes.Equal(name, rootName) {
		return nil, &OpError{Op: "bucket", Key: t.key, Err: fmt.Errorf("%w: %q belongs to the engine", ErrReservedBucket, name)}
	}
	if t.v != nil {
		if err := t.v.createBucket("", name, true); err != nil {
			return nil, &OpError{Op: "bucket", Key: t.key, Err: err}
		}
		return &Bucket{t: t, path: pathKey(name)}, nil
	}
	b, err := t.tx.CreateBucketIfNotExists(name)
	if err != nil {
		return nil, &OpError{Op: "bucket", Key: t.key, Err: err}
	}
	return &Bucket{t: t, b: b}, nil
}

// DoTx is Do for effects that live in the same file: fn writes its own data
// through tx (user buckets, outbox messages) in the bbolt write transaction
// that stores the done record, so the effect and its record commit together
// or not at all, and no started record is needed. With the journal on
// (the default), fn's writes, the outbox messages it enqueues and the done
// record are one write of the journal's group commit: one fdatasync. idemcore.Engine.DoTx gives
// the outcomes (a permanent error recorded without fn's writes, Retryable and
// the end of fn's context storing nothing, a panic re-raised as a
// *PanicError, a recovering DoTx's own started record).
//
// Concurrent DoTx calls share one group commit. With the journal on, each
// fn's writes are kept apart, so one that fails or panics is dropped alone
// and fn runs once (again only if a fn of its group calls runtime.Goexit).
// With the journal off they share one bbolt write transaction, and bbolt
// has no savepoints: when one fn fails or panics, the whole transaction
// rolls back and the others run again without it. So fn MAY RUN MORE THAN
// ONCE, though never more than 3 times per call, whatever fails around it (a
// fn that ran twice in transactions rolled back for others runs its third
// time in a transaction of its own; DESIGN.md, "DoTx and group commit"), and
// it must touch nothing but tx (no I/O, no shared memory, no goroutines), and
// should be short: it holds the file's single writer while it runs, and
// every other call's commit waits for it. Calling the engine from inside fn returns
// ErrReentrant. fn may return bytes it read from tx: they are copied before
// the transaction ends. A nil fn is refused with an
// error, as in Do.
func (e *Engine) DoTx(ctx context.Context, key string, fingerprint []byte, fn func(ctx context.Context, tx *Tx) ([]byte, error)) (Result, error) {
	return e.c.DoTx(ctx, key, fingerprint, fn)
}

// PanicError is the panic value DoTx re-raises in the caller when fn
// panicked, on the caller's goroutine or the committer's (idemcore.PanicError:
// fn's panic Value and the Stack where it panicked).
type PanicError = idemcore.PanicError
