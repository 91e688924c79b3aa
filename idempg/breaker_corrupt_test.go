package idempg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestBreakerCorruptRowsEveryPath: rows that no CHECK refuses since
// version 7 (a state other than 1 or 2, an attempt below 1), done-like and
// started-like (a live lease of another process, or a lapsed one within
// retention), read as ErrCorrupt through Do and DoTx, alone and in
// batches among fresh keys, on a plain and on a hooked pool; fn never runs
// for them, and the fresh keys around them are stored.
func TestBreakerCorruptRowsEveryPath(t *testing.T) {
	for _, hooked := range []bool{false, true} {
		t.Run(fmt.Sprintf("hooked=%v", hooked), func(t *testing.T) {
			ctx := context.Background()
			var pool *pgxpool.Pool
			if hooked {
				pool = hookedPool(t, &Options{})
			} else {
				pool = pgtest.Pool(t, pgtest.Env)
			}
			e := openEngine(t, pool, &Options{}, nil)
			const hour = `3600000000000`
			if _, err := pool.Exec(ctx, e.b.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
					started_ns, completed_ns, retention_ns, expires_ns) VALUES
				('done-state0', 1, 0, 1, nextval('{schema}.idem_fence'), NULL, NULL, {now_ns}, {now_ns}, `+hour+`, {now_ns} + `+hour+`),
				('done-state-1', 1, -1, 1, nextval('{schema}.idem_fence'), NULL, NULL, {now_ns}, {now_ns}, `+hour+`, {now_ns} + `+hour+`),
				('done-attempt-5', 1, 2, -5, nextval('{schema}.idem_fence'), NULL, NULL, {now_ns}, {now_ns}, `+hour+`, {now_ns} + `+hour+`),
				('live-state3', 1, 3, 1, nextval('{schema}.idem_fence'), 'other', now() + interval '1 hour', {now_ns}, 0, `+hour+`, {now_ns} + `+hour+`),
				('live-attempt0', 1, 1, 0, nextval('{schema}.idem_fence'), 'other', now() + interval '1 hour', {now_ns}, 0, `+hour+`, {now_ns} + `+hour+`),
				('lapsed-attempt0', 1, 1, 0, nextval('{schema}.idem_fence'), 'gone', 'epoch', {now_ns}, 0, `+hour+`, {now_ns} + `+hour+`),
				('lapsed-state3', 1, 3, 1, nextval('{schema}.idem_fence'), 'gone', 'epoch', {now_ns}, 0, `+hour+`, {now_ns} + `+hour+`)`)); err != nil {
				t.Fatal(err)
			}
			corrupt := []string{"done-state0", "done-state-1", "done-attempt-5", "live-state3", "live-attempt0", "lapsed-attempt0", "lapsed-state3"}
			var ran atomic.Int32
			do := func(key string, viaTx bool) error {
				if viaTx {
					_, err := e.DoTx(ctx, key, []byte("fp"), func(context.Context, pgx.Tx) ([]byte, error) { ran.Add(1); return []byte("x"), nil })
					return err
				}
				_, err := e.Do(ctx, key, []byte("fp"), func(context.Context) ([]byte, error) { ran.Add(1); return []byte("x"), nil })
				return err
			}
			for _, viaTx := range []bool{false, true} {
				for _, key := range corrupt {
					if err := do(key, viaTx); !errors.Is(err, idemcore.ErrCorrupt) {
						t.Errorf("alone, DoTx %v, %s: %v, want ErrCorrupt", viaTx, key, err)
					}
				}
			}
			if n := ran.Load(); n != 0 {
				t.Fatalf("fn ran %d times for corrupt keys", n)
			}
			// A crowd: corrupt keys among fresh ones, so that they share
			// claim and completion statements and DoTx transactions.
			var wg sync.WaitGroup
			var freshRan atomic.Int32
			for round := range 4 {
				for i, key := range corrupt {
					for _, viaTx := range []bool{false, true} {
						wg.Go(func() {
							if err := do(key, viaTx); !errors.Is(err, idemcore.ErrCorrupt) {
								t.Errorf("in a crowd, DoTx %v, %s: %v, want ErrCorrupt", viaTx, key, err)
							}
						})
						fresh := fmt.Sprintf("fresh-%d-%d-%v", round, i, viaTx)
						wg.Go(func() {
							var err error
							if viaTx {
								_, err = e.DoTx(ctx, fresh, nil, func(context.Context, pgx.Tx) ([]byte, error) { freshRan.Add(1); return []byte(fresh), nil })
							} else {
								_, err = e.Do(ctx, fresh, nil, func(context.Context) ([]byte, error) { freshRan.Add(1); return []byte(fresh), nil })
							}
							if err != nil {
								t.Errorf("%s: %v", fresh, err)
							}
						})
					}
				}
			}
			wg.Wait()
			if n := ran.Load(); n != 0 {
				t.Errorf("fn ran %d times for corrupt keys in the crowd", n)
			}
			if n := freshRan.Load(); n != int32(4*len(corrupt)*2) {
				t.Errorf("fresh keys: fn ran %d times, want %d", n, 4*len(corrupt)*2)
			}
			for _, key := range corrupt {
				if _, err := e.Get(key); !errors.Is(err, idemcore.ErrCorrupt) {
					t.Errorf("Get %s: %v, want ErrCorrupt", key, err)
				}
			}
		})
	}
}
