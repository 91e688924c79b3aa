package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/layout"
)

// Tx is the write transaction a DoTx fn runs in: the same bbolt transaction
// that stores the call's done record. It is valid only until fn returns.
type Tx struct {
	tx   *bbolt.Tx
	e    *Engine
	key  string
	msgs int // outbox messages enqueued by this call, for their index
}

// Bucket returns the user's top-level bucket name, creating it if needed. The
// engine's own bucket ("idem") is refused with ErrReservedBucket. The bucket
// is valid only inside fn; write to it freely: the writes commit with the
// record, or not at all.
func (t *Tx) Bucket(name []byte) (*bbolt.Bucket, error) {
	if t.tx == nil {
		return nil, &OpError{Op: "bucket", Key: t.key, Err: ErrTxClosed}
	}
	if bytes.Equal(name, layout.Root) {
		return nil, &OpError{Op: "bucket", Key: t.key, Err: fmt.Errorf("%w: %q belongs to the engine", ErrReservedBucket, name)}
	}
	b, err := t.tx.CreateBucketIfNotExists(name)
	if err != nil {
		return nil, &OpError{Op: "bucket", Key: t.key, Err: err}
	}
	return b, nil
}

// errRolledBack marks a DoTx fn outcome that must not commit: the pipeline
// rolls the transaction back and the caller records the outcome on its own.
var errRolledBack = errors.New("idem: fn's writes rolled back")

// DoTx is Do for effects that live in the same file: fn writes its own data
// through tx (user buckets, outbox messages) in the bbolt write transaction
// that stores the done record, so the effect and its record commit together
// or not at all, and no started record is needed. Key, fingerprint, replay,
// waiting and the returned errors are as for Do.
//
// If fn returns an error or panics, nothing it wrote commits. A permanent
// error is then recorded without fn's writes (in a transaction of its own) and
// replayed as in Do; Retryable(err), and any error returned once fn's own
// context has ended (the caller's ctx or Close), store nothing, so the key is
// free; a panic is re-raised in the caller as a *PanicError carrying the value
// and the stack, and the key is free too. A response over MaxResponseSize is
// recorded as ErrResponseTooLarge, also without fn's writes.
//
// Only the end of fn's own context is an interruption: a context error fn
// returns while its context is live (a downstream timeout) is a permanent
// error, recorded with its code.
//
// A DoTx that recovers an interrupted execution (left by Do, or by a DoTx
// that recovered one) first commits a started record of its own attempt, as
// Do does. However it then ends without an outcome (Retryable, the end of its
// context, a panic, a failed commit), that record stays: the next call still
// recovers, with the attempt after this one. Attempt numbers never repeat.
//
// Concurrent DoTx calls share one write transaction (group commit), and bbolt
// has no savepoints: when one fn fails or panics, the whole transaction rolls
// back and the others run again without it. So fn MAY RUN MORE THAN ONCE,
// though never more than 3 times per call, whatever fails around it (a fn
// that ran twice in transactions rolled back for others runs its third time
// in a transaction of its own; DESIGN.md, "DoTx and group commit"), and it
// must touch nothing but tx (no I/O, no shared memory, no goroutines), and
// should be short: it holds the file's single writer while it runs, and every
// other call's commit waits for it. Calling the engine from inside fn returns
// ErrReentrant. fn may return bytes it read from tx: they are copied before
// the transaction ends. A bucket's Tx method reaches the raw bbolt
// transaction: do not use it (to commit, roll back, or reach the engine's
// bucket); the engine's records are not an API.
func (e *Engine) DoTx(ctx context.Context, key string, fingerprint []byte, fn func(ctx context.Context, tx *Tx) ([]byte, error)) (Result, error) {
	res, err := e.call(ctx, "dotx", key, fingerprint, func(ctx context.Context, c *leading) (Result, error) {
		return e.executeTx(ctx, c, fn)
	})
	return res, opError("dotx", key, err)
}

func (e *Engine) executeTx(ctx context.Context, c *leading, fn func(context.Context, *Tx) ([]byte, error)) (Result, error) {
	if e.pipe.Holding() {
		c.again = true
		return Result{}, &OpError{Op: "dotx", Key: c.key, Err: errInsideDoTx}
	}
	started := &Record{Key: c.key, State: StateStarted, Fingerprint: c.fp, Attempt: c.attempt, StartedAt: e.now()}
	// stands is this call's record in the file while fn runs: none for a
	// new key; when recovering an interrupted execution, a started record of
	// this attempt, committed first (as Do does), so that however this
	// attempt ends the evidence of the earlier unknown outcome stays and its
	// attempt number is not given out again.
	var stands *Record
	if c.prev != nil {
		if err := e.pipe.Do(func(tx *bbolt.Tx) error { return e.st.put(tx, started, c.prev) }); err != nil {
			c.again = true
			return Result{}, e.writeErr("dotx", c.key, err)
		}
		if err := ctx.Err(); err != nil {
			// fn has not started: put the key back as it was.
			c.again = true
			if rerr := e.pipe.Do(func(tx *bbolt.Tx) error { return e.restore(tx, c, started) }); rerr != nil {
				e.log.Warn("idem: cannot remove a started record after cancellation", "err", rerr)
			}
			return Result{}, err
		}
		stands = started
	}
	// lost marks this call as ending without an outcome: waiters get
	// ErrIncomplete if an interrupted execution stands, else they try to
	// lead (nothing was stored, the key is free).
	lost := func() {
		c.again, c.incomplete = stands == nil, stands != nil
	}
	fnCtx, stop := e.fnContext(ctx, c, true)
	defer stop()
	var (
		resp    []byte
		ferr    error
		ended   bool // fn's own context had ended when it returned
		fnPanic *PanicError
		done    *Record
	)
	e.observe(Event{Kind: EventExecution, Op: "dotx", N: c.attempt})
	e.n.executions.Add(1)
	lost() // until the pipeline answers: fn may call runtime.Goexit
	err := e.pipe.Do(func(btx *bbolt.Tx) error {
		done = nil // fn may run again: only the last run's outcome counts
		tx := &Tx{tx: btx, e: e, key: c.key}
		resp, ferr, fnPanic = callTx(fnCtx, tx, fn)
		ended = fnCtx.Err() != nil // before stop, which cancels fnCtx
		tx.tx = nil
		if fnPanic != nil {
			return errRolledBack
		}
		// fn may return bytes read from tx (b.Get): they point into the
		// file's memory and are invalid once the transaction ends.
		resp = cloneBytes(resp)
		if ferr != nil {
			return errRolledBack
		}
		done = e.doneRecord(started, resp, nil)
		if done.Err != nil { // too large: fail closed without fn's writes
			return errRolledBack
		}
		fault.Point("dotx-before-commit")
		return e.st.put(btx, done, stands)
	})
	c.again, c.incomplete = false, false
	res := Result{Response: resp, Attempt: c.attempt, StartedAt: started.StartedAt}
	switch {
	case err == nil:
		fault.Point("dotx-after-commit")
		e.remember(done)
		return e.firstAnswer(done, resp, nil)
	case fnPanic != nil:
		lost()
		panic(fnPanic)
	case err != errRolledBack:
		// The commit failed (a write error, or a panic of bbolt's or of the
		// engine's own code in it): nothing of fn's committed.
		lost()
		return res, e.writeErr("dotx", c.key, err)
	case errors.Is(ferr, ErrRetryable):
		// Nothing of fn's committed. A new key is free; a recovery keeps its
		// started record, since fn's promise covers this attempt only.
		// Waiters get the same error and may retry at once.
		return res, ferr
	case ferr != nil && ended:
		// fn's own context ended (the caller's ctx or Close): its error is an
		// interruption, not an outcome; a context error fn made itself
		// while its context was live is a permanent error.
		lost()
		return res, ferr
	}
	// A permanent error or an oversized response: record it alone.
	if done == nil || done.Err == nil {
		done = e.doneRecord(started, resp, ferr)
	}
	if err := e.pipe.Do(func(tx *bbolt.Tx) error { return e.st.put(tx, done, stands) }); err != nil {
		lost()
		return res, e.writeErr("dotx", c.key, err)
	}
	e.remember(done)
	return e.firstAnswer(done, resp, ferr)
}

// callTx runs a DoTx fn, turning its panic into a *PanicError with the stack
// where it panicked, so that a panic of fn is told apart from one of the
// engine or bbolt inside the same commit.
func callTx(ctx context.Context, tx *Tx, fn func(context.Context, *Tx) ([]byte, error)) (resp []byte, err error, pe *PanicError) {
	defer func() {
		if v := recover(); v != nil {
			pe = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	resp, err = fn(ctx, tx)
	return resp, err, nil
}

// PanicError is the panic value DoTx re-raises in the caller when fn panicked
// on the committer goroutine: fn's panic value and the stack where it
// panicked.
type PanicError struct {
	Value any
	Stack []byte
}

func (p *PanicError) Error() string {
	return fmt.Sprintf("DoTx fn panicked: %v\n\n%s", p.Value, p.Stack)
}
