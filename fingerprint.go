package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
)

// Fingerprint turns a call's arguments into canonical bytes for Do: the JSON
// encoding of args with object keys sorted at every depth and no insignificant
// space, so the same arguments give the same bytes whatever the map order or
// struct field order of the caller. Numbers keep their JSON text (1 and 1.0
// differ). It fails only if args cannot be encoded as JSON. As with
// encoding/json, strings must be valid UTF-8: invalid bytes are replaced by
// U+FFFD, so two strings that differ only there fingerprint the same (pass
// such data as []byte, which encodes as base64). A nil and an empty
// fingerprint given to Do are the same request.
func Fingerprint(args any) ([]byte, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, &OpError{Op: "fingerprint", Err: err}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &OpError{Op: "fingerprint", Err: err}
	}
	// encoding/json writes map keys sorted, so a round trip through
	// map[string]any is canonical.
	return json.Marshal(v)
}

// DoJSON is Do for a fn that returns a value: the fingerprint is
// Fingerprint(args), the response is v encoded as JSON, and a replay decodes
// the stored JSON into a new T. When the call fails, the returned T is the
// zero value unless a response was stored beside the error (never fn's value
// when its outcome was not stored: see Result). A nil fn is refused
// with an error, as in Do, and nothing is stored.
func DoJSON[T any](ctx context.Context, e *Engine, key string, args any, fn func(context.Context) (T, error)) (T, Result, error) {
	var zero T
	if fn == nil {
		return zero, Result{}, &OpError{Op: "do", Key: key, Err: errNilFn}
	}
	fp, err := Fingerprint(args)
	if err != nil {
		return zero, Result{}, opError("do", key, err)
	}
	res, err := e.Do(ctx, key, fp, func(ctx context.Context) ([]byte, error) {
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
