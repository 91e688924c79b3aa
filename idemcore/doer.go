package idemcore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Doer is the part of an engine that adapters use (idemhttp's middleware,
// idemmcp's tool middleware, the mcp-proxy): one call per idempotency key and
// the retention window to advertise. Every backend's engine implements it
// (*Engine[T], idem.Engine, idempg.Engine), so an adapter works over any of
// them.
type Doer interface {
	// Do runs fn once per idempotency key; see Engine.Do for the contract.
	Do(ctx context.Context, key string, fingerprint []byte, fn func(context.Context) ([]byte, error)) (Result, error)
	// Retention is the retention window, wall-clock: how long a completed
	// record is replayed.
	Retention() time.Duration
}

// TxDoer is a Doer whose fn can write its effects in the backend's own
// transaction, which commits together with the done record: T is *idem.Tx
// for the bbolt engine, pgx.Tx for idempg's. See Engine.DoTx.
type TxDoer[T any] interface {
	Doer
	DoTx(ctx context.Context, key string, fingerprint []byte, fn func(ctx context.Context, tx T) ([]byte, error)) (Result, error)
}

var _ TxDoer[struct{}] = (*Engine[struct{}])(nil)

// DoJSON is d.Do for a fn that returns a value: the fingerprint is
// Fingerprint(args), the response is v encoded as JSON, and a replay decodes
// the stored JSON into a new T. When the call fails, the returned T is the
// zero value unless a response was stored beside the error (never fn's value
// when its outcome was not stored: see Result). A nil fn is refused
// with an error, as in Do, and nothing is stored. A stored response that
// does not decode into T gives an error wrapping ErrCorrupt.
func DoJSON[T any](ctx context.Context, d Doer, key string, args any, fn func(context.Context) (T, error)) (T, Result, error) {
	var zero T
	if fn == nil {
		return zero, Result{}, &OpError{Op: "do", Key: key, Err: errNilFn}
	}
	fp, err := Fingerprint(args)
	if err != nil {
		return zero, Result{}, OpErr("do", key, err)
	}
	res, err := d.Do(ctx, key, fp, func(ctx context.Context) ([]byte, error) {
		v, ferr := fn(ctx)
		if ferr != nil {
			return nil, ferr
		}
		b, merr := json.Marshal(v)
		if merr != nil {
			return nil, fmt.Errorf("encode response: %w", merr)
		}
		return b, nil
	})
	if res.Response == nil {
		return zero, res, err
	}
	var out T
	if uerr := json.Unmarshal(res.Response, &out); uerr != nil && err == nil {
		return zero, res, &OpError{Op: "do", Key: key, Err: fmt.Errorf("%w: decode stored response: %v", ErrCorrupt, uerr)}
	}
	return out, res, err
}
