package idemcore

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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
	ErrInvalidKey = errors.New("invalid idempotency key")

	// ErrFingerprintMismatch is returned when a key is reused with a different
	// fingerprint, whatever state its record is in (the IETF Idempotency-Key
	// draft answers this case with HTTP 422). The stored record is untouched.
	ErrFingerprintMismatch = errors.New("fingerprint mismatch")

	// ErrOptions is wrapped by the error of an open (idem.Open, idempg.Open,
	// New) given settings that have no meaning, such as a negative Retention
	// or an unknown policy: they are refused, never read as a default. The
	// error names the field. Nothing stored is touched.
	ErrOptions = errors.New("invalid options")
)

// State errors: the key exists but cannot be answered now.
var (
	// ErrInProgress is returned, under InFlightFail, while another call with
	// the same key runs, in this process or, on a backend shared by
	// processes, in another (the IETF draft's HTTP 409); the error is an
	// *InProgressError. Forget and Resolve return it for a key a call holds.
	ErrInProgress = errors.New("request in progress")

	// ErrIncomplete is returned for an interrupted execution: a started record
	// that no live call owns (after a crash, a panic, an error fn returned once
	// its own context had ended, or a failed commit) under RecoverRefuse, and to
	// waiters whose leader left such a record behind. Resolve the key with
	// Engine.Resolve or Forget.
	ErrIncomplete = errors.New("execution incomplete")

	// ErrRetryable is wrapped by errors made with Retryable: fn promised that its
	// effect did not happen, the started record was deleted and the key is free
	// (unless the call recovered an interrupted execution: see Retryable).
	ErrRetryable = errors.New("retryable")

	// ErrResponseTooLarge is returned when fn's response exceeds
	// Options.MaxResponseSize. The key is done with this error stored: every
	// replay returns it, fn does not run again, nothing is truncated.
	ErrResponseTooLarge = errors.New("response too large")

	// ErrNotFound is returned by the record operator calls (Get, Forget,
	// Resolve) for a key that has no live record. Outbox messages have their
	// own: ErrMessageNotFound.
	ErrNotFound = errors.New("record not found")

	// ErrMessageNotFound is returned by RetryDead and DropDead for a sequence
	// number that names no dead letter (none, a pending message, or a dead
	// letter past its retention).
	ErrMessageNotFound = errors.New("outbox message not found")

	// ErrState is returned by operator calls for a record in the wrong state,
	// such as Resolve of a done record.
	ErrState = errors.New("record in the wrong state")
)

// Engine errors.
var (
	// ErrCorrupt is returned for a stored record that fails to decode (bad
	// checksum, truncated, unknown version). The error names the key.
	ErrCorrupt = errors.New("corrupt record")

	// ErrClosed is returned by every call made after Close.
	ErrClosed = errors.New("engine closed")

	// ErrReentrant is returned for a call that would wait for itself: a call
	// of the engine from inside a DoTx fn whose transaction holds the
	// store's writer (bbolt's single writer), and a call with fn's own key
	// from fn (passing fn's context, or any context from the goroutine
	// running fn). The error says which.
	ErrReentrant = errors.New("re-entrant call")

	// ErrTxClosed is returned by the methods of a DoTx transaction used
	// after its fn returned (bbolt's ErrTxClosed is the model); nothing is
	// written.
	ErrTxClosed = errors.New("Tx used after its fn returned")

	// ErrDispatcherRunning is wrapped by the error of Dispatch while the
	// engine's dispatcher already runs: one per engine (run one engine per
	// process to drain a shared outbox from several).
	ErrDispatcherRunning = errors.New("a dispatcher is already running")

	// ErrFileFull is returned when a commit would grow the store past its
	// limit (bbolt: BoltOptions.MaxSize, bbolt's ErrMaxSizeReached, which it
	// also wraps). Nothing of that commit is stored: a call whose started
	// record did not fit ran no fn; one whose done record did not fit leaves
	// an interrupted execution. The engine goes on: Prune, Forget and expiry
	// free space that later commits reuse.
	ErrFileFull = errors.New("file reached its maximum size")

	// ErrStorageFailed is returned when a commit failed to write or sync the
	// store (an I/O error, a full disk, a failed fsync: the cause is wrapped
	// too), and by every later call of the engine but Close: the kernel may
	// have dropped the pages it could not write, so the engine no longer knows
	// what the file holds, and it fails closed (as PostgreSQL does after an
	// fsync error). Close the engine and open the store again: the open reads
	// what reached the disk, and every answer given before the failure is
	// there.
	ErrStorageFailed = errors.New("storage failed; close and reopen the engine")
)

// Errors of a backend that several processes share (idempg's Postgres), and
// of the backend interface.
var (
	// ErrFenced is wrapped by the error of a completion, release or lease
	// renewal whose claim is no longer the key's (Backend.Complete, Release
	// and RunTx return it): the claim's lease lapsed (judged by the
	// database's clock) and another process took the key over with a newer
	// fencing token (the fencing of Kleppmann's "How to do distributed
	// locking"). Nothing was written: the new owner's record stands and is
	// never overwritten. fn may have had its effect, so the key was executed
	// at least once, as for any takeover; the new owner's fn sees
	// Call.Recovered. The engine never retries such a write. bbolt never
	// returns it (one process holds the file).
	ErrFenced = errors.New("claim fenced off: another owner took the key over")

	// ErrLeaseLost is the cause (context.Cause) of fn's context when the
	// claim's lease passed unrenewed (Backend.Renew failed or hung, or the
	// process was frozen past it) or the claim was fenced off, and of an
	// outbox handler's context when its message's claim did: another
	// process may now take the key (or the message) over, so fn should
	// stop. fn's context reports it the moment the lease has passed (see
	// the root package doc's Caveats). fn's error is then an interruption,
	// not an outcome: the started record stays for recovery. Postgres only.
	ErrLeaseLost = errors.New("lease lost")

	// ErrClaimTaken is returned by Backend.RunTx for a claim made inside the
	// transaction (Claim.Token zero) when the key was claimed by another
	// owner, or completed, since the engine read it: nothing was written and
	// the engine decides again from a fresh Lookup. bbolt never returns it
	// (every write of a key happens under the engine's per-key lock).
	ErrClaimTaken = errors.New("key claimed by another owner since it was read")

	// ErrGoexit may be returned by Backend.RunTx when fn called
	// runtime.Goexit on a goroutine of the backend's: nothing fn wrote
	// committed. (bbolt returns its commit pipeline's own error.)
	ErrGoexit = errors.New("fn called runtime.Goexit")
)

// InProgressError is the error, wrapped in an *OpError, of a duplicate
// refused while the first call with its key runs (InFlightFail), in this
// process or, with a shared backend, in another. It matches ErrInProgress
// with errors.Is. Adapters turn it into the IETF Idempotency-Key draft's
// HTTP 409 with a Retry-After header, or an MCP error with a retryAfter hint.
type InProgressError struct {
	// StartedAt is when the running call took the key (engine clock); zero
	// when unknown (Postgres: a key held by another process's transaction,
	// whose started row is not committed yet).
	StartedAt time.Time
	// RetryAfter is how long to wait before retrying.
	RetryAfter time.Duration
}

// Error says when the running call started and how long to wait.
func (e *InProgressError) Error() string {
	if e.StartedAt.IsZero() {
		return fmt.Sprintf("%s (elsewhere, not yet committed; retry after %v)", ErrInProgress.Error(), e.RetryAfter)
	}
	return fmt.Sprintf("%s (started %s; retry after %v)", ErrInProgress.Error(), e.StartedAt.UTC().Format(time.RFC3339), e.RetryAfter)
}

// Is reports whether target is ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

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
type OpError struct {
	// Op is the operation: "do", "dotx", "get", "forget", "resolve", "open",
	// "backup", "prune", "records", "dispatch", "enqueue", ...
	Op string
	// Key is the idempotency key the operation was for, whole; empty for
	// operations on no key. The text shows a key over 64 bytes as its first
	// 32 bytes and "…(N bytes)".
	Key string
	// Path is the file path, for "open" and "backup" to a file; empty
	// otherwise.
	Path string
	// Err is the cause, never nil.
	Err error
}

// Error is "idem: ", Op, the quoted Key, Path and Err's text.
func (e *OpError) Error() string {
	var b strings.Builder
	b.WriteString("idem: ")
	b.WriteString(e.Op)
	if e.Key != "" {
		b.WriteByte(' ')
		b.WriteString(quoteKey(e.Key))
	}
	if e.Path != "" {
		b.WriteByte(' ')
		b.WriteString(e.Path)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

// quoteKey quotes key for error text: a key over 64 bytes as its first 32
// bytes (cut at a rune boundary) and "…(N bytes)".
func quoteKey(key string) string {
	if len(key) <= 64 {
		return strconv.Quote(key)
	}
	cut := 32
	for cut > 0 && !utf8.RuneStart(key[cut]) {
		cut--
	}
	return strconv.Quote(key[:cut]) + "…(" + strconv.Itoa(len(key)) + " bytes)"
}

// OpErr wraps err for op on key in an *OpError, so that its text carries
// the prefix once, for every engine's errors (a backend's engine type wraps
// its own operations' errors with it):
// nil stays nil; fn's stored outcome (*Error) is fn's and stays as it is; an
// *OpError made deeper down (a decode, a write) takes op and key, so the
// error reports the operation the caller made.
func OpErr(op, key string, err error) error {
	switch e := err.(type) {
	case nil:
		return nil
	case *Error:
		return err
	case *OpError:
		if e.Op == op && (e.Key == key || key == "") {
			return err
		}
		if key == "" {
			key = e.Key
		}
		return &OpError{Op: op, Key: key, Path: e.Path, Err: e.Err}
	}
	return &OpError{Op: op, Key: key, Err: err}
}

// Unwrap returns Err.
func (e *OpError) Unwrap() error { return e.Err }

// Retryable marks err as one whose effect did not happen: the engine deletes the
// started record, frees the key and returns an error that wraps both err and
// ErrRetryable. Waiting duplicates get the same error and may retry at once.
// The promise covers this attempt only: when the call recovers an interrupted
// execution, whose effect is still unknown, the key keeps a started record
// with this attempt's number, and the next call recovers again (DESIGN.md,
// "what frees a key"). Retryable(nil) is nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &retryableError{err}
}

type retryableError struct{ err error }

func (e *retryableError) Error() string        { return "retryable: " + e.err.Error() }
func (e *retryableError) Unwrap() []error      { return []error{ErrRetryable, e.err} }
func (e *retryableError) Is(target error) bool { return target == ErrRetryable }

// WithCode attaches a machine-readable code to err, stored with the record and
// replayed as Error.Code ("card_declined"). WithCode(nil, code) is nil.
func WithCode(err error, code string) error {
	if err == nil {
		return nil
	}
	return &codedError{err: err, code: code}
}

type codedError struct {
	err  error
	code string
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }
func (e *codedError) Code() string  { return e.code }

// errorCode returns the code of the first error in err's chain that has a
// Code() string method; for an error without one that wraps
// ErrResponseTooLarge, codeResponseTooLarge, so its replays match it too.
func errorCode(err error) string {
	var c interface{ Code() string }
	if errors.As(err, &c) {
		return c.Code()
	}
	if errors.Is(err, ErrResponseTooLarge) {
		return codeResponseTooLarge
	}
	return ""
}
