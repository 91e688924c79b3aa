package idempg

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestApplyFailedVersionRollsBack applies a version whose SQL fails halfway:
// neither its first statement nor its row in idem_migrations remains.
func TestApplyFailedVersionRollsBack(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.Env)
	s, err := resolve(&Options{Schema: pgtest.Schema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := Migrate(ctx, pool, &s.Options); err != nil {
		t.Fatal(err)
	}
	bad := migration{version: SchemaVersion + 1, name: "bad", sql: `CREATE TABLE {schema}.half (x int); SELECT 1/0;`}
	_, err = apply(ctx, pool, s, bad)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "22012" {
		t.Fatalf("apply of a failing version: %v, want division_by_zero", err)
	}
	var half, row bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.Schema+".half").Scan(&half); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, s.sql(`SELECT EXISTS (SELECT 1 FROM {schema}.idem_migrations WHERE version = $1)`), bad.version).Scan(&row); err != nil {
		t.Fatal(err)
	}
	if half || row {
		t.Errorf("after the failed version: table %v, version row %v; want neither", half, row)
	}
	if err := checkVersion(ctx, pool, s); err != nil {
		t.Errorf("checkVersion after the failed version: %v", err)
	}
}
