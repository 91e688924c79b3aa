package idem

import (
	"context"

	"github.com/idemkit/idem/idemcore"
)

// The bbolt claim rule. One process holds the file: bbolt's file lock
// (flock), taken by Open and held until Close, which a second Open, in this
// process or another, waits for until BoltOptions.LockTimeout. And within the
// process the engine's per-key singleflight (idemcore) holds a key while
// it claims it. So a started record found by the leader of its key is owned
// by nobody: an interrupted execution, recovered at once (no lease to wait
// out); a claim never lapses (no heartbeat) and is never taken over by
// another owner (no write is fenced off).

// Owner: always an orphan (see above).
func (b *boltBackend) Owner(context.Context, *Record) (idemcore.Ownership, error) {
	return idemcore.Ownership{}, nil
}

// Claim makes the started record durable (journal.go), replacing the interrupted execution it
// recovers, if any. The fencing token is the attempt.
func (b *boltBackend) Claim(_ context.Context, req idemcore.ClaimRequest) (idemcore.ClaimResult, error) {
	if err := b.record(func(tx recTx) error { return b.st.put(tx, req.Started, req.Prev) }); err != nil {
		return idemcore.ClaimResult{}, err
	}
	return idemcore.ClaimResult{Status: idemcore.Claimed, Claim: &idemcore.Claim{
		Key: req.Started.Key, Fingerprint: req.Started.Fingerprint, Token: idemcore.Fence(req.Started.Attempt),
		Started: req.Started, Prev: req.Prev,
	}}, nil
}

// Renew has nothing to do: a bbolt claim never lapses.
func (b *boltBackend) Renew(context.Context, *idemcore.Claim) error { return nil }
