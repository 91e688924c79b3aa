package core

import (
	"context"
	"errors"
	"fmt"
)

// Get returns key's live record without side effects: no execution, no
// recovery, no lock (idem.Engine.Get). A key with no live record gives
// ErrNotFound.
func (e *Engine[T]) Get(key string) (*Record, error) {
	if err := ValidateStoredKey(key); err != nil {
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

// Forget deletes key's record in any state (idem.Engine.Forget). An expired
// record that the pruner has not reached yet is deleted too, but reported as
// ErrNotFound: it is absent to every reader, as for Get and Resolve.
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

// Resolve completes an interrupted execution by hand (idem.Engine.Resolve):
// done with response and, if outcome is not nil, a stored *Error with its
// Code and Message.
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
	if err := ValidateStoredKey(key); err != nil {
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

// Records calls fn for every live record (idem.Engine.Records), in the
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

// Uncache drops key's entry from the replay cache, so the next replay reads
// the backend (tests that change a stored record behind the engine's back).
func (e *Engine[T]) Uncache(key string) { e.cache.forget(key) }
