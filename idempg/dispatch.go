package idempg

import (
	"context"

	"github.com/idemkit/idem/idemcore"
)

// Handler delivers one outbox message: idemcore.Handler, with the same
// contract (nil once the effect is done; an error to try again after a
// backoff; delivery at least once, so pass m.DownstreamKey on).
type Handler = idemcore.Handler

// Handle registers h for topic's messages, replacing the previous handler; a
// nil h removes it. Messages of a topic without a handler wait in the
// outbox, holding back the later messages of their ordering key; claimed
// ones are given back when a handler is registered or the dispatcher stops.
func (e *Engine) Handle(topic string, h Handler) { e.c.Handle(topic, h) }

// Dispatch runs this process's dispatcher (idemcore.Engine.Dispatch, shared
// with the bbolt engine) until ctx ends (ctx.Err()) or the engine closes
// (ErrClosed). Dispatchers of several processes drain one outbox together:
// each claims due heads of ordering keys (FOR UPDATE SKIP LOCKED, then a
// claim for one Options.Lease, renewed while the handler runs), so the
// messages of one ordering key are delivered one at a time, in enqueue
// order, at least once. A handler's context ends with cause ErrLeaseLost
// the moment its message's claim has passed unrenewed. A second Dispatch in
// one engine fails with an error wrapping ErrDispatcherRunning. On return
// every handler it started has returned.
func (e *Engine) Dispatch(ctx context.Context) error { return e.c.Dispatch(ctx) }

// Messages calls fn for every pending message by Seq, then every dead
// letter inside its retention by Seq, in one snapshot (idemcore.Engine.Messages).
func (e *Engine) Messages(fn func(m *idemcore.Message, err error) error) error {
	return e.c.Messages(fn)
}

// RetryDead puts dead letter seq back in the outbox at its old place, its
// failure count from 0; an expired or missing one gives ErrMessageNotFound.
func (e *Engine) RetryDead(seq uint64) error { return e.c.RetryDead(seq) }

// DropDead deletes dead letter seq, or returns an error wrapping
// idemcore.ErrMessageNotFound.
func (e *Engine) DropDead(seq uint64) error { return e.c.DropDead(seq) }
