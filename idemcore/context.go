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

// fnContext derives fn's context: ctx's values and deadline, the Call, and
// cancellation on Stop and, for a claim that needs renewal, when the lease is
// lost (cause ErrLeaseLost).
func (e *Engine[T]) fnContext(ctx context.Context, c *leading, inTx bool) (context.Context, func()) {
	ctx = context.WithValue(ctx, callCtxKey{}, &callCtx{
		Call: Call{Key: c.key, Attempt: c.attempt, Recovered: c.recovered}, e: e, inTx: inTx})
	ctx, cancel := context.WithCancelCause(ctx)
	unregister := context.AfterFunc(e.ctx, func() { cancel(nil) })
	stopBeat := e.heartbeat(ctx, c.claim, cancel)
	return ctx, func() { stopBeat(); unregister(); cancel(nil) }
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

// heartbeat renews cl every Info().Heartbeat while fn runs, and cancels fn's
// context with cause ErrLeaseLost when a renewal fails or when the lease
// lapses first: each Renew runs with a deadline at the claim's last known
// LeaseUntil (by the local monotonic clock: backends stamp it from a local
// reading taken before the statement was sent, so it is never later than
// the lease's end by the backend's clock), and a timer at that instant
// cancels fn even if Renew has not returned (a blackholed connection, a
// pool whose connections are all busy). Without this a hung renewal would
// let fn run past its lease while another process takes the key over.
//
// The returned stop ends it (and waits for it and for a Renew in flight,
// whose context it cancels, so no Renew runs after). Nothing runs for a
// backend whose claims need no renewal (bbolt) or a claim not yet stored; a
// zero LeaseUntil never lapses.
func (e *Engine[T]) heartbeat(ctx context.Context, cl *Claim, cancel context.CancelCauseFunc) func() {
	every := e.info.Heartbeat
	if every <= 0 || cl == nil || cl.Token == 0 {
		return func() {}
	}
	rctx, quit := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		until := cl.LeaseUntil
		lapse := make(<-chan time.Time) // never, for a lease that never lapses
		var lt *time.Timer
		arm := func() {
			if until.IsZero() {
				return
			}
			if lt == nil {
				lt = time.NewTimer(time.Until(until))
				lapse = lt.C
				return
			}
			lt.Reset(time.Until(until))
		}
		arm()
		defer func() {
			if lt != nil {
				lt.Stop()
			}
		}()
		lost := func(why string, err error) {
			e.log.Warn("idem: "+why+": fn's context is cancelled", "err", err)
			cancel(ErrLeaseLost)
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-ctx.Done():
				return
			case <-lapse:
				lost("the claim's lease lapsed before a renewal succeeded", nil)
				return
			case <-t.C:
			}
			// Renew works on a copy, so that a Renew still running when the
			// lease lapsed writes nothing the call reads.
			rc := *cl
			rc.LeaseUntil = until
			dctx, dcancel := rctx, context.CancelFunc(func() {})
			if !until.IsZero() {
				dctx, dcancel = context.WithDeadline(rctx, until)
			}
			res := make(chan error, 1)
			go func() { res <- e.b.Renew(dctx, &rc) }()
			select {
			case err := <-res:
				dcancel()
				if err != nil {
					lost("cannot renew a claim", err)
					return
				}
				until = rc.LeaseUntil
				cl.LeaseUntil = until // read by the call only after stop
				arm()                 // Reset: no stale tick is received after it (Go 1.23 timers)
			case <-lapse:
				lost("the claim's lease lapsed while a renewal was in flight", nil)
				dcancel()
				<-res
				return
			case <-rctx.Done():
				dcancel()
				<-res
				return
			}
		}
	}()
	return func() { quit(); <-done }
}
