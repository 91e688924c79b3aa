package idempg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestBreakerTwoEnginesOneHookedPool: two engines share a pool hooked with
// the first's settings (LockTimeout 100ms); the second has LockTimeout
// 300ms, so its statements and DoTx transactions carry their own. A key an
// uncommitted transaction holds is refused by both (InFlightFail: an
// *InProgressError), through Do and DoTx, without fn running; fresh keys
// go through both; and afterwards every connection of the pool still has
// the hook's session settings (the second engine's set nothing beyond its
// own transactions).
func TestBreakerTwoEnginesOneHookedPool(t *testing.T) {
	ctx := context.Background()
	plain := pgtest.Pool(t, pgtest.Env)
	oa := &Options{Schema: pgtest.Schema(t, plain), LockTimeout: 100 * time.Millisecond}
	ob := &Options{Schema: oa.Schema, LockTimeout: 300 * time.Millisecond}
	if _, err := Migrate(ctx, plain, oa); err != nil {
		t.Fatal(err)
	}
	after, err := AfterConnect(oa)
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.PoolWith(t, pgtest.Env, func(c *pgxpool.Config) { c.AfterConnect = after; c.MaxConns = 6 })
	eo := func() *idemcore.Options { return &idemcore.Options{PruneInterval: -1, InFlight: idemcore.InFlightFail} }
	a, err := Open(ctx, pool, oa, eo())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(ctx, pool, ob, eo())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	holder, err := plain.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, a.b.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
		started_ns, retention_ns, expires_ns) VALUES ('held', 1, 1, 1, nextval('{schema}.idem_fence'), 'other', now() + interval '1 hour', {now_ns}, 3600000000000, {now_ns} + 3600000000000)`)); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	var wg sync.WaitGroup
	for round := range 4 {
		for ei, e := range []*Engine{a, b} {
			for _, viaTx := range []bool{false, true} {
				wg.Go(func() {
					var err error
					if viaTx {
						_, err = e.DoTx(ctx, "held", []byte("fp"), func(context.Context, pgx.Tx) ([]byte, error) { ran.Add(1); return nil, nil })
					} else {
						_, err = e.Do(ctx, "held", []byte("fp"), func(context.Context) ([]byte, error) { ran.Add(1); return nil, nil })
					}
					var ip *idemcore.InProgressError
					if !errors.As(err, &ip) {
						t.Errorf("engine %d, DoTx %v: held key: %v, want an *InProgressError", ei, viaTx, err)
					}
				})
				key := fmt.Sprintf("fresh-%d-%d-%v", round, ei, viaTx)
				wg.Go(func() {
					var err error
					if viaTx {
						_, err = e.DoTx(ctx, key, nil, func(_ context.Context, tx pgx.Tx) ([]byte, error) {
							_, err := tx.Exec(ctx, "SELECT 1")
							return []byte(key), err
						})
					} else {
						_, err = e.Do(ctx, key, nil, func(context.Context) ([]byte, error) { return []byte(key), nil })
					}
					if err != nil {
						t.Errorf("%s: %v", key, err)
					}
				})
			}
		}
	}
	wg.Wait()
	if n := ran.Load(); n != 0 {
		t.Errorf("fn ran %d times for the held key", n)
	}
	// Every connection of the pool at once: the hook's settings.
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range 6 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var lock, idle string
		if err := c.QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')`).Scan(&lock, &idle); err != nil {
			t.Fatal(err)
		}
		if lock != "100ms" || idle != "30s" {
			t.Errorf("a connection of the hooked pool after both engines' calls: lock_timeout %s, idle_in_transaction_session_timeout %s; want 100ms, 30s", lock, idle)
		}
	}
}
