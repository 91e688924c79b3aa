package idempg_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

func TestMigrate(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		t.Run(env, func(t *testing.T) {
			pool := pgtest.Pool(t, env)
			opts := &idempg.Options{Schema: pgtest.Schema(t, pool), PollOnly: env == pgtest.BouncerEnv}
			ctx := context.Background()

			did, err := idempg.Migrate(ctx, pool, opts)
			if err != nil {
				t.Fatal(err)
			}
			if want := versionsUpTo(idempg.SchemaVersion); !slices.Equal(did, want) {
				t.Fatalf("first Migrate applied %v, want %v", did, want)
			}
			did, err = idempg.Migrate(ctx, pool, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(did) != 0 {
				t.Fatalf("second Migrate applied %v, want none", did)
			}
			if got := appliedRows(t, pool, opts.Schema); !slices.Equal(got, versionsUpTo(idempg.SchemaVersion)) {
				t.Fatalf("idem_migrations holds %v", got)
			}
			for _, table := range []string{"idem_records", "idem_outbox", "idem_dead_letters"} {
				var n int
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+opts.Schema+"."+table).Scan(&n); err != nil {
					t.Errorf("%s: %v", table, err)
				}
			}
		})
	}
}

// TestMigrateIndexes checks that key lookup, expiry, leases and the heads of
// ordering keys each have an index.
func TestMigrateIndexes(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.Env)
	opts := &idempg.Options{Schema: pgtest.Schema(t, pool)}
	ctx := context.Background()
	if _, err := idempg.Migrate(ctx, pool, opts); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT tablename || ': ' || regexp_replace(indexdef, '^.* USING ', '') FROM pg_indexes WHERE schemaname = $1 ORDER BY 1`, opts.Schema)
	if err != nil {
		t.Fatal(err)
	}
	defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"idem_records: btree (key)",
		"idem_records: btree (expires_ns) WHERE (expires_ns > 0)",
		"idem_records: btree (lease_until) WHERE (state = 1)",
		"idem_outbox: btree (ordering_key, seq)",
		"idem_dead_letters: btree (ordering_key, seq)",
		"idem_dead_letters: btree (expires_ns)",
	} {
		if !slices.Contains(defs, want) {
			t.Errorf("no index %q among %q", want, defs)
		}
	}
}

// TestMigrateConcurrently runs Migrate from several sessions at once: each
// version is applied exactly once, every call succeeds, and no advisory lock
// is taken.
func TestMigrateConcurrently(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.Env)
	opts := &idempg.Options{Schema: pgtest.Schema(t, pool)}
	ctx := context.Background()
	const n = 8
	var wg sync.WaitGroup
	dids := make([][]int, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { dids[i], errs[i] = idempg.Migrate(ctx, pool, opts) })
	}
	wg.Wait()
	counts := map[int]int{}
	for i := range n {
		if errs[i] != nil {
			t.Errorf("Migrate %d: %v", i, errs[i])
		}
		for _, v := range dids[i] {
			counts[v]++
		}
	}
	for _, v := range versionsUpTo(idempg.SchemaVersion) {
		if counts[v] != 1 {
			t.Errorf("version %d applied %d times, want once", v, counts[v])
		}
	}
	var locks int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&locks); err != nil {
		t.Fatal(err)
	}
	if locks != 0 {
		t.Errorf("%d advisory locks held after Migrate", locks)
	}
}

func TestMigrateRefusesNewerSchema(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.Env)
	opts := &idempg.Options{Schema: pgtest.Schema(t, pool)}
	ctx := context.Background()
	if _, err := idempg.Migrate(ctx, pool, opts); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+opts.Schema+".idem_migrations (version, name) VALUES (999, 'future')"); err != nil {
		t.Fatal(err)
	}
	did, err := idempg.Migrate(ctx, pool, opts)
	if !errors.Is(err, idempg.ErrSchemaVersion) {
		t.Fatalf("Migrate on a newer schema: %v, want ErrSchemaVersion", err)
	}
	if len(did) != 0 {
		t.Errorf("applied %v on a newer schema", did)
	}
}

func TestMigrateBadSchemaName(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.Env)
	ctx := context.Background()
	for _, name := range []string{"Idem", "idem-x", `x"; DROP TABLE y; --`, "1idem", "ä"} {
		_, err := idempg.Migrate(ctx, pool, &idempg.Options{Schema: name})
		if !errors.Is(err, idempg.ErrOptions) {
			t.Errorf("schema %q: %v, want ErrOptions", name, err)
		}
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists {
			t.Errorf("schema %q was created", name)
		}
	}
}

// versionsUpTo is the build's migration versions up to n (they may have
// gaps).
func versionsUpTo(n int) []int {
	var vs []int
	for _, v := range idempg.MigrationVersions() {
		if v <= n {
			vs = append(vs, v)
		}
	}
	return vs
}

func appliedRows(t *testing.T, pool *pgxpool.Pool, schema string) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT version FROM "+schema+".idem_migrations ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return vs
}
