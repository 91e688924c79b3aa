package idemcore

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// RefusalKind names why an adapter answers a call without running it (or
// without replaying it): the one mapping from the engine's errors to HTTP
// statuses and JSON-RPC error codes that idemhttp, idemmcp and idem
// mcp-proxy share (RefusalOf). String gives its name, such as "in_progress".
type RefusalKind uint8

// The refusals. Each documents its HTTP status (IETF
// draft-ietf-httpapi-idempotency-key-header, section 2.7, for 400, 409 and
// 422) and its JSON-RPC code (in the range JSON-RPC 2.0 leaves to
// implementations, apart from the codes of go-sdk and the MCP
// specification; idemmcp's Code* constants).
const (
	// RefusalKeyMissing: a call that needs an idempotency key came without
	// one. HTTP 400, JSON-RPC -32060. The adapter finds it; no engine error
	// maps to it.
	RefusalKeyMissing RefusalKind = iota + 1
	// RefusalKeyInvalid: the key breaks the key rules (ErrInvalidKey).
	// HTTP 400, JSON-RPC -32061.
	RefusalKeyInvalid
	// RefusalConflict: the key was used with another fingerprint
	// (ErrFingerprintMismatch). HTTP 422, JSON-RPC -32062.
	RefusalConflict
	// RefusalInProgress: a call with the key is running (ErrInProgress, an
	// *InProgressError), or the call waited for ended without an outcome
	// to share (ErrRetryable): send the same call again after RetryAfter.
	// HTTP 409 with Retry-After, JSON-RPC -32063.
	RefusalInProgress
	// RefusalIncomplete: the key's first execution was interrupted and the
	// engine refuses to run it again until an operator resolves the key
	// (ErrIncomplete). HTTP 409 without Retry-After, JSON-RPC -32064.
	RefusalIncomplete
	// RefusalUnavailable: the store failed or the engine is closed (any
	// other engine error); nothing ran. HTTP 503 with Retry-After, JSON-RPC
	// -32065.
	RefusalUnavailable
	// RefusalNotStored: the key is done, but its outcome was over
	// Options.MaxResponseSize and cannot be replayed
	// (ErrResponseTooLarge). HTTP 500, JSON-RPC -32603 (internal error).
	RefusalNotStored
)

// refusals is the table: a kind's name, HTTP status and JSON-RPC code.
var refusals = [...]struct {
	name   string
	status int
	code   int64
}{
	RefusalKeyMissing:  {"key_missing", 400, -32060},
	RefusalKeyInvalid:  {"key_invalid", 400, -32061},
	RefusalConflict:    {"conflict", 422, -32062},
	RefusalInProgress:  {"in_progress", 409, -32063},
	RefusalIncomplete:  {"incomplete", 409, -32064},
	RefusalUnavailable: {"unavailable", 503, -32065},
	RefusalNotStored:   {"not_stored", 500, -32603},
}

// String gives the kind's name: "key_missing", "key_invalid", "conflict",
// "in_progress", "incomplete", "unavailable" or "not_stored".
func (k RefusalKind) String() string {
	if int(k) >= len(refusals) || k == 0 {
		return "RefusalKind(" + strconv.Itoa(int(k)) + ")"
	}
	return refusals[k].name
}

// Refusal is how an adapter refuses a call: the kind, its HTTP status and
// JSON-RPC code, and the wait the engine suggested.
type Refusal struct {
	// Kind names the refusal.
	Kind RefusalKind
	// Status is the HTTP status (400, 409, 422, 500 or 503).
	Status int
	// Code is the JSON-RPC error code (idemmcp's Code*, or -32603).
	Code int64
	// RetryAfter is how long to wait before sending the same call again, as
	// an *InProgressError said, wall-clock; zero when the error does not
	// say (the adapter's default applies, for RefusalInProgress and
	// RefusalUnavailable) or waiting does not help.
	RetryAfter time.Duration
}

// Refusal returns the kind's refusal, with no RetryAfter.
func (k RefusalKind) Refusal() Refusal {
	r := Refusal{Kind: k}
	if int(k) < len(refusals) {
		r.Status, r.Code = refusals[k].status, refusals[k].code
	}
	return r
}

// RefusalOf maps an error of Do or DoTx to the refusal adapters answer it
// with, checked in this order: ErrRetryable (RefusalInProgress: the key is
// free again), ErrResponseTooLarge (RefusalNotStored),
// ErrFingerprintMismatch (RefusalConflict), an *InProgressError or
// ErrInProgress (RefusalInProgress, with the error's RetryAfter),
// ErrIncomplete (RefusalIncomplete), ErrInvalidKey (RefusalKeyInvalid);
// any other error is RefusalUnavailable, except those it reports false for:
// nil, a stored outcome (*Error: the call's answer, replayed) and a
// context's end (context.Canceled, context.DeadlineExceeded: the caller's
// own), which each adapter answers in its own way.
func RefusalOf(err error) (Refusal, bool) {
	if err == nil {
		return Refusal{}, false
	}
	for _, c := range refusalOrder {
		if errors.Is(err, c.err) {
			r := c.kind.Refusal()
			if ip, ok := errors.AsType[*InProgressError](err); ok && c.err == ErrInProgress {
				r.RetryAfter = ip.RetryAfter
			}
			return r, true
		}
	}
	if _, ok := errors.AsType[*Error](err); ok ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Refusal{}, false
	}
	return RefusalUnavailable.Refusal(), true
}

// refusalOrder is RefusalOf's table, in the order it checks.
var refusalOrder = []struct {
	err  error
	kind RefusalKind
}{
	{ErrRetryable, RefusalInProgress},
	{ErrResponseTooLarge, RefusalNotStored},
	{ErrFingerprintMismatch, RefusalConflict},
	{ErrInProgress, RefusalInProgress}, // an *InProgressError gives its RetryAfter
	{ErrIncomplete, RefusalIncomplete},
	{ErrInvalidKey, RefusalKeyInvalid},
}
