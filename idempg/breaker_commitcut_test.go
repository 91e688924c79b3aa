package idempg

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestBreakerBatchCommitCutHooked cuts the COMMIT of a DoTx transaction that
// several calls share (each under its savepoint), on a hooked pool through
// a TCP proxy: the transaction's id each call's completion answered
// (txid_current in a subtransaction) must resolve every call of the batch
// alike: all answered and stored once (the answer lost, the COMMIT ran), or
// all failed with nothing stored (the COMMIT never arrived).
func TestBreakerBatchCommitCutHooked(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cut       func(p *pgtest.Proxy, marker string)
		committed bool
	}{
		{"answer lost", (*pgtest.Proxy).CutAfter, true},
		{"commit never arrives", (*pgtest.Proxy).CutBefore, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			plain := pgtest.Pool(t, pgtest.Env)
			o := &Options{Schema: pgtest.Schema(t, plain), Lease: 2 * time.Second}
			if _, err := Migrate(ctx, plain, o); err != nil {
				t.Fatal(err)
			}
			if _, err := plain.Exec(ctx, "CREATE TABLE "+o.Schema+".effects (key text PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			cfg, proxy := pgtest.ProxiedConfig(t, pgtest.Env)
			cfg.MaxConns = 4
			var err error
			if cfg.AfterConnect, err = AfterConnect(o); err != nil {
				t.Fatal(err)
			}
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			e, err := Open(ctx, pool, o, &idemcore.Options{PruneInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Close() })
			e.b.commitAvg.Store(int64(time.Hour)) // one transaction per batch
			q := &e.b.dotx

			// The calls holding the slots end (and commit) before the cut is
			// armed; the batch's fns wait at gate2 meanwhile, inside the
			// batch's transaction, so that the COMMIT cut is the batch's.
			gate2 := make(chan struct{})
			var wg sync.WaitGroup
			release := holdDoTxSlots(t, ctx, e)
			const n = 6
			errs := make([]error, n)
			ress := make([]idemcore.Result, n)
			xids := make([]int64, n)
			for i := range n {
				key := fmt.Sprintf("b%d", i)
				wg.Go(func() {
					ress[i], errs[i] = e.DoTx(ctx, key, nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
						<-gate2
						if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&xids[i]); err != nil {
							return nil, err
						}
						_, err := tx.Exec(ctx, "INSERT INTO "+o.Schema+".effects (key) VALUES ($1)", key)
						return []byte("ok " + key), err
					})
				})
			}
			q.waitFor(func() bool { return len(q.queue) == n })
			release()
			tc.cut(proxy, "commit\x00")
			close(gate2)
			wg.Wait()
			for i := range n {
				if xids[i] != xids[0] {
					t.Fatalf("the calls ran in transactions %v, want one shared", xids)
				}
			}
			if proxy.Cut() != 1 {
				t.Fatalf("the proxy cut %d connections, want 1", proxy.Cut())
			}
			check, err := Open(ctx, plain, o, &idemcore.Options{PruneInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer check.Close()
			for i := range n {
				key := fmt.Sprintf("b%d", i)
				var effect bool
				if err := plain.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+o.Schema+".effects WHERE key = $1)", key).Scan(&effect); err != nil {
					t.Fatal(err)
				}
				rec, gerr := check.Get(key)
				stored := gerr == nil && rec.State == idemcore.StateDone && string(rec.Response) == "ok "+key
				switch {
				case tc.committed && (errs[i] != nil || string(ress[i].Response) != "ok "+key || !effect || !stored):
					t.Errorf("%s: %+v, %v; effect %v; record %+v (%v); want answered and stored", key, ress[i], errs[i], effect, rec, gerr)
				case !tc.committed && (errs[i] == nil || effect || gerr == nil):
					t.Errorf("%s: %+v, %v; effect %v; record %+v (%v); want an error, nothing stored", key, ress[i], errs[i], effect, rec, gerr)
				}
			}
		})
	}
}
