package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/testkit"
)

// store is one migrated schema and a database clock the tests move.
type store struct {
	pool   *pgxpool.Pool
	opts   idempg.Options
	offset atomic.Int64 // ns added to the database's now()
}

func newStore(t *testing.T, env string) *store {
	t.Helper()
	pool := pgtest.Pool(t, env)
	st := &store{pool: pool, opts: idempg.Options{Schema: pgtest.Schema(t, pool), PollOnly: env == pgtest.BouncerEnv,
		Lease: 2 * time.Second, PollInterval: 20 * time.Millisecond}}
	idempg.SetClockOffset(&st.opts, func() time.Duration { return time.Duration(st.offset.Load()) })
	if _, err := idempg.Migrate(context.Background(), pool, &st.opts); err != nil {
		t.Fatal(err)
	}
	return st
}

// expireLeases moves the database's clock past every lease taken so far.
func (st *store) expireLeases() { st.offset.Add(int64(st.opts.Lease + time.Second)) }

func (st *store) open(t *testing.T, eo *idemcore.Options) *idempg.Engine {
	t.Helper()
	if eo == nil {
		eo = &idemcore.Options{}
	}
	eo.PruneInterval = -1
	e, err := idempg.Open(context.Background(), st.pool, &st.opts, eo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func TestDoReplays(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		t.Run(env, func(t *testing.T) {
			st := newStore(t, env)
			e := st.open(t, nil)
			ctx := context.Background()
			var runs atomic.Int32
			fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("ok"), nil }
			r1, err := e.Do(ctx, "k1", []byte("fp"), fn)
			if err != nil || string(r1.Response) != "ok" || r1.Replayed {
				t.Fatalf("first Do: %+v, %v", r1, err)
			}
			// Another engine on the same schema (another process's view).
			e2 := st.open(t, nil)
			r2, err := e2.Do(ctx, "k1", []byte("fp"), fn)
			if err != nil || string(r2.Response) != "ok" || !r2.Replayed {
				t.Fatalf("second Do: %+v, %v", r2, err)
			}
			if runs.Load() != 1 {
				t.Fatalf("fn ran %d times", runs.Load())
			}
			if _, err := e2.Do(ctx, "k1", []byte("other"), fn); !errors.Is(err, idemcore.ErrFingerprintMismatch) {
				t.Fatalf("other fingerprint: %v", err)
			}
			// nil and empty stay apart.
			for key, want := range map[string][]byte{"nil": nil, "empty": {}} {
				if _, err := e.Do(ctx, key, nil, func(context.Context) ([]byte, error) { return want, nil }); err != nil {
					t.Fatal(err)
				}
				r, err := e2.Do(ctx, key, nil, fn)
				if err != nil || (r.Response == nil) != (want == nil) || !r.Replayed {
					t.Errorf("%s: replay %+v (nil %v), %v", key, r, r.Response == nil, err)
				}
			}
			// A permanent error is stored and replayed with its code.
			_, err = e.Do(ctx, "fail", nil, func(context.Context) ([]byte, error) {
				return nil, idemcore.WithCode(errors.New("declined"), "card_declined")
			})
			var ie *idemcore.Error
			if !errors.As(err, &ie) || ie.Code != "card_declined" {
				t.Fatalf("permanent error: %v", err)
			}
			_, err = e2.Do(ctx, "fail", nil, fn)
			if !errors.As(err, &ie) || ie.Code != "card_declined" || ie.Message != "declined" || !ie.Replayed {
				t.Fatalf("replayed error: %#v", err)
			}
		})
	}
}

// TestDoTxCommitsWithRecord: fn's writes and the done record commit
// together; a failing fn leaves neither; a replay runs nothing.
func TestDoTxCommitsWithRecord(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		t.Run(env, func(t *testing.T) {
			st := newStore(t, env)
			ctx := context.Background()
			if _, err := st.pool.Exec(ctx, "CREATE TABLE "+st.opts.Schema+".effects (key text PRIMARY KEY, n int)"); err != nil {
				t.Fatal(err)
			}
			e := st.open(t, nil)
			put := func(key string, fail bool) func(context.Context, pgx.Tx) ([]byte, error) {
				return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
					if _, err := tx.Exec(ctx, "INSERT INTO "+st.opts.Schema+".effects VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = effects.n + 1", key); err != nil {
						return nil, err
					}
					if fail {
						return nil, errors.New("boom")
					}
					return []byte("done"), nil
				}
			}
			for range 3 {
				if _, err := e.DoTx(ctx, "a", nil, put("a", false)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := e.DoTx(ctx, "b", nil, put("b", true)); err == nil {
				t.Fatal("failing fn: no error")
			}
			rows, _ := st.pool.Query(ctx, "SELECT key, n FROM "+st.opts.Schema+".effects ORDER BY key")
			type kv struct {
				K string
				N int
			}
			got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[kv])
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != (kv{"a", 1}) {
				t.Fatalf("effects %v, want a once", got)
			}
			rec, err := e.Get("b")
			if err != nil || rec.Err == nil || rec.Err.Message != "boom" {
				t.Fatalf("b's record: %+v, %v", rec, err)
			}
		})
	}
}

// TestOpenTakesTheEngineOptions: Open takes the engine's settings
// (idemcore.Options, the bbolt engine's too): Retention reaches the state
// machine, and settings that have no meaning are refused with ErrOptions in
// an *idemcore.OpError, opening no engine.
func TestOpenTakesTheEngineOptions(t *testing.T) {
	st := newStore(t, pgtest.Env)
	ctx := context.Background()
	e, err := idempg.Open(ctx, st.pool, &st.opts, &idemcore.Options{Retention: -time.Hour})
	var op *idemcore.OpError
	if !errors.Is(err, idempg.ErrOptions) || !errors.As(err, &op) || op.Op != "open" || e != nil {
		t.Errorf("negative Retention: %v, %v; want ErrOptions in an open OpError, and no engine", e, err)
	}
	e = st.open(t, &idemcore.Options{Retention: time.Hour})
	if got := e.Retention(); got != time.Hour {
		t.Errorf("Retention %v, want 1h", got)
	}
}

// TestPruneHonoursPruneBatch: Prune deletes expired records in statements of
// at most Options.PruneBatch rows, each committing on its own: stopped right
// after its first statement (a panic at prune-after-drop), it has deleted
// exactly PruneBatch records, and the next Prune deletes the rest.
func TestPruneHonoursPruneBatch(t *testing.T) {
	pgtest.DSN(t, pgtest.Env)
	if !testkit.Failpoints(t) {
		return
	}
	st := newStore(t, pgtest.Env)
	st.opts.PruneBatch = 2
	e := st.open(t, &idemcore.Options{Retention: time.Minute})
	ctx := context.Background()
	for i := range 5 {
		if _, err := e.Do(ctx, fmt.Sprintf("k%d", i), nil, func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
	}
	st.offset.Add(int64(time.Hour)) // the database's clock judges
	stop := errors.New("stop after the first batch")
	unset := fault.Set("prune-after-drop", func() error { panic(stop) })
	func() {
		defer func() {
			if v := recover(); v != stop {
				t.Errorf("Prune did not stop at prune-after-drop: %v", v)
			}
		}()
		_, _ = e.Prune(ctx)
	}()
	unset()
	var left int
	if err := st.pool.QueryRow(ctx, "SELECT count(*) FROM "+st.opts.Schema+".idem_records").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 3 {
		t.Fatalf("%d records left after the first batch, want 3 (5 less a PruneBatch of 2)", left)
	}
	if n, err := e.Prune(ctx); err != nil || n != 3 {
		t.Fatalf("the next Prune: %d, %v; want the 3 left", n, err)
	}
}
