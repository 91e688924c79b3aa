package idempg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/core"
	"github.com/idemkit/idem/internal/fault"
)

// maxLastErrLen is the most bytes of a handler's error kept with a message.
const maxLastErrLen = 4096

// Handler delivers one outbox message: idem.Handler, with the same contract
// (nil once the effect is done; an error to try again after a backoff;
// delivery at least once, so pass m.DownstreamKey on).
type Handler = idem.Handler

// defaults fills in the zero values of an idem.OutboxOptions, as the bbolt
// engine does (idem.DefaultOutboxWorkers and the other idem.Default*).
func outboxDefaults(o *idem.OutboxOptions) {
	if o.Workers <= 0 {
		o.Workers = idem.DefaultOutboxWorkers
	}
	if o.BaseBackoff <= 0 {
		o.BaseBackoff = idem.DefaultOutboxBaseBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = idem.DefaultOutboxMaxBackoff
	}
	o.MaxBackoff = max(o.MaxBackoff, o.BaseBackoff)
	if o.MaxAttempts == 0 {
		o.MaxAttempts = idem.DefaultOutboxMaxAttempts
	}
	if o.DeadLetterRetention <= 0 {
		o.DeadLetterRetention = idem.DefaultOutboxDeadLetterRetention
	}
	if o.PollInterval <= 0 {
		o.PollInterval = idem.DefaultOutboxPollInterval
	}
}

// outbox is an engine's dispatcher state.
type outbox struct {
	opts     idem.OutboxOptions
	mu       sync.Mutex
	handlers map[string]Handler
	running  atomic.Bool
	wake     chan struct{}
	// parked are claimed messages whose topic has no handler: their
	// claims are kept (holding back their ordering keys) until Handle
	// registers one or the dispatcher stops, then given back.
	parked map[uint64]*core.Message
}

func newOutbox(o idem.OutboxOptions) *outbox {
	outboxDefaults(&o)
	ob := &outbox{opts: o, handlers: map[string]Handler{}, wake: make(chan struct{}, 1), parked: map[uint64]*core.Message{}}
	for t, h := range o.Handlers {
		ob.handlers[t] = h
	}
	return ob
}

func (ob *outbox) poke() {
	select {
	case ob.wake <- struct{}{}:
	default:
	}
}

// Handle registers h for topic's messages, replacing the previous handler; a
// nil h removes it. Messages of a topic without a handler wait in the
// outbox, holding back the later messages of their ordering key.
func (e *Engine) Handle(topic string, h Handler) {
	e.ob.mu.Lock()
	if h == nil {
		delete(e.ob.handlers, topic)
	} else {
		e.ob.handlers[topic] = h
	}
	var back []*core.Message
	for seq, m := range e.ob.parked {
		if h != nil && m.Topic == topic {
			back = append(back, m)
			delete(e.ob.parked, seq)
		}
	}
	e.ob.mu.Unlock()
	e.unpark(back)
	e.ob.poke()
}

// unpark gives the claims of ms back, unchanged, so that a dispatcher
// claims them again.
func (e *Engine) unpark(ms []*core.Message) {
	for _, m := range ms {
		_ = e.b.Failed(context.Background(), m)
	}
}

// Dispatch runs this process's dispatcher until ctx ends (ctx.Err()) or the
// engine closes (ErrClosed). Dispatchers of several processes drain one
// outbox together: each claims due heads of ordering keys (FOR UPDATE SKIP
// LOCKED, then a claim for one Options.Lease), so the messages of one
// ordering key are delivered one at a time, in enqueue order, at least
// once. A second Dispatch in one engine fails with idem.ErrDispatcherRunning. On return
// every handler it started has returned.
func (e *Engine) Dispatch(ctx context.Context) error {
	if !e.ob.running.CompareAndSwap(false, true) {
		return fmt.Errorf("idempg: dispatch: %w", core.ErrDispatcherRunning)
	}
	defer e.ob.running.Store(false)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(e.closing, cancel)
	defer stop()

	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		e.ob.mu.Lock()
		var back []*core.Message
		for seq, m := range e.ob.parked {
			back = append(back, m)
			delete(e.ob.parked, seq)
		}
		e.ob.mu.Unlock()
		e.unpark(back)
	}()
	done := make(chan struct{}, e.ob.opts.Workers)
	busy := 0
	for {
		if free := e.ob.opts.Workers - busy; free > 0 {
			// Not cut short by ctx: a claim that committed but whose answer
			// was dropped would hold its messages for a lease.
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), e.b.s.LockTimeout)
			ms, err := e.b.ClaimDue(cctx, e.c.Now(), free)
			ccancel()
			if err != nil && ctx.Err() == nil {
				e.log().Warn("idem: outbox: claiming messages failed", "err", err)
			}
			if ctx.Err() != nil {
				e.unpark(ms) // stopping: give the claims back
				ms = nil
			}
			for _, m := range ms {
				busy++
				wg.Go(func() {
					defer func() { done <- struct{}{} }()
					e.deliver(ctx, m)
				})
			}
		}
		t := time.NewTimer(e.ob.opts.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			if e.closing.Err() != nil {
				return core.ErrClosed
			}
			return ctx.Err()
		case <-e.ob.wake:
		case <-done:
			busy--
		case <-t.C:
		}
		t.Stop()
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

// deliver runs m's handler and records the outcome.
func (e *Engine) deliver(ctx context.Context, m *core.Message) {
	e.ob.mu.Lock()
	h := e.ob.handlers[m.Topic]
	if h == nil {
		// No handler: keep the claim (the message holds back its ordering
		// key) until Handle registers one.
		cp := *m
		e.ob.parked[m.Seq] = &cp
	}
	e.ob.mu.Unlock()
	if h == nil {
		return
	}
	wctx := context.WithoutCancel(ctx)
	hm := *m
	hm.Attempt = m.Failures + 1
	hm.DownstreamKey = idem.DownstreamKey(m.Key, m.Index)
	// An error at a point before or after the handler counts as a failed
	// attempt (the handler not called, or its success lost).
	herr := fault.Err("outbox-before-handler")
	if herr == nil {
		herr = callHandler(ctx, h, hm)
		if herr == nil {
			herr = fault.Err("outbox-after-handler")
		}
	}
	switch {
	case herr == nil:
		err := e.b.Delivered(wctx, m)
		if err == nil {
			err = fault.Err("outbox-after-mark") // as a mark whose answer was lost
		}
		if err != nil && !errors.Is(err, core.ErrMessageNotFound) {
			e.log().Warn("idem: outbox: removing a delivered message failed; it will be delivered again", "topic", m.Topic, "seq", m.Seq, "err", err)
		}
	case ctx.Err() != nil:
		// Stopping: the attempt does not count; the claim lapses.
		_ = e.b.Failed(wctx, m)
	default:
		msg := herr.Error()
		if len(msg) > maxLastErrLen {
			msg = msg[:maxLastErrLen]
		}
		now := e.c.Now()
		m.Failures++
		m.LastError = msg
		if o := e.ob.opts; o.MaxAttempts > 0 && m.Failures >= o.MaxAttempts {
			m.NextAttemptAt, m.Dead, m.DeadAt, m.DeadLetterRetention = time.Time{}, true, now, o.DeadLetterRetention
		} else {
			m.NextAttemptAt = now.Add(e.backoff(m.Failures, rand.Float64()))
		}
		err := e.b.Failed(wctx, m)
		if err == nil {
			err = fault.Err("outbox-after-mark") // as a mark whose answer was lost
		}
		if err != nil && !errors.Is(err, core.ErrMessageNotFound) {
			e.log().Warn("idem: outbox: recording a failed attempt failed", "topic", m.Topic, "seq", m.Seq, "err", err)
		}
	}
}

// callHandler runs h, turning a panic into an error.
func callHandler(ctx context.Context, h Handler, m idem.Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("handler panicked: %v\n\n%s", v, debug.Stack())
		}
	}()
	return h(ctx, m)
}

// backoff is the wait after failed attempt n (from 1): BaseBackoff doubled
// n-1 times, capped at MaxBackoff, jittered into [w/2, w).
func (e *Engine) backoff(n int, jitter float64) time.Duration {
	o := e.ob.opts
	w := o.MaxBackoff
	if n-1 < 62 && o.BaseBackoff <= o.MaxBackoff>>(n-1) {
		w = o.BaseBackoff << (n - 1)
	}
	return w/2 + time.Duration(jitter*float64(w/2))
}

// Messages calls fn for every pending message by Seq, then every dead
// letter inside its retention by Seq, in one snapshot.
func (e *Engine) Messages(fn func(m *idem.Message, err error) error) error {
	now := e.c.Now()
	return e.b.Messages(context.Background(), func(m *core.Message, err error) error {
		if err == nil && m.Dead && !now.Before(m.DeadAt.Add(m.DeadLetterRetention)) {
			return nil
		}
		if m != nil {
			m.DownstreamKey = idem.DownstreamKey(m.Key, m.Index)
		}
		return fn(m, err)
	})
}

// RetryDead puts dead letter seq back in the outbox at its old place, its
// failure count from 0; an expired or missing one gives ErrMessageNotFound.
func (e *Engine) RetryDead(seq uint64) error {
	now := e.c.Now()
	err := e.b.RetryDead(context.Background(), seq, func(m *core.Message) error {
		if !now.Before(m.DeadAt.Add(m.DeadLetterRetention)) {
			return fmt.Errorf("%w: dead letter %d", core.ErrMessageNotFound, seq)
		}
		m.Failures, m.LastError, m.NextAttemptAt, m.Dead, m.DeadAt, m.DeadLetterRetention = 0, "", time.Time{}, false, time.Time{}, 0
		return nil
	})
	if err == nil {
		e.ob.poke()
	}
	return err
}

// DropDead deletes dead letter seq, or returns an error wrapping
// idem.ErrMessageNotFound.
func (e *Engine) DropDead(seq uint64) error { return e.b.DropDead(context.Background(), seq) }
