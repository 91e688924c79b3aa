package idempg_test

// The conformance suite (idemtest) run on the Postgres backend: against the
// server, and once more through PgBouncer in transaction pooling mode with
// PollOnly.

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testkit"
)

// pgHarness opens engines on schemas of the server env names. Its stores
// are schemas. The suite's clock seam (Options.Now, a fake clock it stops
// and moves) drives the database's clock, which judges every time on
// Postgres: each engine's backend reads its Options.Now wherever it would
// read the database's clock for the times of records and messages
// (idempg.SetClock), so that the suite's retention and outbox cells run
// here as they run on bbolt, to the nanosecond. Leases keep the database's
// clock, with a per-store offset that ExpireOwners moves (the engines of
// this process add it to now()).
type pgHarness struct {
	env string
	// session: the pool's connections get the engine's settings from
	// idempg.AfterConnect, and Do's statements carry none of their own.
	session bool

	once sync.Once
	pool *pgxpool.Pool
	err  error

	mu      sync.Mutex
	offsets map[string]*atomic.Int64
}

// suiteLease is the lease of the suite's engines: long enough that no
// claim of a live call lapses while the suite runs it.
const suiteLease = 30 * time.Second

func (h *pgHarness) connect(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := pgtest.DSN(t, h.env)
	h.once.Do(func() {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			h.err = err
			return
		}
		if h.env == pgtest.BouncerEnv {
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		}
		cfg.MaxConns = 32
		if h.session {
			if cfg.AfterConnect, h.err = idempg.AfterConnect(&idempg.Options{Lease: suiteLease}); h.err != nil {
				return
			}
		}
		h.pool, h.err = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if h.err != nil {
		t.Fatalf("%s: %v", h.env, h.err)
	}
	return h.pool
}

func (h *pgHarness) offset(store string) *atomic.Int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.offsets == nil {
		h.offsets = map[string]*atomic.Int64{}
	}
	o := h.offsets[store]
	if o == nil {
		o = new(atomic.Int64)
		h.offsets[store] = o
	}
	return o
}

// options are the backend settings of an engine on store whose suite clock
// is now (nil for Migrate, which reads no clock).
func (h *pgHarness) options(store string, now func() time.Time) *idempg.Options {
	o := &idempg.Options{Schema: store, PollOnly: h.env == pgtest.BouncerEnv, Lease: suiteLease, PollInterval: 10 * time.Millisecond}
	off := h.offset(store)
	idempg.SetClockOffset(o, func() time.Duration { return time.Duration(off.Load()) })
	if now != nil {
		idempg.SetClock(o, now)
	}
	return o
}

func (h *pgHarness) harness() idemtest.Harness[pgx.Tx] {
	return idemtest.Harness[pgx.Tx]{
		New: func(t testing.TB) string {
			pool := h.connect(t)
			schema := pgtest.Schema(t, pool)
			if _, err := idempg.Migrate(context.Background(), pool, h.options(schema, nil)); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(context.Background(), "CREATE TABLE "+schema+".effects (key text PRIMARY KEY, value text NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			return schema
		},
		Open: func(t testing.TB, store string, o idemtest.Options) (idemtest.Engine[pgx.Tx], error) {
			return idempg.Open(context.Background(), h.connect(t), h.options(store, o.Now), o.Engine())
		},
		OpenWrapped: func(t testing.TB, store string, o idemtest.Options, wrap func(idemcore.Backend[pgx.Tx]) idemcore.Backend[pgx.Tx]) (idemtest.Engine[pgx.Tx], error) {
			return idempg.OpenWrapped(context.Background(), h.connect(t), h.options(store, o.Now), o.Engine(), wrap)
		},
		PutEffect: func(tx pgx.Tx, key, value string) error {
			ctx := context.Background()
			var schema string
			if err := tx.QueryRow(ctx, "SELECT current_setting('idem.schema')").Scan(&schema); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema}.Sanitize()+".effects (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", key, value)
			return err
		},
		Effects: func(e idemtest.Engine[pgx.Tx]) (map[string]string, error) {
			rows, err := h.pool.Query(context.Background(), "SELECT key, value FROM "+pgx.Identifier{e.(*idempg.Engine).Schema()}.Sanitize()+".effects")
			if err != nil {
				return nil, err
			}
			m := map[string]string{}
			var k, v string
			_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error { m[k] = v; return nil })
			return m, err
		},
		Enqueue:              func(tx pgx.Tx, topic string, payload []byte) error { return idempg.Enqueue(tx, topic, payload) },
		Hook:                 idemtest.CoreHook,
		OwnedAcrossProcesses: true,
		ExpireOwners: func(t testing.TB, store string) {
			h.offset(store).Add(int64(suiteLease + time.Second))
		},
	}
}

var (
	direct  = &pgHarness{env: pgtest.Env}
	bouncer = &pgHarness{env: pgtest.BouncerEnv}
	session = &pgHarness{env: pgtest.Env, session: true}
)

func TestConformance(t *testing.T) {
	pgtest.DSN(t, pgtest.Env)
	// The suite's hooks are failpoints: it runs in the build with them.
	if !testkit.Failpoints(t) {
		return
	}
	idemtest.Run(t, direct.harness())
}

// TestConformanceSession runs the suite on a pool whose connections have
// the engine's lock_timeout from idempg.AfterConnect, so that Do's claims
// and completions carry no setting of their own.
func TestConformanceSession(t *testing.T) {
	pgtest.DSN(t, pgtest.Env)
	if !testkit.Failpoints(t) {
		return
	}
	idemtest.Run(t, session.harness())
}

// TestConformancePgBouncer runs the suite through PgBouncer in transaction
// pooling mode, the backend in PollOnly mode.
func TestConformancePgBouncer(t *testing.T) {
	pgtest.DSN(t, pgtest.BouncerEnv)
	if !testkit.Failpoints(t) {
		return
	}
	idemtest.Run(t, bouncer.harness())
}

// The Postgres engine offers every engine's methods, as the bbolt engine does.
var _ idemtest.Engine[pgx.Tx] = (*idempg.Engine)(nil)

// backend returns the backend of an idle engine on a new schema, for the
// seam suite.
func (h *pgHarness) backend(t testing.TB) idemcore.Backend[pgx.Tx] {
	pool := h.connect(t)
	schema := pgtest.Schema(t, pool)
	if _, err := idempg.Migrate(context.Background(), pool, h.options(schema, nil)); err != nil {
		t.Fatal(err)
	}
	return idemtest.EngineBackend(t, func(wrap func(idemcore.Backend[pgx.Tx]) idemcore.Backend[pgx.Tx]) (idemtest.Engine[pgx.Tx], error) {
		return idempg.OpenWrapped(context.Background(), pool, h.options(schema, nil), &idemcore.Options{PruneInterval: -1}, wrap)
	})
}

// TestBackend runs the seam suite (idemtest.RunBackend) on the Postgres
// backend, against the server and through PgBouncer.
func TestBackend(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		pgtest.DSN(t, pgtest.Env)
		idemtest.RunBackend(t, direct.backend)
	})
	t.Run("pgbouncer", func(t *testing.T) {
		pgtest.DSN(t, pgtest.BouncerEnv)
		idemtest.RunBackend(t, bouncer.backend)
	})
	t.Run("session", func(t *testing.T) {
		pgtest.DSN(t, pgtest.Env)
		idemtest.RunBackend(t, session.backend)
	})
}
