package idemcore

import (
	"context"
	"errors"
	"fmt"
)

// Get returns key's live record without side effects: no execution, no
// recovery, no lock. A key with no record, or an expired one, gives
// ErrNotFound; an undecodable one ErrCorrupt.
//
// Get, Forget and Resolve take any key an earlier version could store (1 to
// MaxKeyLen bytes of UTF-8), also one that Do now refuses for white space at
// an end or an invisible character, so such records stay reachable.
func (e *Engine[T]) Get(key string) (*Record, error) {
	if err := validateStoredKey(key); err != nil {
		return nil, &OpError{Op: "get", Key: key, Err: err}
	}
	if err := e.Enter(); err != nil {
		return nil, &OpError{Op: "get", Key: key, Err: err}
	}
	defer e.calls.Done()
	rec, err := e.lookup(context.Background(), key, 0, false, e.now())
	if err != nil {
		return nil, OpErr("get", key, err)
	}
	if rec == nil {
		return nil, &OpError{Op: "get", Key: key, Err: ErrNotFound}
	}
	return rec, nil
}

// Forget deletes key's record in any state, so the next call runs fn as new:
// the next call of every engine on the store, once Forget has returned (an
// engine on a store several processes share, such as idempg's, answers no
// replay from its memory). It fails with ErrInProgress while a call with the key runs (on a backend
// shared by processes, in any of them), and with ErrNotFound if key has no
// live record: an expired record the pruner has not reached yet is deleted
// too, but absent, as for Get.
func (e *Engine[T]) Forget(key string) error {
	return e.operate("forget", key, func(ctx context.Context) error {
		e.cache.forget(key) // under the key: no call can cache it again meanwhile
		now := e.now()
		rec, at, err := e.b.Lookup(ctx, Lookup{Key: key, Now: now, Retention: e.opts.Retention})
		if err != nil && !errors.Is(err, ErrCorrupt) {
			return err // an undecodable record is still deleted below
		}
		if !at.IsZero() {
			now = at // the backend's clock judges (Info.Clock)
		}
		found, err := e.b.Forget(ctx, key)
		if err == nil && (!found || (rec != nil && !e.live(rec, now))) {
			err = ErrNotFound
		}
		return err
	})
}

// Resolve completes an interrupted execution by hand: key's started record
// becomes done with response and, if outcome is not nil, a stored *Error
// with outcome's Code and Message (its Replayed is ignored), as if fn had
// returned them. It fails with ErrNotFound if key has no live record, with
// ErrState if its record is done, and with ErrInProgress while a call with
// the key runs.
func (e *Engine[T]) Resolve(key string, response []byte, outcome *Error) error {
	return e.operate("resolve", key, func(ctx context.Context) error {
		now, err := e.clock(ctx) // judges the record and dates its completion
		if err != nil {
			return err
		}
		return e.b.Resolve(ctx, key, func(rec *Record) (*Record, error) {
			if rec == nil || !e.live(rec, now) {
				return nil, ErrNotFound // an expired record is absent, as for Get
			}
			if rec.State != StateStarted {
				return nil, fmt.Errorf("%w: the record is %s, only an interrupted execution can be resolved", ErrState, rec.State)
			}
			// The limit on what an outcome stores holds for a resolution too.
			n := len(response)
			if outcome != nil {
				n += len(outcome.Code) + len(outcome.Message)
			}
			if max := e.opts.MaxResponseSize; max > 0 && n > max {
				return nil, fmt.Errorf("%w: response and error of %d bytes exceed the limit of %d bytes (Options.MaxResponseSize)", ErrResponseTooLarge, n, max)
			}
			done := *rec
			done.State, done.CompletedAt, done.Response = StateDone, now, response
			if outcome != nil {
				done.Err = &Error{Code: outcome.Code, Message: outcome.Message}
			}
			return &done, nil
		})
	})
}

// operate runs an operator write on key while holding the key, so it never
// races a running call of this engine.
func (e *Engine[T]) operate(op, key string, fn func(ctx context.Context) error) error {
	if err := validateStoredKey(key); err != nil {
		return &OpError{Op: op, Key: key, Err: err}
	}
	if err := e.Enter(); err != nil {
		return &OpError{Op: op, Key: key, Err: err}
	}
	defer e.calls.Done()
	f, leader := e.locks.acquire(key, 0, e.now())
	if !leader {
		return &OpError{Op: op, Key: key, Err: ErrInProgress}
	}
	defer func() {
		f.end = endAgain
		e.locks.release(key, f)
	}()
	if err := fn(context.Background()); err != nil {
		return e.writeErr(op, key, err)
	}
	return nil
}

// Records calls fn for every live record, in one snapshot, in the
// backend's Scan order. A corrupt record is passed as a Record with only Key
// set, beside an ErrCorrupt error. An error from fn stops the walk.
func (e *Engine[T]) Records(fn func(r *Record, err error) error) error {
	if err := e.Enter(); err != nil {
		return &OpError{Op: "records", Err: err}
	}
	defer e.calls.Done()
	now, err := e.clock(context.Background())
	if err != nil {
		return OpErr("records", "", err)
	}
	var fnErr error // fn's own error, returned as it is
	err = e.b.Scan(context.Background(), func(r *Record, err error) error {
		if err == nil && !e.live(r, now) {
			return nil
		}
		if err != nil {
			err = OpErr("records", r.Key, err)
		}
		fnErr = fn(r, err)
		return fnErr
	})
	if err != nil && err == fnErr {
		return err
	}
	return OpErr("records", "", err)
}
