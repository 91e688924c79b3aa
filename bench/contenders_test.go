package bench_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/bench"
	"github.com/idemkit/idem/kit/benchkit"
	"github.com/idemkit/idem/kit/benchkit/benchtest"
)

// TestContenders checks the contenders this module adds; benchkit's tests
// check the driver-free ones. PostgreSQL's are skipped without IDEM_TEST_PG
// when run by hand, and fail without it (or without its server) under CI.
func TestContenders(t *testing.T) {
	for _, c := range append(bench.DriverContenders(), bench.OtelContenders()...) {
		t.Run(c.Name, func(t *testing.T) {
			if c.Name == "postgres" || c.Name == "idempg" {
				requirePostgresInCI(t)
			}
			t.Run("dedupe", func(t *testing.T) { benchtest.Dedupe(t, c) })
			t.Run("workloads", func(t *testing.T) { benchtest.Workloads(t, c, benchtest.TinySizes()) })
		})
	}
}

// TestSecondProcessReplay runs the cold replays from a second process, at
// tiny sizes, for the Postgres contenders: the second process answers every
// stored key (for idempg, through Do without running fn, then with the bare
// SELECT), and the row reports what it measured.
func TestSecondProcessReplay(t *testing.T) {
	requirePostgresInCI(t)
	for _, c := range bench.Contenders() {
		w := bench.SecondProcessReplayWorkload(50, 4, benchkit.Load{Ops: 200, Warmup: 10})
		if !w.RunsOn(c.Name) {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			f, err := benchkit.OpenFixture(context.Background(), c, t.TempDir(), w.Fixture, nil)
			if errors.Is(err, benchkit.ErrSkipped) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := f.Close(); err != nil {
					t.Error(err)
				}
			}()
			r, err := w.Run(context.Background(), f, w.Load)
			if err != nil {
				t.Fatal(err)
			}
			if r.Ops != 200 || r.Latency.Count() != 200 || r.Elapsed <= 0 {
				t.Errorf("%s: %d ops, %d latencies in %v; want 200 timed replays", c.Name, r.Ops, r.Latency.Count(), r.Elapsed)
			}
			if _, ok := r.Metric("select-ops/s"); ok != (c.Name == "idempg") {
				t.Errorf("%s: bare SELECT measured beside: %v, want it for idempg only (%+v)", c.Name, ok, r.Metrics)
			}
		})
	}
}

func TestContendersOrder(t *testing.T) {
	var names []string
	for _, c := range bench.Contenders() {
		names = append(names, c.Name)
	}
	want := []string{benchkit.Reference, "bare", benchkit.Fallback, "sqlite-full", "sqlite-normal", "postgres", "idempg"}
	if !slices.Equal(names, want) {
		t.Errorf("contenders %q, want %q", names, want)
	}
}

// requirePostgresInCI fails t when CI is set and IDEM_TEST_PG does not name a
// server that answers: in CI a skipped PostgreSQL row would hide a missing
// server (.ci/run starts one with scripts/postgres.sh).
func requirePostgresInCI(t *testing.T) {
	t.Helper()
	if os.Getenv("CI") == "" {
		return
	}
	dsn := os.Getenv(bench.PostgresEnv)
	if dsn == "" {
		t.Fatalf("CI is set and %s is not: start the server with scripts/postgres.sh start", bench.PostgresEnv)
	}
	d, err := bench.OpenPostgres(context.Background(), dsn)
	if err != nil {
		t.Fatalf("CI is set and %s does not answer: %v", bench.PostgresEnv, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOtelContendersRunOnlyReplay: idemotel's contenders run the replay rows
// and no other; every other contender keeps the rows benchkit gives it.
func TestOtelContendersRunOnlyReplay(t *testing.T) {
	orig := map[string]benchkit.Workload{}
	for _, w := range benchkit.Workloads(benchkit.QuickSizes()) {
		orig[w.Name] = w
	}
	for _, w := range bench.Workloads(benchkit.QuickSizes()) {
		replay := strings.HasPrefix(w.Name, "replay/")
		for _, c := range bench.OtelContenders() {
			if w.RunsOn(c.Name) != replay {
				t.Errorf("%s runs on %s: %v, want %v", w.Name, c.Name, w.RunsOn(c.Name), replay)
			}
		}
		o, ok := orig[w.Name]
		if !ok {
			continue
		}
		for _, c := range bench.Contenders() {
			if w.RunsOn(c.Name) != o.RunsOn(c.Name) {
				t.Errorf("%s runs on %s: %v, benchkit says %v", w.Name, c.Name, w.RunsOn(c.Name), o.RunsOn(c.Name))
			}
		}
	}
}
