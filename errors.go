package idem

import (
	"errors"

	"github.com/idemkit/idem/idemcore"
)

// The engine's sentinels are idemcore's, shared by every backend, so that
// errors.Is(err, idem.ErrX) holds whichever engine answered; idemcore
// documents when each is returned. ErrFormat and ErrReservedBucket are the
// bbolt file's own.

// Input errors: nothing was stored, so the call can be corrected and retried.
var (
	// ErrInvalidKey: the idempotency key breaks the key rules (1 to
	// MaxKeyLen bytes of UTF-8, no white space at the ends, no Cc or Cf
	// character).
	ErrInvalidKey = idemcore.ErrInvalidKey

	// ErrFingerprintMismatch: the key was used with another fingerprint (the
	// IETF Idempotency-Key draft's 422). The stored record is untouched.
	ErrFingerprintMismatch = idemcore.ErrFingerprintMismatch

	// ErrInvalidMessage: Tx.Enqueue's topic or ordering key breaks the rules
	// (a topic of 1 to 255 bytes, an ordering key of at most MaxKeyLen, both
	// UTF-8 without NUL). Nothing is enqueued.
	ErrInvalidMessage = idemcore.ErrInvalidMessage

	// ErrReservedBucket is returned by Tx.Bucket for the engine's own bucket name.
	ErrReservedBucket = errors.New("bucket name is reserved")
)

// State errors: the key exists but cannot be answered now.
var (
	// ErrInProgress: another call with the key runs (InFlightFail, the
	// draft's 409; Forget and Resolve of a running key).
	ErrInProgress = idemcore.ErrInProgress

	// ErrIncomplete: an interrupted execution under RecoverRefuse, or a
	// waiter whose leader left one. Resolve or Forget the key.
	ErrIncomplete = idemcore.ErrIncomplete

	// ErrRetryable is wrapped by errors made with Retryable: the key is free.
	ErrRetryable = idemcore.ErrRetryable

	// ErrResponseTooLarge: fn's outcome exceeded Options.MaxResponseSize; it
	// is stored as this error and replayed, never truncated.
	ErrResponseTooLarge = idemcore.ErrResponseTooLarge

	// ErrNotFound: Get, Forget or Resolve of a key without a live record.
	ErrNotFound = idemcore.ErrNotFound

	// ErrMessageNotFound: RetryDead or DropDead of a seq that names no dead
	// letter.
	ErrMessageNotFound = idemcore.ErrMessageNotFound

	// ErrState: an operator call on a record in the wrong state (Resolve of
	// a done record).
	ErrState = idemcore.ErrState
)

// InProgressError is the error, wrapped in an *OpError, of a duplicate refused
// while the first call with its key runs (idemcore.InProgressError: its
// StartedAt and RetryAfter). It matches ErrInProgress with errors.Is.
type InProgressError = idemcore.InProgressError

// Engine errors.
var (
	// ErrCorrupt: a stored record or message fails to decode, or the file's
	// pages are damaged. The error names the key.
	ErrCorrupt = idemcore.ErrCorrupt

	// ErrClosed is returned by every call made after Close.
	ErrClosed = idemcore.ErrClosed

	// ErrOptions is wrapped by the error of an Open given settings that have
	// no meaning (a negative Retention, an unknown policy). The error names
	// the field.
	ErrOptions = idemcore.ErrOptions

	// ErrTxClosed: a Tx used after its DoTx fn returned; nothing is written.
	ErrTxClosed = idemcore.ErrTxClosed

	// ErrReentrant: a call that would wait for itself (from inside a DoTx fn,
	// which holds the file's single writer; from a Records, View or Messages
	// callback, which holds a read transaction; or with fn's own key from
	// fn). The error says which.
	ErrReentrant = idemcore.ErrReentrant

	// ErrFormat is returned by Open for a file written by a newer or unknown
	// version of the record layout, or that is not an idem file; the file
	// is not modified.
	ErrFormat = errors.New("unsupported file format")

	// ErrFileFull: a commit would grow the file past BoltOptions.MaxSize
	// (it wraps bbolt's ErrMaxSizeReached). Nothing of that commit is stored.
	ErrFileFull = idemcore.ErrFileFull

	// ErrStorageFailed: a commit failed to write or sync the file, and every
	// later call fails with it (closed, as PostgreSQL after an fsync error).
	// Close the engine and open the file again.
	ErrStorageFailed = idemcore.ErrStorageFailed
)

// OpError reports which operation failed on which key, and why, with the
// prefix "idem: " once (idemcore.OpError: Op, Key, Path, Err). Every error
// the engine composes reaches the caller as one; errors.Is and errors.As see
// through it, bbolt's errors included (bbolt's ErrTimeout from Open).
type OpError = idemcore.OpError

// opError wraps err for op on key (idemcore.OpErr).
func opError(op, key string, err error) error { return idemcore.OpErr(op, key, err) }

// Error is the outcome of a call whose fn returned a permanent error
// (idemcore.Error: Code, Message, Replayed). The first call's Error wraps
// fn's own error; a replay carries only the stored Code and Message.
type Error = idemcore.Error

// Retryable marks err as one whose effect did not happen: the engine deletes
// the started record and frees the key (idemcore.Retryable gives the rule for
// a recovering call). Retryable(nil) is nil.
func Retryable(err error) error { return idemcore.Retryable(err) }

// WithCode attaches a machine-readable code to err, stored with the record and
// replayed as Error.Code ("card_declined"). WithCode(nil, code) is nil.
func WithCode(err error, code string) error { return idemcore.WithCode(err, code) }
