package idemhttp

import (
	"context"
	"sync/atomic"
)

// Where a call stands, for callContext.
const (
	callWaiting int32 = iota // fn has not started: the request's end ends the call
	callStarted              // fn started: the call outlives the request
	callLeft                 // the request ended before fn started
)

// callContext is the context the middleware calls Do with: reqCtx's values,
// no deadline, and reqCtx's end only until fn starts, so that a waiting
// duplicate whose client goes away stops waiting while a handler whose
// client goes away runs on, its outcome recorded for the retry (fn's
// context, a child of this one, is the handler's: it ends when the engine
// closes or the lease is lost, never with the client). fn calls begin
// first: false if the request has ended, and then fn must not run the
// handler (its context is ending). One atomic state decides between the two,
// so there is no instant at which both could win. release frees the context
// after Do returns.
func callContext(reqCtx context.Context) (ctx context.Context, begin func() bool, release func()) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(reqCtx))
	var state atomic.Int32
	left := func() {
		if state.CompareAndSwap(callWaiting, callLeft) {
			cancel(context.Cause(reqCtx))
		}
	}
	stop := context.AfterFunc(reqCtx, left)
	begin = func() bool {
		if reqCtx.Err() != nil { // ended, its AfterFunc maybe not run yet
			left()
		}
		return state.CompareAndSwap(callWaiting, callStarted)
	}
	return ctx, begin, func() { stop(); cancel(nil) }
}
