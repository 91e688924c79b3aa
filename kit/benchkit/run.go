package benchkit

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Load says how long a throughput workload runs.
type Load struct {
	// Ops is the number of timed operations (b.N in a benchmark); at least 1.
	Ops int
	// Max stops the run early once this much time has passed, for slow
	// contenders; zero means no limit.
	Max time.Duration
	// Warmup is the number of untimed operations run first, by the same
	// callers (they dial pool connections and warm caches).
	Warmup int
}

// Op is one timed operation of a workload. i numbers the operations of a run
// from 0, warm-up included; operations pick their keys from it.
type Op func(ctx context.Context, i int) error

// A Metric is a figure beside ops/s and latency, in the form of a Go
// benchmark metric: the unit names it and holds no spaces.
type Metric struct {
	Value float64
	Unit  string // for example "disk-B/record"
}

// Result is what one workload measured on one contender.
type Result struct {
	Workload, Contender string
	// Ops operations completed in Elapsed (throughput workloads; for the
	// prune workload, the writers' operations while the prune ran).
	Ops     int
	Elapsed time.Duration
	// Latency of each timed operation.
	Latency *Histogram
	// Metrics are the workload's own figures (bytes per record, prune time).
	Metrics []Metric
	// Note says the same for people, in a few words.
	Note string
	// Score is what ratios compare: ops/s unless the workload says otherwise
	// (memory compares disk bytes per record). ScoreUnit names it.
	Score     float64
	ScoreUnit string
}

// OpsPerSec is Ops over Elapsed; zero when nothing was timed.
func (r *Result) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// Metric returns the value of the metric with unit, if r has it.
func (r *Result) Metric(unit string) (float64, bool) {
	for _, m := range r.Metrics {
		if m.Unit == unit {
			return m.Value, true
		}
	}
	return 0, false
}

// RunOps runs load.Warmup untimed operations and then load.Ops timed ones,
// spread over callers goroutines that each take the next operation as soon as
// their previous one returns (a closed loop, as a pool of request handlers
// would). It returns the operations completed, the elapsed wall-clock time and
// each operation's latency. The first error stops every caller and is returned
// with the operation's number.
func RunOps(ctx context.Context, callers int, load Load, op Op) (*Result, error) {
	return runOps(ctx, callers, load, op, nil)
}

// runOps is RunOps; around, if not nil, is called just before the timed
// operations start and returns what to call just after they end (untimed):
// it reads counters whose growth the workload divides by the operations.
func runOps(ctx context.Context, callers int, load Load, op Op, around func() func()) (*Result, error) {
	callers = max(callers, 1)
	var next atomic.Int64
	if load.Warmup > 0 {
		if _, err := runPhase(ctx, callers, &next, int64(load.Warmup), 0, op); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		next.Store(int64(load.Warmup)) // each caller took one number past the end
	}
	after := func() {}
	if around != nil {
		after = around()
	}
	start := time.Now()
	h, err := runPhase(ctx, callers, &next, next.Load()+int64(max(load.Ops, 1)), load.Max, op)
	elapsed := time.Since(start)
	after()
	if err != nil {
		return nil, err
	}
	return &Result{Ops: h.Count(), Elapsed: elapsed, Latency: h, Score: float64(h.Count()) / elapsed.Seconds(), ScoreUnit: "ops/s"}, nil
}

// runPhase runs operations numbered from next up to end (exclusive), or until
// limit has passed, and returns their merged latencies.
func runPhase(ctx context.Context, callers int, next *atomic.Int64, end int64, limit time.Duration, op Op) (*Histogram, error) {
	// The first failed operation cancels the others' context and is the
	// phase's error (errgroup.WithContext).
	g, gctx := errgroup.WithContext(ctx)
	var (
		hs   = make([]Histogram, callers)
		stop atomic.Bool
	)
	start := time.Now()
	for c := range callers {
		h := &hs[c]
		g.Go(func() error {
			for !stop.Load() && gctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= end {
					return nil
				}
				t0 := time.Now()
				err := op(gctx, int(i))
				t1 := time.Now()
				if err != nil {
					return fmt.Errorf("operation %d: %w", i, err)
				}
				h.Record(t1.Sub(t0))
				if limit > 0 && t1.Sub(start) > limit {
					stop.Store(true)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err // the caller's ctx ended
	}
	total := new(Histogram)
	for i := range hs {
		total.Merge(&hs[i])
	}
	return total, nil
}
