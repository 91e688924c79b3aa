package bench_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/bench"
)

func TestKey(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := make(map[string]bool)
	for i := range 100_000 {
		k := bench.Key(i)
		if len(k) != bench.KeySize || !uuid.MatchString(k) {
			t.Fatalf("Key(%d) = %q: not a %d-byte UUID", i, k, bench.KeySize)
		}
		if seen[k] {
			t.Fatalf("Key(%d) = %q: seen before", i, k)
		}
		seen[k] = true
	}
	if bench.Key(7) != bench.Key(7) {
		t.Error("Key is not deterministic")
	}
}

func TestFingerprint(t *testing.T) {
	a, b := bench.Fingerprint(3), bench.OtherFingerprint(3)
	if len(a) != bench.FingerprintSize || len(b) != bench.FingerprintSize {
		t.Fatalf("fingerprint sizes %d, %d; want %d", len(a), len(b), bench.FingerprintSize)
	}
	if bytes.Equal(a, b) || !bytes.Equal(a, bench.Fingerprint(3)) || bytes.Equal(a, bench.Fingerprint(4)) {
		t.Error("fingerprints must be deterministic, and differ across keys and from OtherFingerprint")
	}
}

func TestCount(t *testing.T) {
	for n, want := range map[int]string{1000: "1e3", 10_000: "1e4", 100_000: "1e5", 1_000_000: "1e6", 2000: "2000", 64: "64", 10: "10", 0: "0"} {
		if got := bench.Count(n); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestHistogram(t *testing.T) {
	var h, a, b bench.Histogram
	if h.Quantile(0.5) != 0 || h.Count() != 0 {
		t.Fatal("an empty histogram must answer zero")
	}
	// 1 µs … 100 ms, uniformly on a log scale, split over two histograms.
	const n = 10_000
	vals := make([]time.Duration, n)
	for i := range vals {
		vals[i] = time.Duration(1000 * math.Pow(1e5, float64(i)/(n-1)))
		if i%2 == 0 {
			a.Record(vals[i])
		} else {
			b.Record(vals[i])
		}
	}
	h.Merge(&a)
	h.Merge(&b)
	if h.Count() != n || h.Max() != vals[n-1] {
		t.Fatalf("count %d, max %v; want %d, %v", h.Count(), h.Max(), n, vals[n-1])
	}
	for _, q := range []float64{0, 0.01, 0.5, 0.9, 0.99, 0.999, 1} {
		want := vals[max(int(math.Ceil(q*n))-1, 0)]
		got := h.Quantile(q)
		if rel := math.Abs(float64(got-want)) / float64(want); rel > 1.0/64 {
			t.Errorf("Quantile(%v) = %v, want %v (off by %.1f%%)", q, got, want, 100*rel)
		}
	}
	var small bench.Histogram
	small.Record(3)
	small.Record(-5) // counts as zero
	if small.Quantile(1) != 3 || small.Quantile(0.5) != 0 {
		t.Errorf("small values must be exact: got %v, %v", small.Quantile(0.5), small.Quantile(1))
	}
}

func TestRunOps(t *testing.T) {
	ctx := context.Background()
	t.Run("each operation once", func(t *testing.T) {
		var seen [1100]atomic.Int32
		r, err := bench.RunOps(ctx, 8, bench.Load{Ops: 1000, Warmup: 100}, func(_ context.Context, i int) error {
			seen[i].Add(1)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if r.Ops != 1000 || r.Latency.Count() != 1000 || r.OpsPerSec() <= 0 {
			t.Errorf("ops %d, latencies %d, ops/s %v; want 1000, 1000, > 0", r.Ops, r.Latency.Count(), r.OpsPerSec())
		}
		for i := range seen {
			if seen[i].Load() != 1 {
				t.Fatalf("operation %d ran %d times", i, seen[i].Load())
			}
		}
	})
	t.Run("first error stops", func(t *testing.T) {
		boom := errors.New("boom")
		var ran atomic.Int32
		_, err := bench.RunOps(ctx, 4, bench.Load{Ops: 1_000_000}, func(_ context.Context, i int) error {
			ran.Add(1)
			if i == 10 {
				return boom
			}
			return nil
		})
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "operation 10") {
			t.Errorf("err = %v, want boom at operation 10", err)
		}
		if ran.Load() > 1000 {
			t.Errorf("%d operations ran after the error", ran.Load())
		}
	})
	t.Run("max duration", func(t *testing.T) {
		r, err := bench.RunOps(ctx, 2, bench.Load{Ops: 1 << 30, Max: 20 * time.Millisecond}, func(context.Context, int) error {
			time.Sleep(time.Millisecond)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if r.Elapsed > time.Second || r.Ops == 0 {
			t.Errorf("ran %d ops in %v; want a stop after about 20ms", r.Ops, r.Elapsed)
		}
	})
}

// openContender opens c in a temporary directory, skipping the test when the
// contender cannot run here (PostgreSQL without a server).
func openContender(t *testing.T, c bench.Contender) bench.Deduper {
	t.Helper()
	d, err := c.Open(context.Background(), t.TempDir())
	if errors.Is(err, bench.ErrSkipped) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

// counter is an fn that counts its runs.
type counter struct{ n atomic.Int32 }

func (c *counter) fn(context.Context) ([]byte, error) {
	c.n.Add(1)
	return bench.Response(), nil
}

func TestContendersDedupe(t *testing.T) {
	ctx := context.Background()
	for _, c := range bench.Contenders() {
		t.Run(c.Name, func(t *testing.T) {
			d := openContender(t, c)
			if d.Name() != c.Name {
				t.Errorf("Name() = %q, want %q", d.Name(), c.Name)
			}
			if c.Name == "bare" {
				var calls counter
				for range 2 {
					if _, replayed, err := d.Do(ctx, bench.Key(1), bench.Fingerprint(1), calls.fn); err != nil || replayed {
						t.Fatalf("bare: replayed %v, err %v", replayed, err)
					}
				}
				if calls.n.Load() != 2 {
					t.Errorf("bare ran fn %d times, want 2", calls.n.Load())
				}
				return
			}

			t.Run("fn runs once", func(t *testing.T) {
				var calls counter
				for i := range 3 {
					resp, replayed, err := d.Do(ctx, bench.Key(1), bench.Fingerprint(1), calls.fn)
					if err != nil || replayed != (i > 0) || !bytes.Equal(resp, bench.Response()) {
						t.Fatalf("call %d: replayed %v, %d bytes, err %v", i, replayed, len(resp), err)
					}
				}
				if calls.n.Load() != 1 {
					t.Errorf("fn ran %d times, want 1", calls.n.Load())
				}
			})

			t.Run("conflict refused", func(t *testing.T) {
				var calls counter
				_, _, err := d.Do(ctx, bench.Key(1), bench.OtherFingerprint(1), calls.fn)
				if !errors.Is(err, bench.ErrConflict) || calls.n.Load() != 0 {
					t.Errorf("err %v, fn ran %d times; want ErrConflict and no run", err, calls.n.Load())
				}
			})

			t.Run("concurrent duplicates", func(t *testing.T) {
				var (
					calls counter
					wg    sync.WaitGroup
				)
				for range 16 {
					wg.Go(func() {
						// The naive patterns answer a running key with
						// ErrInProgress (HTTP 409); idem waits.
						_, _, err := d.Do(ctx, bench.Key(2), bench.Fingerprint(2), func(ctx context.Context) ([]byte, error) {
							time.Sleep(5 * time.Millisecond)
							return calls.fn(ctx)
						})
						if err != nil && !errors.Is(err, bench.ErrInProgress) {
							t.Error(err)
						}
					})
				}
				wg.Wait()
				if calls.n.Load() != 1 {
					t.Errorf("fn ran %d times, want 1", calls.n.Load())
				}
			})

			t.Run("DoTx", func(t *testing.T) {
				td, ok := d.(bench.TxDeduper)
				if !ok {
					t.Skip("no DoTx")
				}
				var calls atomic.Int32
				fn := func(context.Context) (bench.Effect, []byte, error) {
					calls.Add(1)
					return bench.Effect{Key: []byte(bench.Key(3)), Value: []byte("effect")}, bench.Response(), nil
				}
				for i := range 2 {
					resp, replayed, err := td.DoTx(ctx, bench.Key(3), bench.Fingerprint(3), fn)
					if err != nil || replayed != (i > 0) || !bytes.Equal(resp, bench.Response()) {
						t.Fatalf("call %d: replayed %v, %d bytes, err %v", i, replayed, len(resp), err)
					}
				}
				if calls.Load() != 1 {
					t.Errorf("fn ran %d times, want 1", calls.Load())
				}
			})

			t.Run("preload and prune", func(t *testing.T) {
				p, ok := d.(bench.Preloader)
				if !ok {
					t.Skip("no Preload")
				}
				now := time.Now()
				if err := p.Preload(ctx, bench.RecordSet{First: 100, N: 50, Completed: now}); err != nil {
					t.Fatal(err)
				}
				if err := p.Preload(ctx, bench.RecordSet{First: 200, N: 30, Completed: now.Add(-3 * bench.Retention)}); err != nil {
					t.Fatal(err)
				}
				var calls counter
				if _, replayed, err := d.Do(ctx, bench.Key(120), bench.Fingerprint(120), calls.fn); err != nil || !replayed {
					t.Errorf("a preloaded key: replayed %v, err %v", replayed, err)
				}
				pr, ok := d.(bench.Pruner)
				if !ok {
					t.Skip("no Prune")
				}
				n, err := pr.Prune(ctx)
				if err != nil || n < 30 {
					t.Errorf("Prune = %d, %v; want at least the 30 expired records", n, err)
				}
				if _, replayed, err := d.Do(ctx, bench.Key(149), bench.Fingerprint(149), calls.fn); err != nil || !replayed {
					t.Errorf("a live key after the prune: replayed %v, err %v", replayed, err)
				}
				if _, replayed, err := d.Do(ctx, bench.Key(210), bench.Fingerprint(210), calls.fn); err != nil || replayed {
					t.Errorf("an expired key after the prune: replayed %v, err %v; want a new execution", replayed, err)
				}
				if calls.n.Load() != 1 {
					t.Errorf("fn ran %d times, want 1 (the expired key)", calls.n.Load())
				}
			})
		})
	}
}

// tinySizes run every workload in a few seconds over all contenders.
func tinySizes() bench.Sizes {
	s := bench.QuickSizes()
	s.FirstStored = 50
	s.FirstCallers = []int{1, 8}
	s.DoTxCallers = []int{4}
	s.ReplayStored = []int{200}
	s.ReplayCallers = []int{4}
	s.Recent, s.ConflictStored, s.MemoryStored = 50, 200, 200
	s.PruneExpired, s.PruneLive, s.PruneWriters, s.PruneIdle = 100, 50, 2, 20*time.Millisecond
	s.First = bench.Load{Ops: 20, Warmup: 2}
	s.Replay = bench.Load{Ops: 200, Warmup: 10}
	s.Conflict = s.Replay
	return s
}

func TestWorkloads(t *testing.T) {
	ctx := context.Background()
	ws := bench.Workloads(tinySizes())
	names := make(map[string]bool)
	for _, w := range ws {
		if names[w.Name] {
			t.Fatalf("workload %q twice", w.Name)
		}
		names[w.Name] = true
	}
	for _, c := range bench.Contenders() {
		t.Run(c.Name, func(t *testing.T) {
			fixtures := make(map[bench.FixtureSpec]*bench.Fixture)
			for _, w := range ws {
				f := fixtures[w.Fixture]
				if f == nil {
					var err error
					f, err = bench.OpenFixture(ctx, c, t.TempDir(), w.Fixture, nil)
					if errors.Is(err, bench.ErrSkipped) {
						t.Skip(err)
					}
					if err != nil {
						t.Fatalf("%s: fixture: %v", w.Name, err)
					}
					fixtures[w.Fixture] = f
					t.Cleanup(func() {
						if err := f.Close(); err != nil {
							t.Error(err)
						}
					})
				}
				r, err := w.Run(ctx, f, w.Load)
				if errors.Is(err, bench.ErrSkipped) {
					t.Logf("%s: %v", w.Name, err)
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", w.Name, err)
				}
				if !w.OneShot && (r.Ops == 0 || r.OpsPerSec() <= 0 || r.Latency.Count() != r.Ops) {
					t.Errorf("%s: %d ops, %v ops/s, %d latencies", w.Name, r.Ops, r.OpsPerSec(), r.Latency.Count())
				}
				if r.Score <= 0 || r.ScoreUnit == "" {
					t.Errorf("%s: score %v %q", w.Name, r.Score, r.ScoreUnit)
				}
			}
		})
	}
}

func TestReport(t *testing.T) {
	res := func(ops int) *bench.Result {
		var h bench.Histogram
		h.Record(100 * time.Microsecond)
		return &bench.Result{Ops: ops, Elapsed: time.Second, Latency: &h, Score: float64(ops), ScoreUnit: "ops/s"}
	}
	rows := []bench.Row{
		bench.NewRow("first", "idem", res(2000), nil),
		bench.NewRow("first", "postgres", nil, errors.Join(bench.ErrSkipped, errors.New("no server"))),
		bench.NewRow("first", "sqlite-full", res(1000), nil),
		bench.NewRow("replay", "naive-bbolt", res(400), nil),
		bench.NewRow("replay", "bare", res(4000), nil),
		bench.NewRow("replay", "idem", nil, errors.New("broken\nengine")),
	}
	bench.SetRatios(rows)
	if rows[2].Ratio != 0.5 || rows[2].RatioTo != "idem" {
		t.Errorf("sqlite ratio %v to %q, want 0.5 to idem", rows[2].Ratio, rows[2].RatioTo)
	}
	if rows[4].Ratio != 10 || rows[4].RatioTo != "naive-bbolt" {
		t.Errorf("bare ratio %v to %q, want 10 to the fallback naive-bbolt", rows[4].Ratio, rows[4].RatioTo)
	}
	var b strings.Builder
	if err := bench.WriteMarkdown(&b, rows); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| first | idem | 2,000 | 100µs | 100µs | 1 (ref) |",
		"| first | postgres | skipped |",
		"| first | sqlite-full | 1,000 | 100µs | 100µs | 0.50× |",
		"| replay | idem | failed |  |  |  | broken engine |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
