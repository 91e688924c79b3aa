package core

import (
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/layout"
)

// State is the state of a stored record. The root package re-exports it as
// idem.State.
type State uint8

const (
	// StateStarted: the record was committed before fn ran and fn's outcome
	// is not recorded yet. Whether a live owner holds it is the backend's
	// answer (Backend.Owner); without one it is an interrupted execution.
	StateStarted State = 1
	// StateDone: fn returned and its response and error are recorded.
	StateDone State = 2
)

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
// and returns, and what the engine's Get returns (idem.Record is this type).
type Record struct {
	Key   string
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
	// (the writer's Options.Retention). The record lives at least this long
	// after it completed (after it started, while started), whatever window a
	// later Open passes; a longer one lengthens it. A backend stores it with
	// the record and returns it as written.
	Retention time.Duration
	// KeptUntilResolved marks a started record written under RecoverRefuse:
	// it never expires, whatever a later Open passes; a recovering call,
	// Resolve or Forget ends it. A backend stores it with the record.
	KeptUntilResolved bool
}

// Expiry is when r leaves the retention window (layout.Expiry): the longer
// of r.Retention and retention (pass 0 for the record's own) after it
// completed, or after it started for a started record; the zero time (never)
// for a started record kept until resolved. It is a function, not a method,
// so that idem.Record (this type) keeps no ExpiresAt in its API.
func Expiry(r *Record, retention time.Duration) time.Time {
	at := r.StartedAt
	if r.State == StateDone {
		at = r.CompletedAt
	}
	return layout.Expiry(r.State == StateStarted && r.KeptUntilResolved, at, r.Retention, retention)
}

// Error is the outcome of a call whose fn returned a permanent error, as
// stored in a Record and returned by Do. The first call's Error wraps fn's own
// error, so errors.Is works on the user's sentinels; a replay (also after a
// restart, and from any backend) carries only the stored Code and Message.
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
	return target == ErrResponseTooLarge && e.Code == CodeResponseTooLarge
}

// CodeResponseTooLarge is the Code of the Error stored when fn's response
// exceeds the engine's MaxResponseSize.
const CodeResponseTooLarge = "idem_response_too_large"

// Message is an outbox message, as a Backend stores it and the dispatcher
// delivers it (idem.Message is this type).
type Message struct {
	// Seq names the message in its store (RetryDead, DropDead, the CLI): the
	// backend assigns it at Enqueue; it is unique and increases in enqueue
	// order (bbolt: the bucket's sequence; Postgres: a bigserial).
	Seq uint64
	// Topic selects the handler.
	Topic string
	// Key is the idempotency key of the DoTx call that enqueued the message.
	Key string
	// Index is the message's position among the messages of that call,
	// from 0.
	Index int
	// DownstreamKey is the key to pass on to the downstream system: a
	// function of Key and Index only (idem.DownstreamKey). Backends need not
	// store it; the engine fills it in.
	DownstreamKey string
	// OrderingKey groups the messages delivered in enqueue order, one at a
	// time: by default Key.
	OrderingKey string
	// Payload is the bytes given to Enqueue (nil and empty differ).
	Payload []byte
	// Attempt is, in a handler, the delivery attempt in progress
	// (Failures+1); zero as stored.
	Attempt int
	// Failures counts the failed delivery attempts recorded so far.
	Failures int
	// EnqueuedAt is when the call enqueued it. Its times are readings of
	// the clock that judges the store's times (Record.StartedAt's).
	EnqueuedAt time.Time
	// NextAttemptAt is when a message that failed may be tried again; zero
	// for at once.
	NextAttemptAt time.Time
	// LastError is the text of the last failed attempt's error (its first
	// 4 KiB), empty if none.
	LastError string
	// Dead is true for a dead letter, DeadAt when it died.
	Dead   bool
	DeadAt time.Time
	// DeadLetterRetention is the dead-letter retention in force when the
	// message died, stored with it: a dead letter lives at least this long
	// after DeadAt. Zero for a message that is not dead.
	DeadLetterRetention time.Duration
}
