// Package benchtest checks benchkit contenders: that each dedupes as its
// table row claims, and that it runs every workload. The tests of benchkit
// run it on the driver-free contenders, those of the bench module on SQLite and
// PostgreSQL.
package benchtest

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/kit/benchkit"
)

// open opens c in a temporary directory, skipping the test when the
// contender cannot run here (PostgreSQL without a server).
func open(t *testing.T, c benchkit.Contender) benchkit.Deduper {
	t.Helper()
	d, err := c.Open(context.Background(), t.TempDir())
	if errors.Is(err, benchkit.ErrSkipped) {
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
	return benchkit.Response(), nil
}

// Dedupe checks that c, opened in a temporary directory, runs fn once per key,
// refuses a key reused with another fingerprint, runs one fn among concurrent
// duplicates, and, where c has them, that DoTx dedupes, Preload stores
// replayable records and Prune deletes the expired ones only. The bare
// contender must instead run fn on every call. It skips t when c cannot run
// here.
func Dedupe(t *testing.T, c benchkit.Contender) {
	ctx := context.Background()
	d := open(t, c)
	if d.Name() != c.Name {
		t.Errorf("Name() = %q, want %q", d.Name(), c.Name)
	}
	if c.Name == "bare" {
		var calls counter
		for range 2 {
			if _, replayed, err := d.Do(ctx, benchkit.Key(1), benchkit.Fingerprint(1), calls.fn); err != nil || replayed {
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
			resp, replayed, err := d.Do(ctx, benchkit.Key(1), benchkit.Fingerprint(1), calls.fn)
			if err != nil || replayed != (i > 0) || !bytes.Equal(resp, benchkit.Response()) {
				t.Fatalf("call %d: replayed %v, %d bytes, err %v", i, replayed, len(resp), err)
			}
		}
		if calls.n.Load() != 1 {
			t.Errorf("fn ran %d times, want 1", calls.n.Load())
		}
	})

	t.Run("conflict refused", func(t *testing.T) {
		var calls counter
		_, _, err := d.Do(ctx, benchkit.Key(1), benchkit.OtherFingerprint(1), calls.fn)
		if !errors.Is(err, benchkit.ErrConflict) || calls.n.Load() != 0 {
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
				_, _, err := d.Do(ctx, benchkit.Key(2), benchkit.Fingerprint(2), func(ctx context.Context) ([]byte, error) {
					time.Sleep(5 * time.Millisecond)
					return calls.fn(ctx)
				})
				if err != nil && !errors.Is(err, benchkit.ErrInProgress) {
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
		td, ok := d.(benchkit.TxDeduper)
		if !ok {
			t.Skip("no DoTx")
		}
		var calls atomic.Int32
		fn := func(context.Context) (benchkit.Effect, []byte, error) {
			calls.Add(1)
			return benchkit.Effect{Key: []byte(benchkit.Key(3)), Value: []byte("effect")}, benchkit.Response(), nil
		}
		for i := range 2 {
			resp, replayed, err := td.DoTx(ctx, benchkit.Key(3), benchkit.Fingerprint(3), fn)
			if err != nil || replayed != (i > 0) || !bytes.Equal(resp, benchkit.Response()) {
				t.Fatalf("call %d: replayed %v, %d bytes, err %v", i, replayed, len(resp), err)
			}
		}
		if calls.Load() != 1 {
			t.Errorf("fn ran %d times, want 1", calls.Load())
		}
	})

	t.Run("preload and prune", func(t *testing.T) {
		p, ok := d.(benchkit.Preloader)
		if !ok {
			t.Skip("no Preload")
		}
		now := time.Now()
		if err := p.Preload(ctx, benchkit.RecordSet{First: 100, N: 50, Completed: now}); err != nil {
			t.Fatal(err)
		}
		if err := p.Preload(ctx, benchkit.RecordSet{First: 200, N: 30, Completed: now.Add(-3 * benchkit.Retention)}); err != nil {
			t.Fatal(err)
		}
		var calls counter
		if _, replayed, err := d.Do(ctx, benchkit.Key(120), benchkit.Fingerprint(120), calls.fn); err != nil || !replayed {
			t.Errorf("a preloaded key: replayed %v, err %v", replayed, err)
		}
		pr, ok := d.(benchkit.Pruner)
		if !ok {
			t.Skip("no Prune")
		}
		n, err := pr.Prune(ctx)
		if err != nil || n < 30 {
			t.Errorf("Prune = %d, %v; want at least the 30 expired records", n, err)
		}
		if _, replayed, err := d.Do(ctx, benchkit.Key(149), benchkit.Fingerprint(149), calls.fn); err != nil || !replayed {
			t.Errorf("a live key after the prune: replayed %v, err %v", replayed, err)
		}
		if _, replayed, err := d.Do(ctx, benchkit.Key(210), benchkit.Fingerprint(210), calls.fn); err != nil || replayed {
			t.Errorf("an expired key after the prune: replayed %v, err %v; want a new execution", replayed, err)
		}
		if calls.n.Load() != 1 {
			t.Errorf("fn ran %d times, want 1 (the expired key)", calls.n.Load())
		}
	})
}

// TinySizes run every workload over a contender in a second or so.
func TinySizes() benchkit.Sizes {
	s := benchkit.QuickSizes()
	s.FirstStored = 50
	s.FirstCallers = []int{1, 8}
	s.DoTxCallers = []int{4}
	s.ReplayStored = []int{200}
	s.ReplayCallers = []int{4}
	s.Recent, s.ConflictStored, s.MemoryStored = 50, 200, 200
	s.PruneExpired, s.PruneLive, s.PruneWriters, s.PruneIdle = 100, 50, 2, 20*time.Millisecond
	s.First = benchkit.Load{Ops: 20, Warmup: 2}
	s.CeilingPutsPerTx, s.Ceiling = 100, benchkit.Load{Ops: 2, Warmup: 1}
	s.Replay = benchkit.Load{Ops: 200, Warmup: 10}
	s.Conflict = s.Replay
	return s
}

// Workloads runs every workload at sizes s that c runs (Workload.RunsOn) on
// c, one fixture per spec as a run shares them, and checks that each either measured something or said
// why it was skipped. It skips t when c cannot run here.
func Workloads(t *testing.T, c benchkit.Contender, s benchkit.Sizes) {
	ctx := context.Background()
	ws := benchkit.Workloads(s)
	names := make(map[string]bool)
	for _, w := range ws {
		if names[w.Name] {
			t.Fatalf("workload %q twice", w.Name)
		}
		names[w.Name] = true
	}
	fixtures := make(map[benchkit.FixtureSpec]*benchkit.Fixture)
	for _, w := range ws {
		if !w.RunsOn(c.Name) {
			continue
		}
		f := fixtures[w.Fixture]
		if f == nil {
			var err error
			f, err = benchkit.OpenFixture(ctx, c, t.TempDir(), w.Fixture, nil)
			if errors.Is(err, benchkit.ErrSkipped) {
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
		if errors.Is(err, benchkit.ErrSkipped) {
			t.Logf("%s: %v", w.Name, err)
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", w.Name, err)
		}
		// One latency per operation; the ceiling's operations are puts, and
		// its latencies those of transactions of puts.
		if !w.OneShot && (r.Ops == 0 || r.OpsPerSec() <= 0 || r.Latency.Count() == 0 || r.Ops%r.Latency.Count() != 0) {
			t.Errorf("%s: %d ops, %v ops/s, %d latencies", w.Name, r.Ops, r.OpsPerSec(), r.Latency.Count())
		}
		if r.Score <= 0 || r.ScoreUnit == "" {
			t.Errorf("%s: score %v %q", w.Name, r.Score, r.ScoreUnit)
		}
	}
}
