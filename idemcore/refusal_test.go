package idemcore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// TestRefusalOf is the one mapping from the engine's errors to the refusals
// of idemhttp, idemmcp and idem mcp-proxy, as each reaches an adapter
// (wrapped in an *OpError).
func TestRefusalOf(t *testing.T) {
	do := func(err error) error { return &idemcore.OpError{Op: "do", Key: "k", Err: err} }
	ipe := &idemcore.InProgressError{StartedAt: time.Unix(1, 0), RetryAfter: 3 * time.Second}
	for _, c := range []struct {
		name       string
		err        error
		ok         bool
		kind       idemcore.RefusalKind
		status     int
		code       int64
		retryAfter time.Duration
	}{
		{"no error", nil, false, 0, 0, 0, 0},
		{"a stored outcome is the call's answer", &idemcore.Error{Code: "card_declined", Message: "declined"}, false, 0, 0, 0, 0},
		{"a replayed stored outcome too", do(&idemcore.Error{Message: "x", Replayed: true}), false, 0, 0, 0, 0},
		{"the caller's context ended", do(context.Canceled), false, 0, 0, 0, 0},
		{"the caller's deadline passed", do(context.DeadlineExceeded), false, 0, 0, 0, 0},
		{"invalid key: 400", do(fmt.Errorf("%w: empty", idemcore.ErrInvalidKey)), true, idemcore.RefusalKeyInvalid, 400, -32061, 0},
		{"fingerprint mismatch: the draft's 422", do(idemcore.ErrFingerprintMismatch), true, idemcore.RefusalConflict, 422, -32062, 0},
		{"in progress: the draft's 409 with its wait", do(ipe), true, idemcore.RefusalInProgress, 409, -32063, 3 * time.Second},
		{"in progress without a wait", do(idemcore.ErrInProgress), true, idemcore.RefusalInProgress, 409, -32063, 0},
		{"the call waited for was not stored: in progress", do(idemcore.Retryable(errors.New("gone"))), true, idemcore.RefusalInProgress, 409, -32063, 0},
		{"retryable wins over the cause it wraps", do(idemcore.Retryable(context.Canceled)), true, idemcore.RefusalInProgress, 409, -32063, 0},
		{"incomplete: 409", do(idemcore.ErrIncomplete), true, idemcore.RefusalIncomplete, 409, -32064, 0},
		{"response too large: not stored", do(fmt.Errorf("%w: 2 MiB", idemcore.ErrResponseTooLarge)), true, idemcore.RefusalNotStored, 500, -32603, 0},
		{"engine closed: unavailable", do(idemcore.ErrClosed), true, idemcore.RefusalUnavailable, 503, -32065, 0},
		{"storage failed: unavailable", do(idemcore.ErrStorageFailed), true, idemcore.RefusalUnavailable, 503, -32065, 0},
		{"a backend's own error: unavailable", do(errors.New("connection refused")), true, idemcore.RefusalUnavailable, 503, -32065, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, ok := idemcore.RefusalOf(c.err)
			if ok != c.ok {
				t.Fatalf("RefusalOf(%v) reports %v, want %v", c.err, ok, c.ok)
			}
			want := idemcore.Refusal{}
			if c.ok {
				want = idemcore.Refusal{Kind: c.kind, Status: c.status, Code: c.code, RetryAfter: c.retryAfter}
			}
			if r != want {
				t.Fatalf("RefusalOf(%v) = %+v, want %+v", c.err, r, want)
			}
		})
	}
}

func TestRefusalKindTable(t *testing.T) {
	for _, c := range []struct {
		kind   idemcore.RefusalKind
		name   string
		status int
		code   int64
	}{
		{idemcore.RefusalKeyMissing, "key_missing", 400, -32060},
		{idemcore.RefusalKeyInvalid, "key_invalid", 400, -32061},
		{idemcore.RefusalConflict, "conflict", 422, -32062},
		{idemcore.RefusalInProgress, "in_progress", 409, -32063},
		{idemcore.RefusalIncomplete, "incomplete", 409, -32064},
		{idemcore.RefusalUnavailable, "unavailable", 503, -32065},
		{idemcore.RefusalNotStored, "not_stored", 500, -32603},
	} {
		r := c.kind.Refusal()
		if c.kind.String() != c.name || r != (idemcore.Refusal{Kind: c.kind, Status: c.status, Code: c.code}) {
			t.Errorf("%v: %+v, want %s, %d, %d", c.kind, r, c.name, c.status, c.code)
		}
	}
	if s := idemcore.RefusalKind(0).String(); s != "RefusalKind(0)" {
		t.Errorf("RefusalKind(0) = %q", s)
	}
}
