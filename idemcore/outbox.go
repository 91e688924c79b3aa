package idemcore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/fault"
)

// withDefaults returns o with its zero values replaced by the defaults and
// MaxBackoff raised to BaseBackoff; Handlers is left out (the Outbox copies
// it).
func (o OutboxOptions) withDefaults() OutboxOptions {
	if o.Workers <= 0 {
		o.Workers = DefaultOutboxWorkers
	}
	if o.BaseBackoff <= 0 {
		o.BaseBackoff = DefaultOutboxBaseBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultOutboxMaxBackoff
	}
	o.MaxBackoff = max(o.MaxBackoff, o.BaseBackoff)
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultOutboxMaxAttempts
	}
	if o.DeadLetterRetention <= 0 {
		o.DeadLetterRetention = DefaultOutboxDeadLetterRetention
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultOutboxPollInterval
	}
	o.Handlers = nil
	return o
}

// dispatcher is an engine's outbox dispatcher, written once for every
// backend and driven only through the Backend's outbox methods (ClaimDue,
// Delivered, Failed, Committed); the engine's calls on the outbox (Messages,
// RetryDead, DropDead) go to the Backend's methods of the same names.
//
// The dispatcher (run) claims due heads of ordering keys with ClaimDue, up
// to Workers at a time, and hands each to its topic's handler on a goroutine
// of its own. A handler's nil marks the message Delivered; its error (or
// panic) counts a failed attempt: Failed with the next attempt after an
// exponential backoff with jitter, or, after MaxAttempts, with Dead set
// (the backend moves it to the dead letters). A message whose topic has no
// handler is parked: its claim is kept, so it holds back its ordering key,
// until Handle registers one or Run ends, and is then given back (Failed,
// unchanged). The dispatcher wakes on every commit (Backend.Committed), when
// a worker ends, at the earliest next attempt the backend reports
// (Due.Next), and at least every PollInterval.
type dispatcher[T any] struct {
	e    *Engine[T]
	opts OutboxOptions // defaults filled in, Handlers nil

	mu       sync.Mutex
	handlers map[string]Handler
	parked   map[uint64]*Message // claimed, their topic without a handler

	wake      chan struct{}   // capacity 1: RetryDead, Handle
	commits   <-chan struct{} // the backend's: its commits (Backend.Committed)
	running   atomic.Bool
	delivered atomic.Uint64
	loops     atomic.Uint64
}

// newDispatcher returns e's dispatcher with options o (defaults filled in)
// and handlers, which it copies.
func newDispatcher[T any](e *Engine[T], o OutboxOptions, handlers map[string]Handler) *dispatcher[T] {
	ob := &dispatcher[T]{e: e, opts: o, handlers: make(map[string]Handler, len(handlers)),
		parked: make(map[uint64]*Message), wake: make(chan struct{}, 1)}
	for topic, h := range handlers {
		if h != nil {
			ob.handlers[topic] = h
		}
	}
	ob.commits = e.b.Committed()
	return ob
}

// wakeUp makes the dispatcher look for due messages now; it never blocks.
func (ob *dispatcher[T]) wakeUp() {
	select {
	case ob.wake <- struct{}{}:
	default:
	}
}

// Handler returns topic's handler, nil if it has none.
func (e *Engine[T]) Handler(topic string) Handler {
	ob := e.ob
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return ob.handlers[topic]
}

// Handle registers h for topic's messages, replacing the previous handler
// (OutboxOptions.Handlers at open); a nil h removes it. Messages of a topic
// without a handler wait in the outbox, holding back the later messages of
// their ordering key; claimed ones are given back when a handler is
// registered or the dispatcher stops.
func (e *Engine[T]) Handle(topic string, h Handler) {
	ob := e.ob
	ob.mu.Lock()
	if h == nil {
		delete(ob.handlers, topic)
	} else {
		ob.handlers[topic] = h
	}
	var back []*Message
	for seq, m := range ob.parked {
		if h != nil && m.Topic == topic {
			back = append(back, m)
			delete(ob.parked, seq)
		}
	}
	ob.mu.Unlock()
	ob.giveBack(back)
	ob.wakeUp()
}

// giveBack returns the claims of ms, unchanged, so that a dispatcher claims
// them again.
func (ob *dispatcher[T]) giveBack(ms []*Message) {
	for _, m := range ms {
		if err := ob.e.b.Failed(context.Background(), m); err != nil && !errors.Is(err, ErrMessageNotFound) {
			ob.e.log.Warn("idem: outbox: giving a claimed message back failed", "topic", m.Topic, "seq", m.Seq, "err", err)
		}
	}
}

// deadExpired reports whether dead letter m is past its retention at now
// (DeadLetterExpiry, with this engine's DeadLetterRetention).
func (ob *dispatcher[T]) deadExpired(m *Message, now time.Time) bool {
	return !now.Before(DeadLetterExpiry(m, ob.opts.DeadLetterRetention))
}

// backoff is the wait after the failed attempt number n (from 1):
// BaseBackoff doubled n-1 times, capped at MaxBackoff, jittered into
// [w/2, w) by jitter in [0, 1).
func backoff(o OutboxOptions, n int, jitter float64) time.Duration {
	w := o.MaxBackoff
	if n-1 < 62 && o.BaseBackoff <= o.MaxBackoff>>(n-1) {
		w = o.BaseBackoff << (n - 1)
	}
	return w/2 + time.Duration(jitter*float64(w/2))
}

// Dispatch runs the engine's dispatcher (see OutboxOptions.Dispatch, which
// runs it from open) until ctx ends (ctx.Err()) or the engine closes (an
// error wrapping ErrClosed). A second Dispatch while one runs, or while
// OutboxOptions.Dispatch runs one, fails with an error wrapping
// ErrDispatcherRunning: one dispatcher per engine. Handlers get a context
// that ends with Dispatch; an attempt cut short that way does not count, and
// its claim is given back. On return every handler it started has returned.
// On a store shared by processes (idempg), the dispatchers of several
// engines drain one outbox together.
func (e *Engine[T]) Dispatch(ctx context.Context) error {
	err := e.ob.run(ctx)
	if errors.Is(err, ErrClosed) || errors.Is(err, ErrDispatcherRunning) {
		return &OpError{Op: "dispatch", Err: err}
	}
	return err
}

// run is the dispatcher: it delivers due messages until ctx ends (it then
// returns ctx.Err()) or the engine stops (ErrClosed). A second run at once
// fails with ErrDispatcherRunning. Handlers get a context that ends with
// run; an attempt cut short that way does not count, and its claim is given
// back. On a backend whose claims lapse it ends too, with cause
// ErrLeaseLost, at the message claim's end as last renewed (a leaseCtx); an
// attempt that fails then does not count, and the message is left as it is
// (another dispatcher may hold it). On return every handler it started has
// returned, and every parked claim is given back.
func (ob *dispatcher[T]) run(ctx context.Context) error {
	if err := ob.e.enter(); err != nil {
		return err
	}
	defer ob.e.calls.Done()
	if !ob.running.CompareAndSwap(false, true) {
		return ErrDispatcherRunning
	}
	defer ob.running.Store(false)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(ob.e.ctx, cancel)()

	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		ob.mu.Lock()
		var back []*Message
		for seq, m := range ob.parked {
			back = append(back, m)
			delete(ob.parked, seq)
		}
		ob.mu.Unlock()
		ob.giveBack(back)
	}()
	workers := ob.opts.Workers
	done := make(chan struct{}, workers)
	busy := 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var lastErr string // the last claim error logged, not to log it every poll
	for {
		ob.loops.Add(1)
		wait := ob.opts.PollInterval
		if free := workers - busy; free > 0 {
			due, err := ob.claim(ctx, free)
			switch {
			case err != nil && ctx.Err() == nil:
				if s := err.Error(); s != lastErr {
					lastErr = s
					ob.e.log.Warn("idem: outbox: claiming messages failed", "err", err)
				}
			case err == nil:
				lastErr = ""
			}
			if n := len(due.Quarantined); n > 0 {
				ob.e.log.Warn("idem: outbox: corrupt messages moved to the dead letters", "messages", n)
				for range n {
					ob.e.observe(Event{Kind: EventDeadLetter})
				}
			}
			if ctx.Err() != nil {
				ob.giveBack(due.Messages) // stopping: give the claims back
				due.Messages = nil
			}
			for _, m := range due.Messages {
				h := ob.handlerOrPark(m)
				if h == nil {
					continue
				}
				busy++
				wg.Go(func() {
					defer func() { done <- struct{}{} }()
					ob.deliver(ctx, h, m, due.ClaimUntil)
				})
			}
			if d := due.Next.Sub(ob.e.now()); !due.Next.IsZero() && d > 0 && ob.e.info.Clock == nil {
				wait = min(wait, d)
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			if ob.e.ctx.Err() != nil {
				return ErrClosed
			}
			return ctx.Err()
		case <-ob.wake:
		case <-ob.commits:
		case <-done:
			busy--
		case <-timer.C:
		}
		timer.Stop()
	drain:
		for {
			select {
			case <-done:
				busy--
			default:
				break drain
			}
		}
	}
}

// claim is one ClaimDue, bounded by Info().ClaimTimeout and not cut short by
// ctx: a claim that committed but whose answer was dropped would hold its
// messages for a lease.
func (ob *dispatcher[T]) claim(ctx context.Context, limit int) (Due, error) {
	cctx := context.WithoutCancel(ctx)
	if d := ob.e.info.ClaimTimeout; d > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(cctx, d)
		defer cancel()
	}
	return ob.e.b.ClaimDue(cctx, ob.e.now(), limit)
}

// handlerOrPark returns m's handler, or parks m if its topic has none.
func (ob *dispatcher[T]) handlerOrPark(m *Message) Handler {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	h := ob.handlers[m.Topic]
	if h == nil {
		ob.parked[m.Seq] = m
	}
	return h
}

// deliver runs on a worker goroutine: the handler, then Delivered or
// Failed. until is when m's claim lapses unless renewed (Due.ClaimUntil);
// the handler's context ends then (cause ErrLeaseLost), as fn's does at its
// lease's end.
func (ob *dispatcher[T]) deliver(ctx context.Context, h Handler, m *Message, until time.Time) {
	b, wctx := ob.e.b, context.WithoutCancel(ctx)
	hm := *m
	hm.Attempt = m.Failures + 1 // the one in progress
	hm.DownstreamKey = DownstreamKey(m.Key, m.Index)
	// An error at a point before or after the handler counts as a failed
	// attempt (the handler not called, or its success lost).
	herr := fault.Err("outbox-before-handler")
	lost := false // the claim was lost while the handler ran
	outcome := DeliveryAbandoned
	base := ctx
	if t := ob.e.opts.Tracer; t != nil {
		base = t.StartDelivery(ctx, DeliveryStart{Topic: m.Topic, Seq: m.Seq, Attempt: hm.Attempt, Trace: m.Trace, Backend: ob.e.info.Name})
		start := time.Now()
		defer func() { t.EndDelivery(base, DeliveryEnd{Outcome: outcome, Err: herr, Duration: time.Since(start)}) }()
	}
	if herr == nil {
		hctx := base
		var lc *leaseCtx
		if !until.IsZero() {
			lc = newLeaseCtx(base, until, func() {
				ob.e.log.Warn("idem: outbox: a handler's claim lapsed before a renewal succeeded: its context is cancelled", "topic", m.Topic, "seq", m.Seq)
			})
			hctx = lc
		}
		stopRenew := ob.renewWhileRunning(wctx, m, lc)
		herr = ob.call(hctx, h, hm)
		stopRenew()
		if lc != nil {
			lost = context.Cause(lc) == ErrLeaseLost
			lc.stop()
		}
		if herr == nil {
			herr = fault.Err("outbox-after-handler")
		}
	}
	switch {
	case herr == nil:
		err := b.Delivered(wctx, m)
		if err == nil {
			err = fault.Err("outbox-after-mark") // as a mark whose answer was lost
		}
		switch {
		case err == nil:
			outcome = DeliveryDelivered
			ob.delivered.Add(1)
			ob.e.observe(Event{Kind: EventDelivery, Topic: m.Topic})
		case errors.Is(err, ErrMessageNotFound):
		default:
			// Still stored: delivered again after a backoff, not counted
			// as a failure.
			ob.e.log.Warn("idem: outbox: removing a delivered message failed; it will be delivered again", "topic", m.Topic, "seq", m.Seq, "err", err)
			if now, err := ob.e.clock(wctx); err == nil {
				m.NextAttemptAt = now.Add(backoff(ob.opts, 1, rand.Float64()))
			}
			_ = b.Failed(wctx, m)
		}
	case lost:
		// The claim is no longer this dispatcher's: another may hold it,
		// whose claim a Failed would end. The attempt does not count; the
		// message is claimed again once its claim has lapsed.
		ob.e.log.Warn("idem: outbox: a handler failed after its claim was lost; the message will be delivered again", "topic", m.Topic, "seq", m.Seq, "err", herr)
	case ctx.Err() != nil:
		// Stopping: the attempt does not count; the claim is given back.
		if err := b.Failed(wctx, m); err != nil && !errors.Is(err, ErrMessageNotFound) {
			ob.e.log.Warn("idem: outbox: giving a claimed message back failed", "topic", m.Topic, "seq", m.Seq, "err", err)
		}
	default:
		msg := truncateError(herr.Error(), maxLastErrLen)
		now, err := ob.e.clock(wctx) // the clock that judges the outbox's times
		if err != nil {
			// The store cannot be read: the claim is left to lapse (Postgres;
			// a backend whose claims are in memory has no clock of its own).
			ob.e.log.Warn("idem: outbox: recording a failed attempt failed", "topic", m.Topic, "seq", m.Seq, "err", err)
			return
		}
		m.Failures++
		m.LastError = msg
		if o := ob.opts; o.MaxAttempts > 0 && m.Failures >= o.MaxAttempts {
			m.NextAttemptAt, m.Dead, m.DeadAt, m.DeadLetterRetention = time.Time{}, true, now, o.DeadLetterRetention
		} else {
			m.NextAttemptAt = now.Add(backoff(ob.opts, m.Failures, rand.Float64()))
		}
		err = b.Failed(wctx, m)
		if err == nil {
			err = fault.Err("outbox-after-mark") // as a mark whose answer was lost
		}
		ob.e.observe(Event{Kind: EventDeliveryFailed, Topic: m.Topic, N: hm.Attempt})
		switch {
		case m.Dead && err == nil:
			outcome = DeliveryDeadLetter
			ob.e.observe(Event{Kind: EventDeadLetter, Topic: m.Topic})
		case err == nil:
			outcome = DeliveryRetry
		}
		if err != nil && !errors.Is(err, ErrMessageNotFound) {
			ob.e.log.Warn("idem: outbox: recording a failed attempt failed", "topic", m.Topic, "seq", m.Seq, "err", err)
		}
	}
}

// call runs the handler, turning a panic into an error with its value and
// stack.
func (ob *dispatcher[T]) call(ctx context.Context, h Handler, m Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			ob.e.log.Warn("idem: outbox handler panicked", "topic", m.Topic, "seq", m.Seq)
			err = fmt.Errorf("handler panicked: %v\n\n%s", v, debug.Stack())
		}
	}()
	return h(ctx, m)
}

// renewWhileRunning renews m's claim every Info().ClaimRenew until the
// returned stop is called (which waits for a renewal in flight), so that a
// handler slower than the claim's lease keeps its message, and moves the
// lease the handler's context lc judges by. A renewal that fails is logged
// and the next one tries again, each bounded by the claim's end, at which
// lc ends; one the backend refuses (ErrFenced: the claim is another's) ends
// lc at once.
func (ob *dispatcher[T]) renewWhileRunning(ctx context.Context, m *Message, lc *leaseCtx) (stop func()) {
	every := ob.e.info.ClaimRenew
	if every <= 0 || lc == nil {
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-lc.Done():
				return
			case <-t.C:
			}
			end := lc.until()
			if soon := time.Now().Add(every); soon.Before(end) {
				end = soon
			}
			rctx, cancel := context.WithDeadline(ctx, end)
			until, err := ob.e.b.RenewClaim(rctx, m)
			cancel()
			switch {
			case errors.Is(err, ErrFenced):
				lc.refused(func() {
					ob.e.log.Warn("idem: outbox: a running handler's claim was lost: its context is cancelled", "topic", m.Topic, "seq", m.Seq, "err", err)
				})
				return
			case err != nil:
				ob.e.log.Warn("idem: outbox: renewing a running handler's claim failed", "topic", m.Topic, "seq", m.Seq, "err", err)
			case lc.Err() == nil && !until.IsZero(): // not after the claim's end
				lc.extend(until)
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// Messages calls fn for every pending message by Seq, then every dead letter
// inside its retention by Seq, in the backend's one snapshot. A message that
// fails to decode comes with only Seq and Dead set, beside an error wrapping
// ErrCorrupt. An error from fn stops the walk and is returned as it is.
func (e *Engine[T]) Messages(fn func(m *Message, err error) error) error {
	ob := e.ob
	if err := e.Enter(); err != nil {
		return &OpError{Op: "messages", Err: err}
	}
	defer e.Exit()
	now, err := e.clock(context.Background())
	if err != nil {
		return OpErr("messages", "", err)
	}
	var fnErr error // fn's own error, returned as it is
	err = e.b.Messages(context.Background(), func(m *Message, err error) error {
		if err != nil {
			err = OpErr("messages", "", err)
		} else {
			if m.Dead && ob.deadExpired(m, now) {
				return nil
			}
			m.DownstreamKey = DownstreamKey(m.Key, m.Index)
		}
		fnErr = fn(m, err)
		return fnErr
	})
	if err != nil && err == fnErr {
		return err
	}
	return OpErr("messages", "", err)
}

// RetryDead puts dead letter seq back in the outbox at its old place: its
// failure count starts again from 0 (its LastError is kept), and as the
// oldest message of its ordering key it is delivered before that key's later
// pending messages. It fails with ErrMessageNotFound if seq is not a dead
// letter (or expired), with ErrCorrupt if it does not decode.
func (e *Engine[T]) RetryDead(seq uint64) error {
	ob := e.ob
	err := ob.operate("retry dead", func(ctx context.Context) error {
		now, err := ob.e.clock(ctx)
		if err != nil {
			return err
		}
		return ob.e.b.RetryDead(ctx, seq, func(m *Message) error {
			if ob.deadExpired(m, now) {
				return fmt.Errorf("%w: message %d (expired)", ErrMessageNotFound, seq)
			}
			m.Failures, m.NextAttemptAt, m.Dead, m.DeadAt, m.DeadLetterRetention = 0, time.Time{}, false, time.Time{}, 0
			return nil
		})
	})
	if err == nil {
		ob.wakeUp()
	}
	return err
}

// DropDead deletes dead letter seq, also one that fails to decode. It fails
// with ErrMessageNotFound if seq is not a dead letter.
func (e *Engine[T]) DropDead(seq uint64) error {
	ob := e.ob
	return ob.operate("drop dead", func(ctx context.Context) error { return ob.e.b.DropDead(ctx, seq) })
}

func (ob *dispatcher[T]) operate(op string, fn func(ctx context.Context) error) error {
	if err := ob.e.Enter(); err != nil {
		return &OpError{Op: op, Err: err}
	}
	defer ob.e.Exit()
	return OpErr(op, "", fn(context.Background()))
}
