package idemcore

import (
	"context"
	"errors"
	"fmt"
)

// OutboxBacklog counts the messages an outbox holds (Engine.OutboxBacklog),
// for a gauge: idemotel's idem.outbox.backlog and idem.outbox.dead_letters.
type OutboxBacklog struct {
	// Pending counts the messages not delivered yet and not dead, claimed
	// ones included.
	Pending int64
	// Dead counts the dead letters stored, expired ones the pruner has not
	// deleted yet included.
	Dead int64
}

// BacklogCounter is implemented by a Backend that counts its outbox
// (Engine.OutboxBacklog). Each backend documents what a count costs.
type BacklogCounter interface {
	// OutboxBacklog counts the outbox's pending messages and dead letters,
	// in one consistent reading of the store.
	OutboxBacklog(ctx context.Context) (OutboxBacklog, error)
}

// OutboxBacklog counts the outbox's pending messages and dead letters, as
// the backend stores them, in one reading of the store (its cost is the
// backend's: BacklogCounter). After Close it returns ErrClosed; a backend
// that does not count its outbox returns an error wrapping
// errors.ErrUnsupported.
func (e *Engine[T]) OutboxBacklog(ctx context.Context) (OutboxBacklog, error) {
	bc, ok := e.b.(BacklogCounter)
	if !ok {
		return OutboxBacklog{}, &OpError{Op: "outbox backlog", Err: fmt.Errorf("%w: the %s backend does not count its outbox", errors.ErrUnsupported, e.info.Name)}
	}
	if err := e.enter(); err != nil {
		return OutboxBacklog{}, &OpError{Op: "outbox backlog", Err: err}
	}
	defer e.calls.Done()
	n, err := bc.OutboxBacklog(ctx)
	if err != nil {
		return OutboxBacklog{}, &OpError{Op: "outbox backlog", Err: err}
	}
	return n, nil
}
