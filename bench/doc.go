// Package bench measures idem side by side with the patterns people use
// instead of it: a bare function call, a naive bbolt engine, SQLite
// (modernc.org/sqlite, WAL, synchronous=FULL and NORMAL) and PostgreSQL (pgx).
//
// It is a module of its own, so that users of the engine never download
// database drivers.
//
// # Pieces
//
// Every contender is a [Deduper]; optional interfaces add what a workload
// needs: [TxDeduper] (the DoTx shape: effect and record in one commit),
// [Preloader] (stores records in bulk, bypassing Do), [Pruner] and [Sizer].
// [Contenders] lists them all.
//
// A [Workload] runs against a [Fixture]: a contender opened in a fresh
// directory with records already stored. Workloads that need the same stored
// state share a fixture ([FixtureSpec]), so that 1e6 records are loaded once
// per contender, not once per workload. [RunOps] times operations run by
// concurrent callers and keeps their latencies in a [Histogram].
//
// # Running
//
//	go test ./...                           # unit tests, small sizes, seconds
//	go test -bench . -timeout 0             # every workload × contender
//	go test -short -bench .                 # the same with quick sizes
//	go run ./compare                        # side by side, a markdown table
//	go run ./compare --quick --only 'first' # a smoke test of one workload
//
// PostgreSQL rows need a server: scripts/postgres.sh start prints the
// IDEM_BENCH_PG value to export. Without it they say "skipped".
//
// Measure within one run: the disk of a shared machine drifts by tens of
// percent over minutes, so only figures from the same run compare.
package bench
