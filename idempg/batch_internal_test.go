package idempg

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestClaimAndCompleteBatches: the statements Do's concurrent claims and
// completions share. One INSERT claims every free key of a batch, each with
// a fencing token of its own, and leaves a key with a live record
// unclaimed; when one key is held by another process's uncommitted DoTx
// transaction, the batch falls back to claims one by one, so that only that
// key waits out lock_timeout. One UPDATE completes a batch: each row as its
// own done record (nil and empty responses apart, a stored error), and a
// completion with a stale token finds nothing.
func TestClaimAndCompleteBatches(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		t.Run(env, func(t *testing.T) { testClaimAndCompleteBatches(t, env) })
	}
}

func testClaimAndCompleteBatches(t *testing.T, env string) {
	ctx := context.Background()
	b, _ := testBackend(t, env)
	now := time.Now()
	claim := func(keys ...string) []*claimReq {
		t.Helper()
		var reqs []*claimReq
		for _, k := range keys {
			reqs = append(reqs, &claimReq{st: &idemcore.Record{Key: k, State: idemcore.StateStarted, Fingerprint: 7, Attempt: 1,
				StartedAt: now, Retention: time.Hour}, done: make(chan struct{})})
		}
		b.claimBatch(reqs)
		return reqs
	}

	reqs := claim("k0", "k1", "k2", "k3", "k4")
	fences := map[int64]bool{}
	for _, r := range reqs {
		if r.err != nil || r.fence == 0 || r.left <= 0 {
			t.Fatalf("claim of free key %s: fence %d, lease %dµs, %v", r.st.Key, r.fence, r.left, r.err)
		}
		fences[r.fence] = true
	}
	if len(fences) != len(reqs) {
		t.Errorf("fencing tokens %v: want one per claim", fences)
	}
	again := claim("k0", "k5")
	if !errors.Is(again[0].err, pgx.ErrNoRows) || again[1].err != nil || again[1].fence == 0 {
		t.Fatalf("claims of a live key and a free one: %v, %v (fence %d)", again[0].err, again[1].err, again[1].fence)
	}

	done := func(r *claimReq, resp []byte, e *idemcore.Error) *completeReq {
		d := *r.st
		d.State, d.CompletedAt, d.Response, d.Err = idemcore.StateDone, now, resp, e
		return &completeReq{c: &idemcore.Claim{Key: r.st.Key, Token: idemcore.Fence(r.fence)}, rec: &d, done: make(chan struct{})}
	}
	cs := []*completeReq{
		done(reqs[0], nil, nil),
		done(reqs[1], []byte{}, nil),
		done(reqs[2], []byte("partial"), &idemcore.Error{Code: "E1", Message: "failed"}),
		done(reqs[3], []byte("stale"), nil),
		done(reqs[4], []byte("ok"), nil),
	}
	cs[3].c.Token++ // another owner's token now
	b.completeBatch(cs)
	for i, c := range cs {
		if c.err != nil || c.found != (i != 3) {
			t.Errorf("completion of %s: found %v, %v; want found unless fenced", c.c.Key, c.found, c.err)
		}
	}
	get := func(key string) *idemcore.Record {
		t.Helper()
		r, _, err := b.Lookup(ctx, idemcore.Lookup{Key: key})
		if err != nil || r == nil {
			t.Fatalf("lookup %s: %+v, %v", key, r, err)
		}
		return r
	}
	if r := get("k0"); r.State != idemcore.StateDone || r.Response != nil {
		t.Errorf("k0: %+v, want done with a nil response", r)
	}
	if r := get("k1"); r.State != idemcore.StateDone || r.Response == nil || len(r.Response) != 0 {
		t.Errorf("k1: %+v, want done with an empty response", r)
	}
	if r := get("k2"); r.State != idemcore.StateDone || string(r.Response) != "partial" || r.Err == nil || r.Err.Code != "E1" || r.Err.Message != "failed" {
		t.Errorf("k2: %+v, want done with its error", r)
	}
	if r := get("k3"); r.State != idemcore.StateStarted {
		t.Errorf("k3: %+v, want still started: a stale token writes nothing", r)
	}
	if r := get("k4"); r.State != idemcore.StateDone || string(r.Response) != "ok" {
		t.Errorf("k4: %+v", r)
	}

	// A key held by another process's DoTx transaction, not committed.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, b.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
		started_ns, retention_ns, expires_ns) VALUES ('held', 7, 1, 1, nextval('{schema}.idem_fence'), 'other', now() + interval '1 hour', 1, 1, 0)`)); err != nil {
		t.Fatal(err)
	}
	b.s.LockTimeout = 100 * time.Millisecond
	held := claim("held", "k6")
	if !isLockTimeout(held[0].err) || held[1].err != nil || held[1].fence == 0 {
		t.Fatalf("claims of a held key and a free one: %v, %v (fence %d); want the held one to time out alone", held[0].err, held[1].err, held[1].fence)
	}

	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// A deadlock: the batch inserts "a" and waits for "x", which another
	// transaction holds and which then waits for "a". When the deadlock
	// detector ends the batch's statement, the batch falls back to claims
	// one by one, so the free key is claimed and only the held ones wait
	// out lock_timeout; no claim fails with the deadlock's error.
	b.s.LockTimeout = 3 * time.Second // longer than deadlock_timeout (1 s)
	// The deadlock forms only if the other transaction's insert of "a"
	// comes while the batch waits for "x"; on a loaded machine the batch's
	// wait may end first (its lock timeout, then claims one by one, so "a"
	// is claimed and the other's insert is a duplicate): that attempt is
	// not the case under test, and it runs again on fresh keys.
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			t.Fatal("no deadlock formed in 5 attempts")
		}
		if formed := deadlockAttempt(t, ctx, b, claim, fmt.Sprint(attempt)); formed {
			break
		}
	}
}

// deadlockAttempt is one try of the deadlock case of
// testClaimAndCompleteBatches, on keys suffixed with sfx; it reports
// whether the deadlock formed (else the caller tries again).
func deadlockAttempt(t *testing.T, ctx context.Context, b *backend, claim func(keys ...string) []*claimReq, sfx string) bool {
	t.Helper()
	other, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	hold := func(key string) error {
		_, err := other.Exec(ctx, b.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, retention_ns, expires_ns) VALUES ($1, 7, 1, 1, nextval('{schema}.idem_fence'), 'other', now() + interval '1 hour', 1, 1, 0)`), key)
		return err
	}
	if err := hold("x" + sfx); err != nil {
		t.Fatal(err)
	}
	otherDone := make(chan error, 1)
	go func() {
		// Once the batch waits for "x": a lock wait of the batch's.
		for {
			var waiting bool
			if err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%unnest($2::text[]%')`).Scan(&waiting); err != nil {
				otherDone <- err
				return
			}
			if waiting {
				break
			}
			time.Sleep(time.Millisecond)
		}
		err := hold("a" + sfx)
		if isLockWait(err) {
			// The detector chose the other transaction (its wait began
			// after the batch's first check): it ends, and the batch goes on.
			err = other.Rollback(ctx)
		}
		otherDone <- err
	}()
	dead := claim("a"+sfx, "x"+sfx, "z"+sfx)
	if err := <-otherDone; err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" {
			return false // the batch's wait ended first: no deadlock
		}
		t.Fatal(err)
	}
	if dead[2].err != nil || dead[2].fence == 0 {
		t.Errorf("the free key of a batch in a deadlock: %v (fence %d), want it claimed", dead[2].err, dead[2].fence)
	}
	for _, r := range dead[:2] {
		if r.err != nil && !isLockTimeout(r.err) {
			t.Errorf("held key %s of a batch in a deadlock: %v, want it claimed (the other transaction chosen) or its own lock timeout", r.st.Key, r.err)
		}
	}
	return true
}

// testEngine is an engine with no pruner over a migrated schema of its own
// on the server of IDEM_TEST_PG, closed when the test ends.
func testEngine(t *testing.T) *Engine {
	t.Helper()
	return openEngine(t, pgtest.Pool(t, pgtest.Env), &Options{}, nil)
}

// openEngine migrates o's schema on pool (a new one of its own if
// o.Schema is empty, set in o) and opens an engine on it with eo (nil: no
// pruner), closed when the test ends.
func openEngine(t *testing.T, pool *pgxpool.Pool, o *Options, eo *idemcore.Options) *Engine {
	t.Helper()
	ctx := context.Background()
	if o.Schema == "" {
		o.Schema = pgtest.Schema(t, pool)
	}
	if _, err := Migrate(ctx, pool, o); err != nil {
		t.Fatal(err)
	}
	if eo == nil {
		eo = &idemcore.Options{PruneInterval: -1}
	}
	e, err := Open(ctx, pool, o, eo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// testBackend is a backend over a migrated schema of its own on the server
// of env (PgBouncer's in poll-only mode), closed when the test ends, and its
// pool.
func testBackend(t *testing.T, env string) (*backend, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.Pool(t, env)
	o := &Options{Schema: pgtest.Schema(t, pool), PollOnly: env == pgtest.BouncerEnv}
	if _, err := Migrate(context.Background(), pool, o); err != nil {
		t.Fatal(err)
	}
	s, err := resolve(o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newBackend(context.Background(), pool, s, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, pool
}
