package idem

import (
	"context"
	"time"
)

// Doer is the part of an engine that adapters use (idemhttp's middleware,
// idemmcp's tool middleware, the mcp-proxy): one call per idempotency key and
// the retention window to advertise. Every backend's engine implements it,
// so an adapter works over any of them.
type Doer interface {
	// Do runs fn once per idempotency key; see Engine.Do for the contract.
	Do(ctx context.Context, key string, fingerprint []byte, fn func(context.Context) ([]byte, error)) (Result, error)
	// Retention is the retention window, wall-clock: how long a completed
	// record is replayed.
	Retention() time.Duration
}

// TxDoer is a Doer whose fn can write its effects in the backend's own
// transaction, which commits together with the done record: T is *Tx for
// this package's bbolt engine (and pgx.Tx for idempg's). See Engine.DoTx.
type TxDoer[T any] interface {
	Doer
	DoTx(ctx context.Context, key string, fingerprint []byte, fn func(ctx context.Context, tx T) ([]byte, error)) (Result, error)
}

var _ TxDoer[*Tx] = (*Engine)(nil)

// Retention is the retention window the engine was opened with.
func (e *Engine) Retention() time.Duration { return e.opts.Retention }
