package bench_test

import (
	"slices"
	"testing"

	"github.com/idemkit/idem/bench"
	"github.com/idemkit/idem/kit/benchkit"
	"github.com/idemkit/idem/kit/benchkit/benchtest"
)

// TestContenders checks the contenders this module adds; benchkit's tests
// check the driver-free ones. PostgreSQL's are skipped without IDEM_BENCH_PG.
func TestContenders(t *testing.T) {
	for _, c := range bench.DriverContenders() {
		t.Run(c.Name, func(t *testing.T) {
			t.Run("dedupe", func(t *testing.T) { benchtest.Dedupe(t, c) })
			t.Run("workloads", func(t *testing.T) { benchtest.Workloads(t, c, benchtest.TinySizes()) })
		})
	}
}

func TestContendersOrder(t *testing.T) {
	var names []string
	for _, c := range bench.Contenders() {
		names = append(names, c.Name)
	}
	want := []string{benchkit.Reference, "bare", benchkit.Fallback, "sqlite-full", "sqlite-normal", "postgres"}
	if !slices.Equal(names, want) {
		t.Errorf("contenders %q, want %q", names, want)
	}
}
