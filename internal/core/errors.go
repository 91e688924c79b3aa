package core

import (
	"errors"
	"fmt"
	"time"
)

// The engine's sentinels, for every backend. The root package re-exports each
// (var ErrX = core.ErrX) once its engine delegates to this package, so that
// errors.Is(err, idem.ErrX) holds whatever the backend; their meaning is
// documented there. A Backend returns the ones its methods name.
var (
	ErrInvalidKey          = errors.New("idem: invalid idempotency key")
	ErrFingerprintMismatch = errors.New("idem: fingerprint mismatch")
	ErrInProgress          = errors.New("idem: request in progress")
	ErrIncomplete          = errors.New("idem: execution incomplete")
	ErrRetryable           = errors.New("idem: retryable")
	ErrResponseTooLarge    = errors.New("idem: response too large")
	ErrNotFound            = errors.New("idem: record not found")
	ErrState               = errors.New("idem: record in the wrong state")
	ErrCorrupt             = errors.New("idem: corrupt record")
	ErrClosed              = errors.New("idem: engine closed")
	ErrReentrant           = errors.New("idem: re-entrant call")

	// ErrGoexit is returned by Backend.RunTx when fn called runtime.Goexit
	// (t.FailNow does): nothing fn wrote committed.
	ErrGoexit = errors.New("idem: fn called runtime.Goexit")

	// ErrFenced is returned by Backend.Complete, Release and RunTx when the
	// claim's fencing token is no longer the key's: another owner took the
	// key over (its lease lapsed) and the write was refused, so the new
	// owner's record stands. The engine never retries such a write; the
	// caller's fn may have had its effect (at-least-once, as for any
	// takeover). bbolt never returns it (one process holds the file).
	ErrFenced = errors.New("idem: claim fenced off: another owner took the key over")

	// ErrLeaseLost is the cause of fn's context when the backend could not
	// renew the claim (Backend.Renew failed) before the lease lapsed: another
	// process may take the key over, so fn should stop. Postgres only.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrClaimTaken is returned by Backend.RunTx for a claim made inside the
	// transaction (Claim.Token zero) when the key was claimed by another
	// owner, or completed, since the engine read it: nothing was written and
	// the engine decides again from a fresh Lookup. bbolt never returns it
	// (every write of a key happens under the engine's per-key lock).
	ErrClaimTaken = errors.New("idem: key claimed by another owner since it was read")
)

// InProgressError is the error, wrapped in an *OpError, of a duplicate
// refused while the first call with its key runs (InFlightFail), in this
// process or, with a shared backend, in another. It matches ErrInProgress.
type InProgressError struct {
	// StartedAt is when the running call took the key (engine clock).
	StartedAt time.Time
	// RetryAfter is how long to wait before retrying.
	RetryAfter time.Duration
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("%s (started %s; retry after %v)", ErrInProgress.Error(), e.StartedAt.UTC().Format(time.RFC3339), e.RetryAfter)
}

// Is reports whether target is ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// OpError reports which operation failed on which key, and why. Err is never
// nil; errors.Is and errors.As see through it.
type OpError struct {
	Op  string // "do", "dotx", "get", "forget", "resolve", "open", ...
	Key string // the idempotency key, or the file path for "open"
	Err error
}

func (e *OpError) Error() string {
	if e.Key == "" {
		return "idem: " + e.Op + ": " + e.Err.Error()
	}
	return fmt.Sprintf("idem: %s %q: %v", e.Op, e.Key, e.Err)
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
// Code() string method.
func errorCode(err error) string {
	var c interface{ Code() string }
	if errors.As(err, &c) {
		return c.Code()
	}
	return ""
}
