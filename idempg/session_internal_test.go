package idempg

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// hookedPool is a pool on the server whose connections AfterConnect(hook)
// sets.
func hookedPool(t *testing.T, hook *Options) *pgxpool.Pool {
	t.Helper()
	after, err := AfterConnect(hook)
	if err != nil {
		t.Fatal(err)
	}
	return pgtest.PoolWith(t, pgtest.Env, func(c *pgxpool.Config) { c.AfterConnect = after })
}

// TestAfterConnectSetsTheSession: a connection of a pool with the hook has
// the session's lock_timeout and idle_in_transaction_session_timeout of
// the options, and an engine with the same settings sends its statements
// without settings of their own on it; an engine with other settings, or
// in PollOnly mode, sends the ones that carry theirs.
func TestAfterConnectSetsTheSession(t *testing.T) {
	ctx := context.Background()
	pool := hookedPool(t, &Options{LockTimeout: 1234 * time.Millisecond, Lease: 10 * time.Second})
	var lock, idle string
	if err := pool.QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')`).Scan(&lock, &idle); err != nil {
		t.Fatal(err)
	}
	if lock != "1234ms" || idle != "10s" {
		t.Errorf("the hooked session: lock_timeout %s, idle_in_transaction_session_timeout %s; want 1234ms, 10s (the lease)", lock, idle)
	}
	for _, c := range []struct {
		opts Options
		want bool
	}{
		{Options{LockTimeout: 1234 * time.Millisecond, Lease: 10 * time.Second}, true},
		{Options{LockTimeout: 1234 * time.Millisecond, Lease: 10 * time.Second, IdleInTransactionTimeout: time.Minute}, false},
		{Options{Lease: 10 * time.Second}, false},
	} {
		s, err := resolve(&c.opts)
		if err != nil {
			t.Fatal(err)
		}
		b := &backend{pool: pool, s: s, mark: s.sessionMark()}
		if err := b.onConn(ctx, func(_ *pgxpool.Conn, st *statements, session bool) error {
			if session != c.want || (st.complete == b.stmtsIn(true).complete) != c.want {
				t.Errorf("options %+v: session statements %v, want %v", c.opts, session, c.want)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	// PollOnly: the hook leaves the session as it was.
	plain := hookedPool(t, &Options{PollOnly: true, LockTimeout: 1234 * time.Millisecond})
	if err := plain.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&lock); err != nil {
		t.Fatal(err)
	}
	if lock != "0" {
		t.Errorf("a PollOnly hook set lock_timeout to %s, want the server's 0", lock)
	}
	if _, err := AfterConnect(&Options{LockTimeout: -time.Second}); !errors.Is(err, ErrOptions) {
		t.Errorf("AfterConnect of a negative LockTimeout: %v, want ErrOptions", err)
	}
}

// TestSessionBoundsLockWaits: a Do of a key that another process's
// uncommitted DoTx transaction holds (a started row inserted, not
// committed) waits for it at most its LockTimeout per claim, whether the
// bound comes from the session (AfterConnect with the engine's settings)
// or from the statement (a hook of other settings): Do ends with its
// context, while the transaction still holds the key, and fn never runs.
func TestSessionBoundsLockWaits(t *testing.T) {
	for _, c := range []struct {
		name string
		hook Options
	}{
		{"session", Options{LockTimeout: 100 * time.Millisecond}},
		{"statement", Options{LockTimeout: time.Hour}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			pool := hookedPool(t, &c.hook)
			e := openEngine(t, pool, &Options{LockTimeout: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond}, nil)
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, e.b.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
				started_ns, retention_ns, expires_ns) VALUES ('held', 1, 1, 1, nextval('{schema}.idem_fence'), 'other', now() + interval '1 hour', {now_ns}, 3600000000000, {now_ns} + 3600000000000)`)); err != nil {
				t.Fatal(err)
			}
			var held atomic.Bool
			held.Store(true)
			release := time.AfterFunc(30*time.Second, func() { held.Store(false); _ = tx.Rollback(context.Background()) })
			defer func() {
				if release.Stop() {
					_ = tx.Rollback(context.Background())
				}
			}()
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			ran := false
			_, err = e.Do(dctx, "held", []byte("fp"), func(context.Context) ([]byte, error) { ran = true; return nil, nil })
			if err == nil || ran || !held.Load() {
				t.Errorf("Do of a key an uncommitted transaction holds: %v (fn ran %v, still held %v); want an error at its context's end, fn not run, the key still held",
					err, ran, held.Load())
			}
		})
	}
}
