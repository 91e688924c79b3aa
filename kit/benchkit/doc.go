// Package benchkit measures idem side by side with the patterns people use
// instead of it. It holds the harness and the contenders that need no
// database driver: a bare function call, a naive bbolt engine, and idem. The
// idem tool's bench command runs them; the bench module (its own Go module, so
// that users of the engine never download database drivers) adds SQLite and
// PostgreSQL and runs them all, in its compare command and its Go benchmarks.
//
// # Pieces
//
// Every contender is a [Deduper]; optional interfaces add what a workload
// needs: [TxDeduper] (the DoTx shape: effect and record in one commit),
// [Preloader] (stores records in bulk, bypassing Do), [Pruner] and [Sizer].
// [Contenders] lists the driver-free ones; a [Contender] from elsewhere joins
// a run by being in the list given to [NewPlan].
//
// A [Workload] runs against a [Fixture]: a contender opened in a fresh
// directory with records already stored. Workloads that need the same stored
// state share a fixture ([FixtureSpec]), so that 1e6 records are loaded once
// per contender, not once per workload. [RunOps] times operations run by
// concurrent callers and keeps their latencies in a [Histogram]. The write
// workloads also count the bytes written at the block device holding the
// fixture (from /sys, since /proc/self/io overstates writes on some kernels),
// and the replays the heap allocations, per call. [CeilingWorkload] measures
// plain bbolt on the same disk: the ceiling of an engine that writes two
// records per call, of which the report gives idem's first executions as a
// fraction.
//
// A [Plan] is the workload × contender rows of one run, grouped by fixture;
// [Plan.Run] measures them with a progress bar and returns the [Row]s, which
// [SetRatios], [WriteMarkdown] and [WriteJSON] turn into the side-by-side table.
// Package benchtest checks that a contender dedupes and runs every workload.
//
// Measure within one run: the disk of a shared machine drifts by tens of
// percent over minutes, so only figures from the same run compare.
package benchkit
