package idem

import (
	"errors"

	"github.com/idemkit/idem/internal/core"
)

// Input errors: nothing was stored, so the call can be corrected and retried.
var (
	// ErrInvalidKey is returned for an idempotency key that breaks the key
	// rules; nothing is stored. A key Do and DoTx accept is 1 to MaxKeyLen
	// bytes (Stripe's 255) of valid UTF-8, with no leading or trailing white
	// space and no character of Unicode category Cc or Cf (controls such as
	// NUL, tab and newline; format characters such as the byte-order mark and
	// zero-width spaces). White space at the ends is refused, not trimmed:
	// Stripe's SDKs trim keys, so " k " and "k" would be one key there and
	// two here, and trimming would merge keys already stored apart. Cc and Cf
	// characters print as nothing, so keys that look alike would differ; the
	// IETF Idempotency-Key draft's value is a structured-field string,
	// printable ASCII only (the engine also takes other printable
	// characters). Inner white space is allowed. Get, Forget and Resolve
	// check only the length and UTF-8, so that records stored under keys an
	// earlier version accepted stay reachable.
	ErrInvalidKey = core.ErrInvalidKey

	// ErrFingerprintMismatch is returned when a key is reused with a different
	// fingerprint, whatever state its record is in (the IETF Idempotency-Key
	// draft answers this case with HTTP 422). The stored record is untouched.
	ErrFingerprintMismatch = core.ErrFingerprintMismatch

	// ErrInvalidMessage is returned by Tx.Enqueue and Tx.EnqueueOrdered (and
	// idempg's Enqueue) for a topic that is empty, longer than 255 bytes, not
	// valid UTF-8 or holding a NUL byte, or for an ordering key longer than
	// MaxKeyLen bytes, not valid UTF-8 or holding a NUL byte (Postgres text
	// cannot hold NUL; both backends refuse it alike). Nothing is enqueued.
	ErrInvalidMessage = core.ErrInvalidMessage

	// ErrReservedBucket is returned by Tx.Bucket for the engine's own bucket name.
	ErrReservedBucket = errors.New("bucket name is reserved")
)

// State errors: the key exists but cannot be answered now.
var (
	// ErrInProgress is returned, under InFlightFail, while another call with the
	// same key runs in this process (the IETF draft's HTTP 409).
	ErrInProgress = core.ErrInProgress

	// ErrIncomplete is returned for an interrupted execution: a started record
	// that no live call owns (after a crash, a panic, an error fn returned once
	// its own context had ended, or a failed commit) under RecoverRefuse, and to
	// waiters whose leader left such a record behind. Resolve the key with
	// Engine.Resolve or Forget.
	ErrIncomplete = core.ErrIncomplete

	// ErrRetryable is wrapped by errors made with Retryable: fn promised that its
	// effect did not happen, the started record was deleted and the key is free
	// (unless the call recovered an interrupted execution: see Retryable).
	ErrRetryable = core.ErrRetryable

	// ErrResponseTooLarge is returned when fn's response exceeds
	// Options.MaxResponseSize. The key is done with this error stored: every
	// replay returns it, fn does not run again, nothing is truncated.
	ErrResponseTooLarge = core.ErrResponseTooLarge

	// ErrNotFound is returned by the record operator calls (Get, Forget,
	// Resolve) for a key that has no live record. Outbox messages have their
	// own: ErrMessageNotFound.
	ErrNotFound = core.ErrNotFound

	// ErrMessageNotFound is returned by RetryDead and DropDead for a sequence
	// number that names no dead letter (none, a pending message, or a dead
	// letter past its retention).
	ErrMessageNotFound = core.ErrMessageNotFound

	// ErrState is returned by operator calls for a record in the wrong state,
	// such as Resolve of a done record.
	ErrState = core.ErrState
)

// InProgressError is the error, wrapped in an *OpError, of a duplicate refused
// while the first call with its key runs (Options.InFlight is InFlightFail).
// It matches ErrInProgress with errors.Is. Adapters turn it into the IETF
// Idempotency-Key draft's HTTP 409 with a Retry-After header, or an MCP
// error with a retryAfter hint.
type InProgressError = core.InProgressError

// Engine errors.
var (
	// ErrCorrupt is returned for a stored record that fails to decode (bad
	// checksum, truncated, unknown version). The error names the key.
	ErrCorrupt = core.ErrCorrupt

	// ErrClosed is returned by every call made after Close.
	ErrClosed = core.ErrClosed

	// ErrOptions is wrapped by the error of an Open (idem.Open, idempg.Open)
	// given settings that have no meaning, such as a negative Retention or
	// an unknown policy: they are refused, never read as a default. The
	// error names the field. Nothing stored is touched.
	ErrOptions = core.ErrOptions

	// ErrTxClosed is returned by the methods of a Tx used after its DoTx fn
	// returned (bbolt's ErrTxClosed is the model); nothing is written.
	ErrTxClosed = core.ErrTxClosed

	// ErrReentrant is returned for a call that would wait for itself: any call
	// of the engine from inside a DoTx fn (which holds the file's single
	// writer), and a call with fn's own key from fn (passing fn's context,
	// or any context from the goroutine running fn). The error says which.
	ErrReentrant = core.ErrReentrant

	// ErrFormat is returned by Open for a file written by a newer or unknown
	// version of the record layout; the file is not modified.
	ErrFormat = errors.New("unsupported file format")

	// ErrFileFull is returned when a commit would grow the file past
	// Options.Bolt.MaxSize (bbolt's ErrMaxSizeReached, which it also wraps).
	// Nothing of that commit is stored: a call whose started record did not
	// fit ran no fn; one whose done record did not fit leaves an interrupted
	// execution. The engine goes on: Prune, Forget and expiry free pages that
	// later commits reuse.
	ErrFileFull = core.ErrFileFull

	// ErrStorageFailed is returned when a commit failed to write or sync the
	// file (an I/O error, a full disk, a failed fsync: the cause is wrapped
	// too), and by every later call of the engine but Close: the kernel may
	// have dropped the pages it could not write, so the engine no longer knows
	// what the file holds, and it fails closed (as PostgreSQL does after an
	// fsync error). Close the engine and open the file again: Open reads what
	// reached the disk, and every answer given before the failure is there.
	ErrStorageFailed = core.ErrStorageFailed
)

// Errors of a backend that several processes share (idempg's Postgres
// backend): the bbolt engine never returns them, since one process holds its
// file. They are the engine's core sentinels, so errors.Is matches them
// whichever package wrapped them (idempg.ErrFenced is ErrFenced).
var (
	// ErrFenced is wrapped by the error of a completion, release or lease
	// renewal whose claim is no longer the key's: the claim's lease lapsed
	// (judged by the database's clock) and another process took the key
	// over with a newer fencing token (the fencing of Kleppmann's "How to do
	// distributed locking"). Nothing was written: the new owner's record
	// stands and is never overwritten. fn may have had its effect, so the
	// key was executed at least once, as for any takeover; the new owner's
	// fn sees Call.Recovered.
	ErrFenced = core.ErrFenced

	// ErrLeaseLost is the cause (context.Cause) of fn's context when the
	// claim's lease passed unrenewed (a renewal failed or hung, or the
	// process was frozen past it) or the claim was fenced off, and of an
	// outbox handler's context when its message's claim did: another
	// process may now take the key (or the message) over, so fn should
	// stop. fn's context reports it the moment the lease has passed (see
	// the package doc's Caveats). fn's error is then an interruption, not
	// an outcome: the started record stays for recovery.
	ErrLeaseLost = core.ErrLeaseLost
)

// OpError reports which operation failed on which key, and why; every error
// the engine composes reaches the caller as one, so its text carries the
// prefix "idem: " once, as io/fs.PathError and litestream's LTXError do:
//
//	idem: do "order-1": fingerprint mismatch
//	idem: open /var/lib/app.idem: unsupported file format: ...
//	idem: records: corrupt record: ...
//
// The sentinels carry bare text. An error fn returned is the exception: a
// permanent one comes back as *Error with fn's text (which may hold its own
// prefix, if it came from another idem call). Err is never nil; errors.Is
// and errors.As see through it (bbolt's errors included, for example
// bbolt's ErrTimeout from Open).
type OpError = core.OpError

// opError wraps err for op on key, so that its text carries the prefix once
// (core.OpErr): nil stays nil; fn's stored outcome (*Error) is fn's and stays
// as it is; an *OpError made deeper down takes op and key.
func opError(op, key string, err error) error { return core.OpErr(op, key, err) }

// Error is the outcome of a call whose fn returned a permanent error. The first
// call's Error wraps fn's own error, so errors.Is works on the user's sentinels;
// a replay (also after a restart) carries only the stored Code and Message.
type Error = core.Error

// codeResponseTooLarge is the Code of the Error stored for an oversized
// outcome: one over Options.MaxResponseSize, or an error of fn's that wraps
// ErrResponseTooLarge (an adapter that streamed a response too large to
// store). Error.Is matches it to ErrResponseTooLarge on replays.
const codeResponseTooLarge = core.CodeResponseTooLarge

// Retryable marks err as one whose effect did not happen: the engine deletes the
// started record, frees the key and returns an error that wraps both err and
// ErrRetryable. Waiting duplicates get the same error and may retry at once.
// The promise covers this attempt only: when the call recovers an interrupted
// execution, whose effect is still unknown, the key keeps a started record
// with this attempt's number, and the next call recovers again (DESIGN.md,
// "what frees a key"). Retryable(nil) is nil.
func Retryable(err error) error { return core.Retryable(err) }

// WithCode attaches a machine-readable code to err, stored with the record and
// replayed as Error.Code ("card_declined"). WithCode(nil, code) is nil.
func WithCode(err error, code string) error { return core.WithCode(err, code) }
