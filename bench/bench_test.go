package bench_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/idemkit/idem/bench"
	"github.com/idemkit/idem/kit/benchkit"
)

// Benchmarks: every workload × contender, named key=value for benchstat, for
// example BenchmarkReplay/keys=1e6/contender=idem/mode=cold/callers=64.
//
//	go test -bench . -timeout 0                 # full sizes (1e6 records)
//	go test -short -bench .                     # quick sizes
//	go test -bench 'First/contender=(idem|postgres)' -count 6 | benchstat -col /contender -
//
// A contender's fixture (its stored records) is made once per benchmark and
// contender, outside the timed runs; b.N operations then run on it. Each run
// reports ops/s and the p50 and p99 latency of one call in µs beside ns/op
// (the wall-clock time per operation over all callers).

// TestMain runs the binary as a second process when the replay workload
// asks for one (bench.ChildMain), else the tests and benchmarks.
func TestMain(m *testing.M) {
	bench.ChildMain()
	os.Exit(m.Run())
}

// sizes are the quick sizes under -short, the full ones otherwise.
func sizes() benchkit.Sizes {
	if testing.Short() {
		return benchkit.QuickSizes()
	}
	return benchkit.FullSizes()
}

// openFixture opens c on spec for the sub-benchmarks of b, and closes it when
// b ends; it skips b when the contender cannot run here.
func openFixture(b *testing.B, c benchkit.Contender, spec benchkit.FixtureSpec) *benchkit.Fixture {
	b.Helper()
	f, err := benchkit.OpenFixture(context.Background(), c, b.TempDir(), spec, nil)
	if errors.Is(err, benchkit.ErrSkipped) {
		b.Skip(err)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	})
	return f
}

// throughput runs b.N operations of w on f as the sub-benchmark name.
func throughput(b *testing.B, name string, f *benchkit.Fixture, w benchkit.Workload) {
	b.Run(name, func(b *testing.B) {
		b.ReportAllocs()
		if w.Bytes > 0 {
			b.SetBytes(int64(w.Bytes))
		}
		b.ResetTimer()
		r, err := w.Run(context.Background(), f, benchkit.Load{Ops: b.N})
		b.StopTimer()
		if errors.Is(err, benchkit.ErrSkipped) {
			b.Skip(err)
		}
		if err != nil {
			b.Fatal(err)
		}
		report(b, r)
	})
}

// oneShot runs a one-shot workload (its own fixture, one measurement) as the
// sub-benchmark name. The testing package calls a benchmark several times with
// growing b.N; the measurement is made on the first call and reported on each.
// ns/op means nothing here and is suppressed.
func oneShot(b *testing.B, name string, c benchkit.Contender, w benchkit.Workload) {
	var (
		r   *benchkit.Result
		err error
	)
	b.Run(name, func(b *testing.B) {
		if r == nil && err == nil {
			f := openFixture(b, c, w.Fixture)
			r, err = w.Run(context.Background(), f, benchkit.Load{})
		}
		if errors.Is(err, benchkit.ErrSkipped) {
			b.Skip(err)
		}
		if err != nil {
			b.Fatal(err)
		}
		report(b, r)
		b.ReportMetric(0, "ns/op")
	})
}

// report adds r's figures to b's.
func report(b *testing.B, r *benchkit.Result) {
	if r.Ops > 0 {
		b.ReportMetric(r.OpsPerSec(), "ops/s")
	}
	if r.Latency != nil && r.Latency.Count() > 0 {
		b.ReportMetric(float64(r.Latency.Quantile(0.5).Nanoseconds())/1e3, "p50-us")
		b.ReportMetric(float64(r.Latency.Quantile(0.99).Nanoseconds())/1e3, "p99-us")
	}
	for _, m := range r.Metrics {
		b.ReportMetric(m.Value, m.Unit)
	}
}

// BenchmarkFirst: first executions of fresh keys, 1 to 256 callers, on a
// store holding Sizes.FirstStored records.
func BenchmarkFirst(b *testing.B) {
	s := sizes()
	for _, c := range bench.Contenders() {
		b.Run("contender="+c.Name, func(b *testing.B) {
			f := openFixture(b, c, benchkit.FixtureSpec{Stored: s.FirstStored})
			for _, n := range s.FirstCallers {
				throughput(b, fmt.Sprintf("callers=%d", n), f, benchkit.FirstWorkload(s.FirstStored, n, s.First))
			}
		})
	}
}

// BenchmarkDoTx: the effect and the record in one commit.
func BenchmarkDoTx(b *testing.B) {
	s := sizes()
	for _, c := range bench.Contenders() {
		b.Run("contender="+c.Name, func(b *testing.B) {
			f := openFixture(b, c, benchkit.FixtureSpec{Stored: s.FirstStored})
			for _, n := range s.DoTxCallers {
				throughput(b, fmt.Sprintf("callers=%d", n), f, benchkit.DoTxWorkload(s.FirstStored, n, s.First))
			}
		})
	}
}

// BenchmarkDoTxSeq: DoTx with the effect row keyed by a sequence number, so
// that each call adds one record at a random place instead of two.
func BenchmarkDoTxSeq(b *testing.B) {
	s := sizes()
	for _, c := range bench.Contenders() {
		b.Run("contender="+c.Name, func(b *testing.B) {
			f := openFixture(b, c, benchkit.FixtureSpec{Stored: s.FirstStored})
			for _, n := range s.DoTxCallers {
				throughput(b, fmt.Sprintf("callers=%d", n), f, benchkit.DoTxSeqWorkload(s.FirstStored, n, s.First))
			}
		})
	}
}

// BenchmarkCeiling: plain bbolt, durable transactions of random-key puts on a
// store of Sizes.FirstStored records: b.N transactions; ops/s is puts per
// second, ceiling-Do/s half of it.
func BenchmarkCeiling(b *testing.B) {
	s := sizes()
	w := benchkit.CeilingWorkload(s.FirstStored, s.CeilingPutsPerTx, s.Ceiling)
	for _, c := range bench.Contenders() {
		if !w.RunsOn(c.Name) {
			continue
		}
		b.Run("contender="+c.Name, func(b *testing.B) {
			f := openFixture(b, c, w.Fixture)
			throughput(b, fmt.Sprintf("puts-per-tx=%d", s.CeilingPutsPerTx), f, w)
		})
	}
}

// BenchmarkReplay: replays of recent and cold keys at each store size.
func BenchmarkReplay(b *testing.B) {
	s := sizes()
	for _, stored := range s.ReplayStored {
		recent := min(s.Recent, stored)
		b.Run("keys="+benchkit.Count(stored), func(b *testing.B) {
			for _, c := range bench.AllContenders() { // with idemotel's (OtelContenders)
				b.Run("contender="+c.Name, func(b *testing.B) {
					f := openFixture(b, c, benchkit.FixtureSpec{Stored: stored, Recent: recent})
					for _, mode := range []benchkit.ReplayMode{benchkit.Recent, benchkit.Cold} {
						b.Run("mode="+string(mode), func(b *testing.B) {
							for _, n := range s.ReplayCallers {
								throughput(b, fmt.Sprintf("callers=%d", n), f, benchkit.ReplayWorkload(stored, recent, mode, n, s.Replay))
							}
						})
					}
				})
			}
		})
	}
}

// BenchmarkReplaySecondProcess: cold replays from a second OS process (this
// test binary again, through TestMain), of the Postgres contenders: the bare
// SELECT for postgres, idempg's Do for idempg (its bare SELECT in the
// select-ops/s metric). ns/op counts the second process's start too; ops/s
// and the latencies are the second process's own.
func BenchmarkReplaySecondProcess(b *testing.B) {
	s := sizes()
	for _, w := range bench.Workloads(s) {
		if !strings.HasPrefix(w.Name, "replay-2nd-process/") {
			continue
		}
		for _, c := range bench.Contenders() {
			if !w.RunsOn(c.Name) {
				continue
			}
			b.Run(strings.TrimPrefix(w.Name, "replay-2nd-process/")+"/contender="+c.Name, func(b *testing.B) {
				f := openFixture(b, c, w.Fixture)
				throughput(b, "run", f, w)
			})
		}
	}
}

// BenchmarkConflict: done keys reused with another fingerprint.
func BenchmarkConflict(b *testing.B) {
	s := sizes()
	stored, recent := s.ConflictStored, min(s.Recent, s.ConflictStored)
	b.Run("keys="+benchkit.Count(stored), func(b *testing.B) {
		for _, c := range bench.Contenders() {
			b.Run("contender="+c.Name, func(b *testing.B) {
				f := openFixture(b, c, benchkit.FixtureSpec{Stored: stored, Recent: recent})
				throughput(b, "callers=1", f, benchkit.ConflictWorkload(stored, recent, 1, s.Conflict))
			})
		}
	})
}

// BenchmarkPrune: pruning the expired records, with writers' latency during
// it (one measurement per contender).
func BenchmarkPrune(b *testing.B) {
	s := sizes()
	w := benchkit.PruneWorkload(s.PruneExpired, s.PruneLive, s.PruneWriters, s.PruneIdle)
	b.Run("expired="+benchkit.Count(s.PruneExpired), func(b *testing.B) {
		for _, c := range bench.Contenders() {
			oneShot(b, "contender="+c.Name, c, w)
		}
	})
}

// BenchmarkMemory: bytes on disk and Go heap per stored record (one
// measurement per contender).
func BenchmarkMemory(b *testing.B) {
	s := sizes()
	w := benchkit.MemoryWorkload(s.MemoryStored, min(s.Recent, s.MemoryStored))
	b.Run("records="+benchkit.Count(s.MemoryStored), func(b *testing.B) {
		for _, c := range bench.Contenders() {
			oneShot(b, "contender="+c.Name, c, w)
		}
	})
}
