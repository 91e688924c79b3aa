package core

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The engine's sentinels, for every backend. The root package re-exports each
// (var ErrX = core.ErrX), so that
// errors.Is(err, idem.ErrX) holds whatever the backend; their meaning is
// documented there. A Backend returns the ones its methods name.
var (
	ErrInvalidKey          = errors.New("invalid idempotency key")
	ErrFingerprintMismatch = errors.New("fingerprint mismatch")
	ErrInProgress          = errors.New("request in progress")
	ErrIncomplete          = errors.New("execution incomplete")
	ErrRetryable           = errors.New("retryable")
	ErrResponseTooLarge    = errors.New("response too large")
	ErrNotFound            = errors.New("record not found")
	ErrState               = errors.New("record in the wrong state")
	ErrCorrupt             = errors.New("corrupt record")
	ErrClosed              = errors.New("engine closed")
	ErrReentrant           = errors.New("re-entrant call")
	ErrMessageNotFound     = errors.New("outbox message not found")
	ErrDispatcherRunning   = errors.New("a dispatcher is already running")
	ErrTxClosed            = errors.New("Tx used after its fn returned")
	ErrFileFull            = errors.New("file reached its maximum size")
	ErrStorageFailed       = errors.New("storage failed; close and reopen the engine")
	ErrOptions             = errors.New("invalid options")

	// ErrGoexit may be returned by Backend.RunTx when fn called
	// runtime.Goexit on a goroutine of the backend's: nothing fn wrote
	// committed. (bbolt returns its commit pipeline's own error.)
	ErrGoexit = errors.New("fn called runtime.Goexit")

	// ErrFenced is returned by Backend.Complete, Release and RunTx when the
	// claim's fencing token is no longer the key's: another owner took the
	// key over (its lease lapsed) and the write was refused, so the new
	// owner's record stands. The engine never retries such a write; the
	// caller's fn may have had its effect (at-least-once, as for any
	// takeover). bbolt never returns it (one process holds the file).
	ErrFenced = errors.New("claim fenced off: another owner took the key over")

	// ErrLeaseLost is the cause of fn's context when the claim's lease
	// passed unrenewed (Backend.Renew failed or hung, or the process froze
	// past it), and of an outbox handler's when its message's claim did:
	// another process may take the key (or the message) over, so fn should
	// stop. Postgres only.
	ErrLeaseLost = errors.New("lease lost")

	// ErrClaimTaken is returned by Backend.RunTx for a claim made inside the
	// transaction (Claim.Token zero) when the key was claimed by another
	// owner, or completed, since the engine read it: nothing was written and
	// the engine decides again from a fresh Lookup. bbolt never returns it
	// (every write of a key happens under the engine's per-key lock).
	ErrClaimTaken = errors.New("key claimed by another owner since it was read")
)

// InProgressError is the error, wrapped in an *OpError, of a duplicate
// refused while the first call with its key runs (InFlightFail), in this
// process or, with a shared backend, in another. It matches ErrInProgress.
type InProgressError struct {
	// StartedAt is when the running call took the key (engine clock); zero
	// when unknown (Postgres: a key held by another process's transaction,
	// whose started row is not committed yet).
	StartedAt time.Time
	// RetryAfter is how long to wait before retrying.
	RetryAfter time.Duration
}

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
	Err  error
}

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

// OpErr wraps err for op on key, so that its text carries the prefix once:
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

func (e *OpError) Unwrap() error { return e.Err }

// Retryable marks err as one whose effect did not happen (idem.Retryable).
// Retryable(nil) is nil.
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

// WithCode attaches a machine-readable code to err (idem.WithCode).
// WithCode(nil, code) is nil.
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
// ErrResponseTooLarge, CodeResponseTooLarge, so its replays match it too.
func errorCode(err error) string {
	var c interface{ Code() string }
	if errors.As(err, &c) {
		return c.Code()
	}
	if errors.Is(err, ErrResponseTooLarge) {
		return CodeResponseTooLarge
	}
	return ""
}
