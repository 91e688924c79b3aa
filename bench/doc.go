// Package bench measures idem side by side with the patterns people use
// instead of it, SQLite (modernc.org/sqlite, WAL, synchronous=FULL and
// NORMAL) and PostgreSQL (pgx) among them, beside the driver-free contenders
// of the idem module's kit/benchkit (a bare call, a naive bbolt engine,
// idem), whose harness, workloads and report it uses.
//
// It is a module of its own, so that users of the engine never download
// database drivers; `idem bench` runs the driver-free rows without it.
//
// # Running
//
//	go test ./...                           # unit tests, small sizes, seconds
//	go test -bench . -timeout 0             # every workload × contender
//	go test -short -bench .                 # the same with quick sizes
//	go run ./compare                        # side by side, a markdown table
//	go run ./compare --quick --only 'first' # a smoke test of one workload
//
// PostgreSQL rows need a server: ../scripts/postgres.sh start prints the
// IDEM_TEST_PG value to export. Without it they say "skipped".
//
// Measure within one run: the disk of a shared machine drifts by tens of
// percent over minutes, so only figures from the same run compare.
package bench
