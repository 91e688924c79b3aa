package idemcore

import (
	"fmt"
	"time"
)

// State is the state of a stored record; String gives "started" or "done".
type State uint8

const (
	// StateStarted: the record was committed before fn ran and fn's outcome
	// is not recorded yet. Whether a live owner holds it is the backend's
	// answer (Backend.Owner); without one it is an interrupted execution.
	StateStarted State = 1
	// StateDone: fn returned and its response and error are recorded.
	StateDone State = 2
)

// String gives "started" or "done".
func (s State) String() string {
	switch s {
	case StateStarted:
		return "started"
	case StateDone:
		return "done"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Record is the stored outcome of one idempotency key: what a Backend stores
// and returns, and what Engine.Get returns.
type Record struct {
	// Key is the idempotency key, as the call gave it.
	Key string
	// State is started while fn runs (or after it was interrupted), done
	// once its outcome is recorded.
	State State
	// Fingerprint is the 64-bit xxhash of the fingerprint bytes of the call
	// that created the record.
	Fingerprint uint64
	// Attempt counts executions of fn for this key, starting at 1; a
	// recovered interrupted execution increments it.
	Attempt int
	// StartedAt is when the current attempt's started record was committed.
	// CompletedAt is when it became done; zero while started. Both are
	// readings of the clock that judges the store's times: the engine's
	// (Options.Now) on bbolt, the database's on Postgres.
	StartedAt   time.Time
	CompletedAt time.Time
	// Response is fn's response; nil and empty differ and stay different.
	Response []byte
	// Err is the stored permanent error, nil if fn succeeded.
	Err *Error
	// Retention is the retention window in force when the record was written
	// (the writer's Options.Retention; for a record of a bbolt file of
	// format 1, the width of the time slot it sits in, which was that
	// window). The record lives at least this long after it completed (after
	// it started, while started), whatever window a later open passes; a
	// longer one lengthens it. A backend stores it with the record and
	// returns it as written.
	Retention time.Duration
	// KeptUntilResolved marks a started record written under RecoverRefuse
	// (or read from a bbolt file of format 1, which did not record the
	// policy, so the record is kept): it never expires, whatever a later
	// open passes; a recovering call, Resolve or Forget ends it. A
	// recovering attempt that is interrupted in turn keeps the mark (and the
	// longer window). A backend stores it with the record.
	KeptUntilResolved bool
}

// Expiry is when r leaves the retention window, the one rule every engine,
// the CLI and the admin handler share: the longer of r.Retention and
// retention (the reader's Options.Retention; 0 for the record's own) after
// it completed, or after it started for a started record; the zero time
// (never) for a started record kept until resolved. (A started record is
// also kept by an engine that refuses, whatever its mark: Engine.Live.)
func Expiry(r *Record, retention time.Duration) time.Time {
	if r.State == StateStarted && r.KeptUntilResolved {
		return time.Time{}
	}
	at := r.StartedAt
	if r.State == StateDone {
		at = r.CompletedAt
	}
	return at.Add(max(r.Retention, retention))
}

// Error is the outcome of a call whose fn returned a permanent error, as
// stored in a Record and returned by Do. The first call's Error wraps fn's own
// error, so errors.Is works on the user's sentinels; a replay (also after a
// restart, and from any backend) carries only the stored Code and Message.
// Error.Is matches ErrResponseTooLarge for a stored oversized outcome.
type Error struct {
	// Code is the machine-readable code: from WithCode, or from the first
	// error in fn's chain with a Code() string method; empty otherwise.
	Code string
	// Message is the text of fn's error (err.Error()), as stored.
	Message string
	// Replayed tells that this error was answered from the stored record.
	Replayed bool

	err error // fn's error; nil on replays
}

// Error is "Code: Message", or Message alone without a code.
func (e *Error) Error() string {
	if e.Code == "" {
		return e.Message
	}
	return e.Code + ": " + e.Message
}

// Unwrap returns fn's error on the first call, nil on a replay.
func (e *Error) Unwrap() error { return e.err }

// Is reports ErrResponseTooLarge for the stored outcome of an oversized
// response, so the replay matches the sentinel as the first answer did.
func (e *Error) Is(target error) bool {
	return target == ErrResponseTooLarge && e.Code == codeResponseTooLarge
}

// codeResponseTooLarge is the Code of the Error stored when fn's response
// exceeds the engine's MaxResponseSize.
const codeResponseTooLarge = "idem_response_too_large"
