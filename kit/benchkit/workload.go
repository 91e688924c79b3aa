package benchkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Workload is one measurement: what is stored first (Fixture), and what is
// timed on it (Run).
type Workload struct {
	// Name identifies the workload in tables and in --only, for example
	// "replay/keys=1e6/cold/callers=64".
	Name string
	// Fixture is the state Run starts from. Workloads with the same spec may
	// run one after the other on one fixture, in the order Workloads lists
	// them; a OneShot workload may change the state it measured.
	Fixture FixtureSpec
	// Callers is the number of concurrent callers.
	Callers int
	// Load is the default load of a throughput workload: what a Plan runs.
	// Benchmarks run b.N operations instead.
	Load Load
	// OneShot workloads (prune, memory) measure once and ignore the load.
	OneShot bool
	// Bytes is the payload of one operation in bytes, for b.SetBytes (the
	// response written or replayed); zero for none.
	Bytes int
	// Contenders names the contenders that run the workload; nil means every
	// one. A Plan makes no row for the others.
	Contenders []string
	// Run measures the workload on f. It returns an error wrapping ErrSkipped
	// when the contender lacks what the workload needs.
	Run func(ctx context.Context, f *Fixture, load Load) (*Result, error)
}

// RunsOn reports whether the contender named runs w: every one when
// w.Contenders is nil, else those it lists.
func (w *Workload) RunsOn(contender string) bool {
	return w.Contenders == nil || slices.Contains(w.Contenders, contender)
}

// Sizes are the sizes of the workloads Workloads makes.
type Sizes struct {
	// FirstStored records are stored before the first-execution and DoTx
	// workloads run, so that they write into a tree of realistic depth.
	FirstStored  int
	FirstCallers []int
	DoTxCallers  []int
	// CeilingPutsPerTx is the number of puts in each transaction of the
	// ceiling workload (plain bbolt, FirstStored records stored).
	CeilingPutsPerTx int
	// ReplayStored are the store sizes of the replay workloads, each run in
	// both modes with each of ReplayCallers.
	ReplayStored  []int
	ReplayCallers []int
	// Recent is the "recent" window: replays pick among the keys completed
	// within the last Recent calls.
	Recent int
	// ConflictStored and MemoryStored should be among ReplayStored, so that
	// they reuse its fixture.
	ConflictStored int
	MemoryStored   int
	// The prune workload stores PruneExpired expired records and PruneLive
	// live ones; PruneWriters callers write new records throughout, for
	// PruneIdle before the prune starts and then until it ends.
	PruneExpired, PruneLive, PruneWriters int
	PruneIdle                             time.Duration
	// Loads of the throughput workloads (DoTx uses First). Ceiling counts
	// transactions.
	First, Replay, Conflict, Ceiling Load
}

// FullSizes are the sizes of the measurements: 1e6 records, 1e5
// expired ones, up to 256 callers, transactions of 1,000 puts for the
// ceiling. A run of every contender takes some 9 minutes.
func FullSizes() Sizes {
	return Sizes{
		FirstStored:      100_000,
		FirstCallers:     []int{1, 8, 64, 256},
		DoTxCallers:      []int{1, 64},
		CeilingPutsPerTx: 1000,
		ReplayStored:     []int{10_000, 100_000, 1_000_000},
		ReplayCallers:    []int{1, 64},
		Recent:           10_000,
		ConflictStored:   100_000,
		MemoryStored:     1_000_000,
		PruneExpired:     100_000,
		PruneLive:        100_000,
		PruneWriters:     8,
		PruneIdle:        time.Second,
		First:            Load{Ops: 20_000, Max: 8 * time.Second, Warmup: 500},
		Replay:           Load{Ops: 1_000_000, Max: 2 * time.Second, Warmup: 2_000},
		Conflict:         Load{Ops: 1_000_000, Max: 2 * time.Second, Warmup: 2_000},
		Ceiling:          Load{Ops: 60, Max: 8 * time.Second, Warmup: 3},
	}
}

// QuickSizes are small sizes for smoke tests: every workload runs, and a
// run ends in seconds. Their figures mean little.
func QuickSizes() Sizes {
	return Sizes{
		FirstStored:      1_000,
		FirstCallers:     []int{1, 8, 64, 256},
		DoTxCallers:      []int{1, 64},
		CeilingPutsPerTx: 1000,
		ReplayStored:     []int{2_000},
		ReplayCallers:    []int{1, 64},
		Recent:           500,
		ConflictStored:   2_000,
		MemoryStored:     2_000,
		PruneExpired:     2_000,
		PruneLive:        1_000,
		PruneWriters:     8,
		PruneIdle:        100 * time.Millisecond,
		First:            Load{Ops: 300, Max: 500 * time.Millisecond, Warmup: 20},
		Replay:           Load{Ops: 5_000, Max: 200 * time.Millisecond, Warmup: 100},
		Conflict:         Load{Ops: 2_000, Max: 200 * time.Millisecond, Warmup: 100},
		Ceiling:          Load{Ops: 2, Max: 500 * time.Millisecond, Warmup: 1},
	}
}

// Workloads lists every workload at sizes s, grouped so that the workloads
// of one fixture follow each other (one-shot ones last in their group).
func Workloads(s Sizes) []Workload {
	var ws []Workload
	for _, c := range s.FirstCallers {
		ws = append(ws, FirstWorkload(s.FirstStored, c, s.First))
	}
	ws = append(ws, CeilingWorkload(s.FirstStored, s.CeilingPutsPerTx, s.Ceiling), FlushCeilingWorkload(s.FirstStored, s.First))
	if len(s.DoTxCallers) > 0 && slices.Max(s.DoTxCallers) > 1 { // beside the many-caller rows
		ws = append(ws, BatchCeilingWorkload(s.FirstStored, slices.Max(s.DoTxCallers), s.First))
	}
	for _, c := range s.DoTxCallers {
		ws = append(ws, DoTxWorkload(s.FirstStored, c, s.First))
	}
	for _, c := range s.DoTxCallers {
		ws = append(ws, DoTxSeqWorkload(s.FirstStored, c, s.First))
	}
	for _, n := range s.ReplayStored {
		recent := min(s.Recent, n)
		for _, mode := range []ReplayMode{Recent, Cold} {
			for _, c := range s.ReplayCallers {
				ws = append(ws, ReplayWorkload(n, recent, mode, c, s.Replay))
			}
		}
		if n == s.ConflictStored {
			ws = append(ws, ConflictWorkload(n, recent, 1, s.Conflict))
		}
		if n == s.MemoryStored {
			ws = append(ws, MemoryWorkload(n, recent))
		}
	}
	if !slices.Contains(s.ReplayStored, s.ConflictStored) {
		ws = append(ws, ConflictWorkload(s.ConflictStored, min(s.Recent, s.ConflictStored), 1, s.Conflict))
	}
	if !slices.Contains(s.ReplayStored, s.MemoryStored) {
		ws = append(ws, MemoryWorkload(s.MemoryStored, min(s.Recent, s.MemoryStored)))
	}
	ws = append(ws, PruneWorkload(s.PruneExpired, s.PruneLive, s.PruneWriters, s.PruneIdle))
	return ws
}

// Count formats n for names: "1e6" for a power of ten from 1,000 up,
// decimal otherwise.
func Count(n int) string {
	e, m := 0, n
	for m >= 10 && m%10 == 0 {
		m, e = m/10, e+1
	}
	if m == 1 && e >= 3 {
		return "1e" + strconv.Itoa(e)
	}
	return strconv.Itoa(n)
}

// errFnRan is returned by the fn of replays and conflicts: a contender that
// runs it failed to dedupe.
var errFnRan = errors.New("bench: fn ran for a key that was already done")

func mustNotRun(context.Context) ([]byte, error) { return nil, errFnRan }

func isStateless(d Deduper) bool {
	_, ok := d.(stateless)
	return ok
}

// checkFirst checks the answer of a first execution.
func checkFirst(resp []byte, replayed bool, err error) error {
	switch {
	case err != nil:
		return err
	case replayed:
		return errors.New("bench: a fresh key was replayed")
	case len(resp) != ResponseSize:
		return fmt.Errorf("bench: response of %d bytes, want %d", len(resp), ResponseSize)
	}
	return nil
}

// FirstWorkload is the first execution of fresh keys by callers concurrent
// callers, on a store holding stored records: the record-before-and-after
// cost, with an fn that does no I/O.
func FirstWorkload(stored, callers int, load Load) Workload {
	return Workload{
		Name:    fmt.Sprintf("first/callers=%d", callers),
		Fixture: FixtureSpec{Stored: stored},
		Callers: callers,
		Load:    load,
		Bytes:   ResponseSize,
		Run: func(ctx context.Context, f *Fixture, load Load) (*Result, error) {
			return runCounted(ctx, f, callers, load, countWrites, func(ctx context.Context, _ int) error {
				k := f.FreshKey()
				return checkFirst(f.D.Do(ctx, Key(k), Fingerprint(k), respond))
			})
		},
	}
}

// DoTxWorkload is the DoTx shape: each call writes an effect row and its done
// record in one commit (idem's DoTx; one SQL transaction; one bbolt Update).
// The effect row is keyed by the idempotency key, so each call writes two
// rows at random places in their B-trees, as a first execution through Do
// writes two records.
func DoTxWorkload(stored, callers int, load Load) Workload {
	return doTxWorkload("dotx", stored, callers, load, func(k int, key string) Effect {
		return effectFor(key)
	})
}

// DoTxSeqWorkload is DoTxWorkload with the effect row keyed by a sequence
// number (as an auto-increment id would key it): the effects of one commit
// land side by side at the end of their B-tree, so each call adds one row at a
// random place, its record.
func DoTxSeqWorkload(stored, callers int, load Load) Workload {
	return doTxWorkload("dotx-seq", stored, callers, load, func(k int, _ string) Effect {
		return seqEffectFor(k)
	})
}

func doTxWorkload(name string, stored, callers int, load Load, effect func(k int, key string) Effect) Workload {
	return Workload{
		Name:    fmt.Sprintf("%s/callers=%d", name, callers),
		Fixture: FixtureSpec{Stored: stored},
		Callers: callers,
		Load:    load,
		Bytes:   ResponseSize + EffectSize,
		Run: func(ctx context.Context, f *Fixture, load Load) (*Result, error) {
			td, ok := f.D.(TxDeduper)
			if !ok {
				return nil, fmt.Errorf("%w: %s has no DoTx", ErrSkipped, f.D.Name())
			}
			return runCounted(ctx, f, callers, load, countWrites, func(ctx context.Context, _ int) error {
				k := f.FreshKey()
				key := Key(k)
				eff := effect(k, key)
				return checkFirst(td.DoTx(ctx, key, Fingerprint(k), func(context.Context) (Effect, []byte, error) {
					return eff, response, nil
				}))
			})
		},
	}
}

// ReplayMode says which stored keys replays pick.
type ReplayMode string

// Replay modes.
const (
	// Recent picks uniformly among the keys completed within the last
	// FixtureSpec.Recent calls: retries come seconds after the first call.
	Recent ReplayMode = "recent"
	// Cold picks uniformly among all stored keys.
	Cold ReplayMode = "cold"
)

// pick is the stored key index operation i replays: uniform over the last
// recent keys, or over all stored ones.
func pick(mode ReplayMode, i, stored, recent int) int {
	r := mix(uint64(i) ^ 0x2545f4914f6cdd1d)
	if mode == Recent {
		return stored - 1 - int(r%uint64(recent))
	}
	return int(r % uint64(stored))
}

// ReplayWorkload replays done keys: each call is answered from the stored
// record, and fn must not run.
func ReplayWorkload(stored, recent int, mode ReplayMode, callers int, load Load) Workload {
	return Workload{
		Name:    fmt.Sprintf("replay/keys=%s/%s/callers=%d", Count(stored), mode, callers),
		Fixture: FixtureSpec{Stored: stored, Recent: recent},
		Callers: callers,
		Load:    load,
		Bytes:   ResponseSize,
		Run: func(ctx context.Context, f *Fixture, load Load) (*Result, error) {
			return runCounted(ctx, f, callers, load, countAllocs, replayOp(f, mode))
		},
	}
}

func replayOp(f *Fixture, mode ReplayMode) Op {
	if isStateless(f.D) {
		return func(ctx context.Context, i int) error {
			k := pick(mode, i, f.Spec.Stored, f.Spec.Recent)
			_, _, err := f.D.Do(ctx, Key(k), Fingerprint(k), respond)
			return err
		}
	}
	return func(ctx context.Context, i int) error {
		k := pick(mode, i, f.Spec.Stored, f.Spec.Recent)
		resp, replayed, err := f.D.Do(ctx, Key(k), Fingerprint(k), mustNotRun)
		switch {
		case err != nil:
			return err
		case !replayed:
			return errors.New("bench: a done key was not replayed")
		case len(resp) != ResponseSize:
			return fmt.Errorf("bench: replayed %d bytes, want %d", len(resp), ResponseSize)
		}
		return nil
	}
}

// ConflictWorkload reuses done keys with other fingerprints: each call must
// be refused with ErrConflict, without running fn.
func ConflictWorkload(stored, recent, callers int, load Load) Workload {
	return Workload{
		Name:    fmt.Sprintf("conflict/keys=%s", Count(stored)),
		Fixture: FixtureSpec{Stored: stored, Recent: recent},
		Callers: callers,
		Load:    load,
		Run: func(ctx context.Context, f *Fixture, load Load) (*Result, error) {
			if isStateless(f.D) {
				return nil, fmt.Errorf("%w: %s stores nothing to conflict with", ErrSkipped, f.D.Name())
			}
			return RunOps(ctx, callers, load, func(ctx context.Context, i int) error {
				k := pick(Cold, i, f.Spec.Stored, f.Spec.Recent)
				_, _, err := f.D.Do(ctx, Key(k), OtherFingerprint(k), mustNotRun)
				if errors.Is(err, ErrConflict) {
					return nil
				}
				if err == nil {
					return errors.New("bench: a conflicting fingerprint was accepted")
				}
				return err
			})
		},
	}
}

// MemoryWorkload measures the cost of stored records: bytes on disk and Go
// heap per record, after replays of recent and cold keys have filled any
// cache. The heap is the growth since before the store opened, after a full
// collection; it does not see memory outside the Go heap (SQLite's page cache
// in modernc.org/sqlite, the server's in PostgreSQL).
func MemoryWorkload(stored, recent int) Workload {
	return Workload{
		Name:    fmt.Sprintf("memory/records=%s", Count(stored)),
		Fixture: FixtureSpec{Stored: stored, Recent: recent},
		OneShot: true,
		Run: func(ctx context.Context, f *Fixture, _ Load) (*Result, error) {
			if isStateless(f.D) {
				return nil, fmt.Errorf("%w: %s stores nothing", ErrSkipped, f.D.Name())
			}
			warm := Load{Ops: 2 * max(recent, 1)}
			for _, mode := range []ReplayMode{Recent, Cold} {
				if _, err := RunOps(ctx, 8, warm, replayOp(f, mode)); err != nil {
					return nil, fmt.Errorf("warming caches: %w", err)
				}
			}
			heap := float64(heapInUse()) - float64(f.HeapBefore)
			disk, err := diskSize(ctx, f.D, f.Dir)
			if err != nil {
				return nil, err
			}
			perDisk := float64(disk) / float64(stored)
			perHeap := max(heap, 0) / float64(stored)
			return &Result{
				Metrics: []Metric{
					{perDisk, "disk-B/record"},
					{perHeap, "heap-B/record"},
				},
				Note:      fmt.Sprintf("disk %.0f B/record, heap %.0f B/record", perDisk, perHeap),
				Score:     perDisk,
				ScoreUnit: "disk-B/record",
			}, nil
		},
	}
}

// PruneWorkload measures what pruning expired records costs the writers:
// writers callers execute fresh keys for idle, then while the contender's
// Prune deletes the expired records (and, when the prune is shorter than idle,
// until idle has passed since it started, so that both windows are as long).
// The result's operations and latencies are the writers' in that second
// window (an operation counts if it overlapped it); its metrics add the
// prune's duration, the idle figures and the longest writer stall. It then
// checks that every expired record went, that a live one still replays, and
// that an expired key executes again.
func PruneWorkload(expired, live, writers int, idle time.Duration) Workload {
	return Workload{
		Name:    fmt.Sprintf("prune/expired=%s", Count(expired)),
		Fixture: FixtureSpec{Stored: live, Expired: expired},
		Callers: writers,
		OneShot: true,
		Bytes:   ResponseSize,
		Run: func(ctx context.Context, f *Fixture, _ Load) (*Result, error) {
			p, ok := f.D.(Pruner)
			if !ok {
				return nil, fmt.Errorf("%w: %s has nothing to prune", ErrSkipped, f.D.Name())
			}
			return runPrune(ctx, f, p, writers, idle)
		},
	}
}

// span is one writer operation: when it started and how long it took.
type span struct {
	start time.Time
	d     time.Duration
}

func runPrune(ctx context.Context, f *Fixture, p Pruner, writers int, idle time.Duration) (*Result, error) {
	// The writers' group: the first failed write cancels gctx (which ends
	// the idle waits and the prune below) and is the run's error.
	g, gctx := errgroup.WithContext(ctx)
	var (
		stop  atomic.Bool
		spans = make([][]span, writers)
	)
	for w := range writers {
		g.Go(func() error {
			for !stop.Load() {
				k := f.FreshKey()
				t0 := time.Now()
				err := checkFirst(f.D.Do(gctx, Key(k), Fingerprint(k), respond))
				if err != nil {
					return fmt.Errorf("writer: %w", err)
				}
				spans[w] = append(spans[w], span{t0, time.Since(t0)})
			}
			return nil
		})
	}
	timer := time.NewTimer(idle)
	select {
	case <-gctx.Done():
	case <-timer.C:
	}
	pStart := time.Now()
	n, pruneErr := p.Prune(gctx)
	pEnd := time.Now()
	if rest := idle - pEnd.Sub(pStart); rest > 0 {
		timer.Reset(rest)
		select {
		case <-gctx.Done():
		case <-timer.C:
		}
	}
	wEnd := time.Now()
	stop.Store(true)
	writeErr := g.Wait()
	if err := errors.Join(pruneErr, writeErr, ctx.Err()); err != nil {
		return nil, err
	}

	var idleH, during Histogram
	var idleStart time.Time
	for _, ss := range spans {
		for _, s := range ss {
			end := s.start.Add(s.d)
			switch {
			case end.Before(pStart):
				idleH.Record(s.d)
				if idleStart.IsZero() || s.start.Before(idleStart) {
					idleStart = s.start
				}
			case s.start.Before(wEnd):
				during.Record(s.d)
			}
		}
	}
	idleRate := float64(idleH.Count()) / pStart.Sub(idleStart).Seconds()
	if err := checkPruned(ctx, f); err != nil {
		return nil, err
	}
	took := pEnd.Sub(pStart)
	r := &Result{
		Ops:     during.Count(),
		Elapsed: wEnd.Sub(pStart),
		Latency: &during,
		Metrics: []Metric{
			{float64(took.Microseconds()) / 1000, "prune-ms"},
			{float64(n), "pruned-records"},
			{idleRate, "idle-ops/s"},
			{us(idleH.Quantile(0.99)), "idle-p99-us"},
			{us(during.Quantile(0.99)), "prune-p99-us"},
			{us(during.Max()), "max-stall-us"},
		},
		Note: fmt.Sprintf("pruned %d in %s; writers idle: %.0f ops/s, p99 %s; max stall %s",
			n, FormatDuration(took), idleRate, FormatDuration(idleH.Quantile(0.99)), FormatDuration(during.Max())),
		ScoreUnit: "ops/s",
	}
	r.Score = r.OpsPerSec()
	if n < f.Spec.Expired {
		return nil, fmt.Errorf("bench: pruned %d records, want at least the %d expired", n, f.Spec.Expired)
	}
	return r, nil
}

// checkPruned checks the retention floor and exact expiry after a prune: a
// live record still replays, an expired key is new again.
func checkPruned(ctx context.Context, f *Fixture) error {
	if f.Spec.Stored > 0 {
		_, replayed, err := f.D.Do(ctx, Key(0), Fingerprint(0), mustNotRun)
		if err != nil || !replayed {
			return fmt.Errorf("bench: a live record did not replay after the prune (err %v)", err)
		}
	}
	k := f.Spec.Stored // the first expired key
	if err := checkFirst(f.D.Do(ctx, Key(k), Fingerprint(k), respond)); err != nil {
		return fmt.Errorf("bench: an expired key did not execute again: %w", err)
	}
	return nil
}

// us is d in microseconds.
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// durationUs is v microseconds.
func durationUs(v float64) time.Duration { return time.Duration(v * float64(time.Microsecond)) }

// FormatDuration prints d with three significant digits in a unit that
// suits it: "812ns", "4.10µs", "70.2ms", "2.41s".
func FormatDuration(d time.Duration) string {
	f := float64(d)
	unit, div := "ns", 1.0
	switch {
	case d >= time.Second:
		unit, div = "s", float64(time.Second)
	case d >= time.Millisecond:
		unit, div = "ms", float64(time.Millisecond)
	case d >= time.Microsecond:
		unit, div = "µs", float64(time.Microsecond)
	}
	v := f / div
	switch {
	case v >= 100 || unit == "ns":
		return fmt.Sprintf("%.0f%s", v, unit)
	case v >= 10:
		return fmt.Sprintf("%.1f%s", v, unit)
	default:
		return fmt.Sprintf("%.2f%s", v, unit)
	}
}
