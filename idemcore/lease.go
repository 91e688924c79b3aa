package idemcore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// leaseCtx is the context of work that holds a lease: fn's (its key's
// claim) and an outbox handler's (its message's claim). It carries its
// parent's values and deadline and ends with its parent, with stop, and
// with cause ErrLeaseLost once the lease has passed unrenewed.
//
// Err and Done judge the lease, as last renewed, by this process's
// monotonic clock on every call: fn resumed after a freeze (SIGSTOP, a long
// GC pause, a starved scheduler) finds its context ended on its first look,
// whichever of the process's goroutines runs first. One that finds the
// lease passed cancels the context before it answers, so Done is closed
// whenever Err is not nil. A timer at the lease's end cancels it for those
// that only wait on Done. Children derived from it (WithCancel, WithTimeout,
// AfterFunc) register with the cancelCtx inside, whose Value and Done it
// passes on, and end when it is cancelled; they do not judge the lease
// themselves.
type leaseCtx struct {
	context.Context // a cancelCtx over the parent
	cancel          context.CancelCauseFunc

	call    callCtx // fn's, answered for callCtxKey{} when hasCall
	hasCall bool

	leased bool         // a lease to judge (else the context never lapses)
	base   time.Time    // a monotonic reading: end counts from it
	end    atomic.Int64 // the lease's end, in nanoseconds after base
	lost   atomic.Bool  // ended for the lease (lapsed, or a renewal refused)
	logged atomic.Bool  // the lapse was logged
	lapsed func()       // logs a lapse, once; nil: not logged

	mu      sync.Mutex // guards timer against stop
	timer   *time.Timer
	stopped bool
}

// newLeaseCtx returns a context over parent whose lease ends at until (a
// reading of this process's clock, with its monotonic part: backends stamp
// it from a reading taken before the claim was sent). A zero until is a
// context that never lapses: parent's, with stop. lapsed, if not nil, logs
// a lapse, once; it is set before the timer starts, which may call it.
func newLeaseCtx(parent context.Context, until time.Time, lapsed func()) *leaseCtx {
	c := &leaseCtx{lapsed: lapsed}
	c.Context, c.cancel = context.WithCancelCause(parent)
	if until.IsZero() {
		return c
	}
	c.leased, c.base = true, until
	c.mu.Lock()
	c.timer = time.AfterFunc(max(c.left(), 0), c.expire)
	c.mu.Unlock()
	return c
}

// Err reports the lease's end the moment it has passed.
func (c *leaseCtx) Err() error {
	c.judge()
	return c.Context.Err()
}

// Done is closed once the lease has passed, also when no timer has run
// since.
func (c *leaseCtx) Done() <-chan struct{} {
	c.judge()
	return c.Context.Done()
}

// Value answers fn's Call itself and passes every other key on
// (context.Cause's, and the children's registration, included).
func (c *leaseCtx) Value(key any) any {
	if _, ok := key.(callCtxKey); ok && c.hasCall {
		return &c.call
	}
	return c.Context.Value(key)
}

// left is the time until the lease's end, as last renewed (negative once it
// has passed).
func (c *leaseCtx) left() time.Duration {
	return time.Until(c.base) + time.Duration(c.end.Load())
}

// until is the lease's end, as last renewed.
func (c *leaseCtx) until() time.Time { return c.base.Add(time.Duration(c.end.Load())) }

// extend moves the lease's end to until, after a renewal.
func (c *leaseCtx) extend(until time.Time) { c.end.Store(int64(until.Sub(c.base))) }

// judge ends the context if its lease has passed.
func (c *leaseCtx) judge() {
	if c.leased && c.left() <= 0 && c.Context.Err() == nil {
		c.lose()
	}
}

// lose ends the context with cause ErrLeaseLost (no-op if it has ended
// otherwise) and reports whether this call was the first to lose the lease.
// It cancels also when it is not the first, so that, on return, the context
// has ended whichever goroutine lost the lease first.
func (c *leaseCtx) lose() bool {
	first := c.lost.CompareAndSwap(false, true)
	c.cancel(ErrLeaseLost)
	return first
}

// refused ends the context after a renewal that cannot succeed (the claim
// is another's), logging with log unless the lease was lost already.
func (c *leaseCtx) refused(log func()) {
	if c.lose() && c.logged.CompareAndSwap(false, true) {
		log()
	}
}

// expire is the timer: at the lease's end, as renewed when it fires, the
// context ends; before it, the timer waits for that end.
func (c *leaseCtx) expire() {
	if left := c.left(); left > 0 && !c.lost.Load() {
		c.mu.Lock()
		if !c.stopped {
			c.timer.Reset(left)
		}
		c.mu.Unlock()
		return
	}
	c.lose()
	c.report()
}

// report logs a lapse that ended the context, once.
func (c *leaseCtx) report() {
	if c.lost.Load() && c.lapsed != nil && context.Cause(c.Context) == ErrLeaseLost && c.logged.CompareAndSwap(false, true) {
		c.lapsed()
	}
}

// stop ends the context and its timer (a lapse found by fn and not yet
// logged is logged now).
func (c *leaseCtx) stop() {
	if c.leased {
		c.mu.Lock()
		c.stopped = true
		c.timer.Stop()
		c.mu.Unlock()
		c.report()
	}
	c.cancel(nil)
}
