// Package pgtest reaches the PostgreSQL server the tests run against: the one
// IDEM_TEST_PG names (scripts/postgres.sh start prints it), or the same server
// through PgBouncer (IDEM_TEST_PGBOUNCER, with --pgbouncer). Without the
// variable a test is skipped with a message when run by hand, and fails when
// CI is set, so that CI never passes by skipping. No mock of PostgreSQL
// exists: every test that needs one uses a real server.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The variables that name the servers.
const (
	// Env holds the DSN of the server, for tests and benchmarks alike.
	Env = "IDEM_TEST_PG"
	// BouncerEnv holds the DSN of the same server through PgBouncer in
	// transaction pooling mode.
	BouncerEnv = "IDEM_TEST_PGBOUNCER"
)

// DSN returns the DSN in the variable env (Env or BouncerEnv). Unset, it
// skips t, or fails it when CI is set.
func DSN(t testing.TB, env string) string {
	t.Helper()
	dsn := os.Getenv(env)
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and %s is not: start the server with scripts/postgres.sh start --pgbouncer", env)
		}
		t.Skipf("%s not set: eval \"$(scripts/postgres.sh start --pgbouncer)\" runs a local server", env)
	}
	return dsn
}

// Pool opens a pool on the server in env (see DSN), closed when t ends. In
// poll-only mode (PgBouncer) the pool sends every statement with
// QueryExecModeExec, as idempg's PollOnly option does.
func Pool(t testing.TB, env string) *pgxpool.Pool {
	t.Helper()
	return PoolWith(t, env, nil)
}

// PoolWith is Pool with configure, if set, applied to the pool's
// configuration before the pool is made.
func PoolWith(t testing.TB, env string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(DSN(t, env))
	if err != nil {
		t.Fatalf("%s: %v", env, err)
	}
	if env == BouncerEnv {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	cfg.MaxConns = 16
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%s: %v", env, err)
	}
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("%s does not answer: %v", env, err)
	}
	return pool
}

// Schema returns the name of a new schema, unique to this test, that does
// not exist yet; it is dropped (with everything in it) when t ends.
func Schema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "idem_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}
