package bench

import (
	"context"
	"os"

	"github.com/idemkit/idem/kit/benchkit"
)

// Contenders lists every contender: benchkit's driver-free ones (idem first,
// the reference of the ratios; bare; naive-bbolt), then those that need a
// database driver: SQLite with synchronous FULL and NORMAL, PostgreSQL's
// naive pattern, and idem's Postgres backend (idempg) beside it. The
// contenders of OtelContenders, which run only the replay rows, are not
// among them: compare adds them (AllContenders).
func Contenders() []benchkit.Contender {
	return append(benchkit.Contenders(), DriverContenders()...)
}

// AllContenders is Contenders and then OtelContenders: compare's rows.
func AllContenders() []benchkit.Contender {
	return append(Contenders(), OtelContenders()...)
}

// DriverContenders lists the contenders this module adds to benchkit's.
func DriverContenders() []benchkit.Contender {
	return []benchkit.Contender{
		{Name: "sqlite-full", Open: func(ctx context.Context, dir string) (benchkit.Deduper, error) {
			return OpenSQLite(ctx, dir, SyncFull)
		}},
		{Name: "sqlite-normal", Open: func(ctx context.Context, dir string) (benchkit.Deduper, error) {
			return OpenSQLite(ctx, dir, SyncNormal)
		}},
		{Name: "postgres", Open: func(ctx context.Context, _ string) (benchkit.Deduper, error) {
			return OpenPostgres(ctx, os.Getenv(PostgresEnv))
		}},
		{Name: "idempg", Open: func(ctx context.Context, _ string) (benchkit.Deduper, error) {
			return OpenIdemPG(ctx, os.Getenv(PostgresEnv))
		}},
	}
}
