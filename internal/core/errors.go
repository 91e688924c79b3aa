package core

import "errors"

// The sentinels a Backend returns, and the engine's own. Each carries bare
// text (issue 9 item 3): the engine's *OpError adds "idem: op "key": " once.
// The root package re-exports them (var ErrX = core.ErrX) once the engine
// delegates to this package, so errors.Is(err, idem.ErrX) holds for every
// backend.
var (
	// ErrFingerprintMismatch: a key reused with a different fingerprint. A
	// Backend's Lookup may return it, unwrapped, instead of a live done
	// record whose fingerprint differs from the one asked for (see Lookup).
	ErrFingerprintMismatch = errors.New("fingerprint mismatch")

	// ErrGoexit is returned by Backend.RunTx when fn called runtime.Goexit
	// (t.FailNow does): nothing fn wrote committed.
	ErrGoexit = errors.New("fn called runtime.Goexit")

	// ErrNotFound: the key, or the outbox message, has no live entry.
	ErrNotFound = errors.New("record not found")

	// ErrCorrupt: a stored record or message fails to decode. A backend
	// wraps it with the key or sequence number.
	ErrCorrupt = errors.New("corrupt record")

	// ErrResponseTooLarge: fn's outcome exceeded the engine's
	// MaxResponseSize and was stored as this error (CodeResponseTooLarge).
	ErrResponseTooLarge = errors.New("response too large")

	// ErrFenced is returned by Backend.Complete, Release and RunTx when the
	// claim's fencing token is no longer the key's: another owner took the
	// key over (its lease lapsed) and the write was refused, so the new
	// owner's record stands. The engine never retries such a write; the
	// caller's fn may have had its effect (at-least-once, as for any
	// takeover). bbolt never returns it (one process holds the file).
	ErrFenced = errors.New("claim fenced off: another owner took the key over")

	// ErrLeaseLost is the cause of fn's context when the backend could not
	// renew the claim (Backend.Renew failed) before the lease lapsed: another
	// process may take the key over, so fn should stop. Postgres only.
	ErrLeaseLost = errors.New("lease lost")

	// ErrClaimTaken is returned by Backend.RunTx for a claim made inside the
	// transaction (Claim.Token zero) when the key was claimed by another
	// owner, or completed, since the engine read it: nothing was written and
	// the engine decides again from a fresh Lookup. bbolt never returns it
	// (every write of a key happens under the engine's per-key lock).
	ErrClaimTaken = errors.New("key claimed by another owner since it was read")
)
