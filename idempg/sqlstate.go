package idempg

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// transient reports whether err carries a SQLSTATE that means "try again"
// rather than an outcome of fn: 55P03 lock_not_available (the engine's own
// lock_timeout), 40001 serialization_failure, 40P01 deadlock_detected. A
// DoTx fn returning such an error gets it back as idemcore.Retryable (see
// Engine.DoTx).
func transient(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "55P03", "40001", "40P01":
		return true
	}
	return false
}

// isLockTimeout reports whether err is lock_timeout's (55P03).
func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// isLockWait reports whether err ended a wait for another transaction's
// row lock: lock_timeout's (55P03), or the deadlock detector's (40P01),
// which picks a statement that locks several keys (a batch of claims, a
// DoTx transaction) when two such wait for each other's keys.
func isLockWait(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "55P03" || pe.Code == "40P01")
}
