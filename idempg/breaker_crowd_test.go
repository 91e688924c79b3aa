package idempg

import (
	"bytes"
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

// breakerHooked is an engine on a pool whose connections AfterConnect(o)
// sets (o's Schema filled in), on the server of env (PgBouncer's with o
// PollOnly), with the pool's MaxConns conns.
func breakerHooked(t *testing.T, env string, o Options, conns int32) (*Engine, *pgxpool.Pool) {
	t.Helper()
	o.PollOnly = env == pgtest.BouncerEnv
	after, err := AfterConnect(&o)
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.PoolWith(t, env, func(c *pgxpool.Config) {
		c.AfterConnect = after
		if conns > 0 {
			c.MaxConns = conns
		}
	})
	return openEngine(t, pool, &o, &idemcore.Options{PruneInterval: -1, MaxResponseSize: -1}), pool
}

var breakerEnvs = []string{pgtest.Env, pgtest.BouncerEnv}

// TestBreakerHookedSameKeyCrowd: 64 concurrent calls of one key on a hooked
// pool (and on PgBouncer with the hook given the PollOnly options), through
// Do and through DoTx: fn runs once per key and every caller gets its
// response.
func TestBreakerHookedSameKeyCrowd(t *testing.T) {
	for _, env := range breakerEnvs {
		t.Run(env, func(t *testing.T) {
			e, _ := breakerHooked(t, env, Options{PollInterval: 10 * time.Millisecond}, 0)
			ctx := context.Background()
			for _, viaTx := range []bool{false, true} {
				for round := range 3 {
					key := fmt.Sprintf("same-%v-%d", viaTx, round)
					var runs atomic.Int32
					var wg sync.WaitGroup
					for range 64 {
						wg.Go(func() {
							var (
								res idemcore.Result
								err error
							)
							if viaTx {
								res, err = e.DoTx(ctx, key, []byte("fp"), func(context.Context, pgx.Tx) ([]byte, error) {
									runs.Add(1)
									time.Sleep(2 * time.Millisecond)
									return []byte("r " + key), nil
								})
							} else {
								res, err = e.Do(ctx, key, []byte("fp"), func(context.Context) ([]byte, error) {
									runs.Add(1)
									time.Sleep(2 * time.Millisecond)
									return []byte("r " + key), nil
								})
							}
							if err != nil || string(res.Response) != "r "+key {
								t.Errorf("%s: %+v, %v", key, res, err)
							}
						})
					}
					wg.Wait()
					if n := runs.Load(); n != 1 {
						t.Errorf("%s: fn ran %d times, want once", key, n)
					}
				}
			}
		})
	}
}

// TestBreakerHookedDoTxBatchMisbehaving: DoTx calls sharing transactions on
// a hooked pool, where some fns fail, panic, or swallow a statement error:
// each good call's effect and record commit once, a failed fn's error is
// stored without its effect, a panicking or swallowing call leaves neither, and a second round replays every good key without running fn.
func TestBreakerHookedDoTxBatchMisbehaving(t *testing.T) {
	for _, env := range breakerEnvs {
		t.Run(env, func(t *testing.T) {
			e, pool := breakerHooked(t, env, Options{}, 8)
			ctx := context.Background()
			schema := e.b.s.Schema
			if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".effects (key text PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			e.b.commitAvg.Store(int64(time.Hour)) // one transaction per batch
			q := &e.b.dotx
			const n = 32
			kind := func(i int) string {
				switch i % 8 {
				case 3:
					return "error"
				case 5:
					return "panic"
				case 6:
					return "swallow"
				}
				return ""
			}
			gate := make(chan struct{})
			var runs [n]atomic.Int32
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				key := fmt.Sprintf("k%02d", i)
				wg.Go(func() {
					defer func() { // DoTx re-panics fn's panic in its caller
						if v := recover(); v != nil {
							errs[i] = fmt.Errorf("panicked: %v", v)
						}
					}()
					_, errs[i] = e.DoTx(ctx, key, nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
						<-gate
						runs[i].Add(1)
						if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".effects (key) VALUES ($1)", key); err != nil {
							return nil, err
						}
						switch kind(i) {
						case "error":
							return nil, errors.New("fn failed")
						case "panic":
							panic("fn panicked")
						case "swallow":
							_, _ = tx.Exec(ctx, "SELECT 1/0")
						}
						return []byte("ok " + key), nil
					})
				})
			}
			q.waitFor(func() bool { return len(q.queue) == n-q.max })
			close(gate)
			wg.Wait()
			for i := range n {
				key := fmt.Sprintf("k%02d", i)
				var effect bool
				if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+schema+".effects WHERE key = $1)", e.b.s.args(key)...).Scan(&effect); err != nil {
					t.Fatal(err)
				}
				rec, gerr := e.Get(key)
				if kind(i) == "error" {
					// fn's error is its outcome (stored, replayed); its
					// writes are rolled back to its savepoint.
					if errs[i] == nil || effect || gerr != nil || rec.Err == nil {
						t.Errorf("%s (%s): %v; effect %v; record %+v (%v): want the error stored, the effect rolled back", key, kind(i), errs[i], effect, rec, gerr)
					}
					continue
				}
				if kind(i) != "" {
					if errs[i] == nil || effect || gerr == nil {
						t.Errorf("%s (%s): %v; effect %v; record %+v (%v): want an error, nothing stored", key, kind(i), errs[i], effect, rec, gerr)
					}
					continue
				}
				if errs[i] != nil || !effect || gerr != nil || rec.State != idemcore.StateDone || string(rec.Response) != "ok "+key {
					t.Errorf("%s: %v; effect %v; record %+v (%v): want it committed", key, errs[i], effect, rec, gerr)
				}
				res, err := e.DoTx(ctx, key, nil, func(context.Context, pgx.Tx) ([]byte, error) { return nil, errors.New("ran again") })
				if err != nil || !res.Replayed || string(res.Response) != "ok "+key {
					t.Errorf("%s replayed: %+v, %v", key, res, err)
				}
				if r := runs[i].Load(); r != 1 {
					t.Errorf("%s: fn ran %d times", key, r)
				}
			}
		})
	}
}

// TestBreakerHugeResponses: responses of several MB through Do and DoTx, a
// few at once (so that completions share statements), on a hooked pool and
// on PgBouncer: each replays byte for byte.
func TestBreakerHugeResponses(t *testing.T) {
	for _, env := range breakerEnvs {
		t.Run(env, func(t *testing.T) {
			e, _ := breakerHooked(t, env, Options{}, 0)
			ctx := context.Background()
			body := func(i int) []byte {
				b := bytes.Repeat([]byte{byte(i), 0, 0xff, 'x'}, (6<<20)/4+i)
				return b
			}
			var wg sync.WaitGroup
			for i := range 6 {
				key := fmt.Sprintf("huge-%d", i)
				wg.Go(func() {
					var err error
					if i%2 == 0 {
						_, err = e.Do(ctx, key, nil, func(context.Context) ([]byte, error) { return body(i), nil })
					} else {
						_, err = e.DoTx(ctx, key, nil, func(context.Context, pgx.Tx) ([]byte, error) { return body(i), nil })
					}
					if err != nil {
						t.Errorf("%s: %v", key, err)
					}
				})
			}
			wg.Wait()
			for i := range 6 {
				key := fmt.Sprintf("huge-%d", i)
				res, err := e.Do(ctx, key, nil, func(context.Context) ([]byte, error) { return nil, errors.New("ran again") })
				if err != nil || !res.Replayed || !bytes.Equal(res.Response, body(i)) {
					t.Errorf("%s replayed: %d bytes, replayed %v, %v; want %d bytes equal", key, len(res.Response), res.Replayed, err, len(body(i)))
				}
			}
		})
	}
}
