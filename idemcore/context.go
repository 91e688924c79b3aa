package idemcore

import (
	"context"
	"time"

	"github.com/idemkit/idem/internal/goid"
)

// Call describes the execution a fn belongs to (idem.Call); CallFrom reads it
// from fn's context.
type Call struct {
	// Key is the idempotency key: pass it on to the downstream system.
	Key string
	// Attempt is 1 on the first execution and counts re-executions.
	Attempt int
	// Recovered is true when this execution recovers an interrupted one: fn
	// may have had its effect before, so reconcile with the downstream system.
	Recovered bool
}

type callCtxKey struct{}

type callCtx struct {
	Call
	e    any // the *Engine[T] that gave fn its context
	inTx bool
}

// CallFrom returns the Call that ctx belongs to, if ctx is (derived from) the
// context given to fn by Do or DoTx of any engine.
func CallFrom(ctx context.Context) (Call, bool) {
	c, ok := ctx.Value(callCtxKey{}).(*callCtx)
	if !ok {
		return Call{}, false
	}
	return c.Call, true
}

// fnContext derives fn's context (a leaseCtx): ctx's values and deadline,
// the Call, and cancellation on Stop and, for a claim that needs renewal,
// when its lease passes unrenewed or a renewal fails (cause ErrLeaseLost).
func (e *Engine[T]) fnContext(ctx context.Context, c *leading, inTx bool) (context.Context, func()) {
	cl := c.claim
	beat := e.info.Heartbeat > 0 && cl != nil && cl.Token != 0
	var until time.Time
	if beat {
		until = cl.LeaseUntil
	}
	lc := newLeaseCtx(ctx, until, func() {
		e.log.Warn("idem: the claim's lease lapsed before a renewal succeeded: fn's context is cancelled")
	})
	lc.call = callCtx{Call: Call{Key: c.key, Attempt: c.attempt, Recovered: c.recovered}, e: e, inTx: inTx}
	lc.hasCall = true
	unregister := context.AfterFunc(e.ctx, func() { lc.cancel(nil) })
	stopBeat := func() {}
	if beat {
		stopBeat = e.heartbeat(lc, cl)
	}
	return lc, func() { stopBeat(); unregister(); lc.stop() }
}

// reentrant refuses, from the context fn was given, calls that would
// deadlock: any call from inside a DoTx fn (which holds the writer), and a
// call for the key whose fn is running. It is the cheap check, made before
// any read; a DoTx fn that passes another context is caught by the backend's
// Holding, checked only before a write and by the operator methods, never on
// the replay path.
func (e *Engine[T]) reentrant(ctx context.Context, key string) error {
	c, ok := ctx.Value(callCtxKey{}).(*callCtx)
	if !ok || c.e != any(e) {
		return nil
	}
	if c.inTx {
		return errInsideDoTx
	}
	if c.Key == key {
		return errOwnKey
	}
	return nil
}

// selfWait refuses a wait that would never end: on the flight of the fn that
// runs on this goroutine (a call with fn's own key, whatever its context), or
// from inside a DoTx fn, whose writer every leader needs. It is checked only
// before a wait, never on the replay path.
func (e *Engine[T]) selfWait(f *flight) error {
	if e.b.Holding() {
		return errInsideDoTx
	}
	if r := f.runner.Load(); r != 0 && r == goid.ID() {
		return errOwnKey
	}
	return nil
}

// heartbeat renews cl every Info().Heartbeat while fn runs, and ends fn's
// context lc with cause ErrLeaseLost when a renewal fails. Each renewal
// moves the lease lc judges by (its end, by the local monotonic clock:
// backends stamp it from a local reading taken before the statement was
// sent, so it is never later than the lease's end by the backend's clock),
// and runs with a deadline at the lease's end as last renewed: lc ends at
// that instant (its timer, or fn's own look) even if Renew has not returned
// (a blackholed connection, a pool whose connections are all busy), and a
// renewal that answers after it is too late to count. Without this a hung
// renewal would let fn run past its lease while another process takes the
// key over.
//
// The returned stop ends it (and waits for it and for a Renew in flight,
// whose context it cancels, so no Renew runs after). A zero LeaseUntil
// never lapses.
func (e *Engine[T]) heartbeat(lc *leaseCtx, cl *Claim) func() {
	every := e.info.Heartbeat
	rctx, quit := context.WithCancel(context.WithoutCancel(lc))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-lc.Done():
				return
			case <-t.C:
			}
			// Renew works on a copy, so that a Renew still running when the
			// lease lapsed writes nothing the call reads.
			rc := *cl
			dctx, dcancel := rctx, context.CancelFunc(func() {})
			if lc.leased {
				dctx, dcancel = context.WithDeadline(rctx, lc.until())
			}
			err := e.b.Renew(dctx, &rc)
			dcancel()
			switch {
			case rctx.Err() != nil: // stopped: fn has returned
				return
			case err != nil:
				lc.refused(func() { e.log.Warn("idem: cannot renew a claim: fn's context is cancelled", "err", err) })
				return
			case lc.Err() != nil: // the lease passed before the renewal answered
				return
			}
			cl.LeaseUntil = rc.LeaseUntil // read by the call only after stop
			if lc.leased && !rc.LeaseUntil.IsZero() {
				lc.extend(rc.LeaseUntil)
			}
		}
	}()
	return func() { quit(); <-done }
}
