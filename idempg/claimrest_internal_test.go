package idempg

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestBatchRestLockWaitKeepsFreshClaims: a batch of a fresh key and a key
// whose expired row another transaction holds locked (an operator's
// Resolve runs its fn with the row FOR UPDATE) claims the fresh key with
// claimFreshSQL, which commits; claimSQL for the expired key then waits
// out lock_timeout. The fresh key's claim must still be answered as
// claimed (its fencing token), not re-sent alone, where its own committed
// started row would be found and answered as a record of this engine's
// (an interrupted execution: recovered as attempt 2, or ErrIncomplete
// under RecoverRefuse).
func TestBatchRestLockWaitKeepsFreshClaims(t *testing.T) {
	ctx := context.Background()
	b, pool := testBackend(t, pgtest.Env)
	b.s.LockTimeout = 100 * time.Millisecond // read per statement
	// An expired done record, not pruned yet.
	if _, err := pool.Exec(ctx, b.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, expires_ns, response, has_error, error_code, error_message) VALUES
		('expired', 7, 2, 1, nextval('{schema}.idem_fence'), NULL, NULL, {now_ns} - 7200000000000, {now_ns} - 7200000000000, 1000000000,
			{now_ns} - 7199000000000, 'old', false, '', '')`), b.s.args()...); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var k string
	if err := tx.QueryRow(ctx, b.sql(`SELECT key FROM {schema}.idem_records WHERE key = 'expired' FOR UPDATE`), b.s.args()...).Scan(&k); err != nil {
		t.Fatal(err)
	}
	var reqs []*claimReq
	for _, k := range []string{"expired", "fresh"} {
		reqs = append(reqs, &claimReq{st: &idemcore.Record{Key: k, State: idemcore.StateStarted, Fingerprint: 9, Attempt: 1,
			Retention: time.Hour}, done: make(chan struct{})})
	}
	b.claimBatch(reqs)
	fresh := reqs[1]
	if fresh.err != nil || fresh.fence == 0 {
		var found *idemcore.Record
		if fresh.found != nil {
			found = fresh.found.rec
		}
		t.Errorf("fresh key batched beside a locked expired row: %v (fence %d, found %+v); want it claimed", fresh.err, fresh.fence, found)
	}
	if r := reqs[0]; !isLockWait(r.err) && !errors.Is(r.err, pgx.ErrNoRows) {
		t.Errorf("expired key whose row is locked: %v; want its lock timeout", r.err)
	}
}
