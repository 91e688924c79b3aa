package idempg

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The schema's migrations: migrations/NNNN_name.sql, applied in version
// order, each in a transaction of its own. {schema} in them is the quoted
// Options.Schema.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// A migration is one version of the schema.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations are the embedded migrations in version order.
var migrations = mustLoadMigrations()

// SchemaVersion is the schema version this package reads and writes: the
// highest version Migrate applies.
var SchemaVersion = migrations[len(migrations)-1].version

// ErrSchemaVersion is wrapped by the error of opening a backend on a schema
// whose version is not SchemaVersion: older (run Migrate, or idem migrate
// --pg DSN), or newer (this build is older than the schema; never misread).
var ErrSchemaVersion = errors.New("schema version")

func mustLoadMigrations() []migration {
	ms, err := loadMigrations(migrationFiles)
	if err != nil {
		panic(err)
	}
	return ms
}

// loadMigrations reads fsys's migrations/NNNN_name.sql in version order.
// Versions increase; a gap is allowed (a version numbered on a branch that
// merges later): Migrate applies every version not applied yet, whatever
// the versions above it.
func loadMigrations(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "migrations/"), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || len(num) != 4 || name == "" || v < 1 || (len(ms) > 0 && v <= ms[len(ms)-1].version) {
			return nil, fmt.Errorf("idempg: migration file %s: want NNNN_name.sql, its version above the one before", n)
		}
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: name, sql: string(b)})
	}
	if len(ms) == 0 {
		return nil, errors.New("idempg: no migrations")
	}
	return ms, nil
}

// migrationsTable holds the applied versions, one row each.
const migrationsTable = `CREATE TABLE IF NOT EXISTS {schema}.idem_migrations (
	version    integer PRIMARY KEY,
	name       text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`

// Migrate brings the schema named by opts.Schema (nil: DefaultSchema) in the
// database pool reaches up to SchemaVersion, creating the schema and its
// tables if needed, and returns the versions it applied, in order (none if
// the schema was up to date). It is idempotent, and safe to run from several
// processes at once without advisory locks (so it also runs where they are
// stubs): each version is applied in a transaction that first inserts its
// row into idem_migrations; a concurrent Migrate waits on that row and then
// skips the version. A failed version rolls back whole and is returned as an
// error naming it; the versions before it stay applied. A schema newer than
// this build is refused with ErrSchemaVersion. Only opts.Schema and
// opts.PollOnly matter here.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts *Options) ([]int, error) {
	s, err := resolve(opts)
	if err != nil {
		return nil, fmt.Errorf("idempg: migrate: %w", err)
	}
	// CREATE … IF NOT EXISTS is not safe against itself: two sessions
	// creating one object at once may fail on a unique index of the
	// catalog. Then the other has created it, and one more try sees it.
	for try := 0; ; try++ {
		_, err = pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+s.schema+"; "+s.sql(migrationsTable))
		if err == nil || try == 2 || !isCatalogRace(err) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("idempg: migrate: schema %s: %w", s.Schema, err)
	}
	applied, err := appliedVersions(ctx, pool, s)
	if err != nil {
		return nil, fmt.Errorf("idempg: migrate: %w", err)
	}
	if n := len(applied); n > 0 && applied[n-1] > SchemaVersion {
		return nil, fmt.Errorf("idempg: migrate: %w: schema %s is at version %d, newer than this build's %d", ErrSchemaVersion, s.Schema, applied[n-1], SchemaVersion)
	}
	var did []int
	for _, m := range migrations {
		if slices.Contains(applied, m.version) {
			continue
		}
		ok, err := apply(ctx, pool, s, m)
		if err != nil {
			return did, fmt.Errorf("idempg: migrate: version %d (%s): %w", m.version, m.name, err)
		}
		if ok {
			did = append(did, m.version)
		}
	}
	return did, nil
}

// apply applies m in a transaction of its own, unless another Migrate has
// (ok false).
func apply(ctx context.Context, pool *pgxpool.Pool, s *settings, m migration) (ok bool, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// A migration waits for the locks it needs as long as the server's
		// own setting says, also on a pool whose sessions have the engine's
		// lock_timeout (AfterConnect): another process's Migrate may hold
		// them for as long as its version takes.
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout TO DEFAULT`); err != nil {
			return err
		}
		// The row lock on the version's primary key is the only lock taken:
		// a concurrent Migrate blocks here until this one commits (and then
		// inserts nothing) or rolls back (and then applies the version).
		tag, err := tx.Exec(ctx, s.sql(`INSERT INTO {schema}.idem_migrations (version, name) VALUES ($1::integer, $2::text) ON CONFLICT (version) DO NOTHING`), s.args(m.version, m.name)...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		ok = true
		_, err = tx.Exec(ctx, s.sql(m.sql))
		return err
	})
	if err != nil {
		return false, err
	}
	return ok, nil
}

// appliedVersions returns the versions in s's idem_migrations, ascending; none
// if the table does not exist.
func appliedVersions(ctx context.Context, pool *pgxpool.Pool, s *settings) ([]int, error) {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1::text) IS NOT NULL`, s.args(s.schema+".idem_migrations")...).Scan(&exists); err != nil {
		return nil, err
	}
	if !exists {
		return nil, nil
	}
	rows, err := pool.Query(ctx, s.sql(`SELECT version FROM {schema}.idem_migrations ORDER BY version`), s.args()...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// checkVersion returns an error wrapping ErrSchemaVersion unless s's schema is
// at SchemaVersion.
func checkVersion(ctx context.Context, pool *pgxpool.Pool, s *settings) error {
	applied, err := appliedVersions(ctx, pool, s)
	if err != nil {
		return err
	}
	have := 0
	if n := len(applied); n > 0 {
		have = applied[n-1]
	}
	switch {
	case have < SchemaVersion:
		return fmt.Errorf("%w: schema %s is at version %d, this build needs %d: run idempg.Migrate or idem migrate --pg DSN", ErrSchemaVersion, s.Schema, have, SchemaVersion)
	case have > SchemaVersion:
		return fmt.Errorf("%w: schema %s is at version %d, newer than this build's %d", ErrSchemaVersion, s.Schema, have, SchemaVersion)
	}
	return nil
}

// isCatalogRace reports whether err is what a concurrent CREATE … IF NOT
// EXISTS of the same object gives: a unique violation in the catalog, or the
// object existing after all.
func isCatalogRace(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "23505", "42P06", "42P07": // unique_violation, duplicate_schema, duplicate_table
		return true
	}
	return false
}
