package idem

import (
	"context"

	"github.com/idemkit/idem/idemcore"
)

// Fingerprint turns a call's arguments into canonical bytes for Do: their
// JSON with object keys sorted at every depth (idemcore.Fingerprint).
func Fingerprint(args any) ([]byte, error) { return idemcore.Fingerprint(args) }

// DoJSON is d.Do for a fn that returns a value: the fingerprint is
// Fingerprint(args), the response is the value as JSON, and a replay decodes
// it into a new T (idemcore.DoJSON). d is any engine: *Engine, or another
// backend's.
func DoJSON[T any](ctx context.Context, d Doer, key string, args any, fn func(context.Context) (T, error)) (T, Result, error) {
	return idemcore.DoJSON(ctx, d, key, args, fn)
}
