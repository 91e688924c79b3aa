package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/kit/benchkit"
)

// Cold replays from a second process: the records are stored by the
// contender in this process, then another OS process, with nothing cached,
// connects with a pool of the same size and replays them. It runs either
// the contender's engine (idempg's Do) or one bare SELECT of the response by
// key on the same table, the floor of any replay from Postgres.

// childEnv names the environment variable that makes this program (the
// compare command or the bench test binary) run as a second process: it
// holds a childSpec in JSON. ChildMain runs it.
const childEnv = "IDEM_BENCH_REPLAY_CHILD"

// Kinds of replay a second process runs.
const (
	childIdemPG = "idempg" // idempg.Engine.Do on the schema, fn must not run
	childSelect = "select" // SELECT response FROM table WHERE key = $1
)

// childSpec is what a second process is asked to run.
type childSpec struct {
	Kind     string        `json:"kind"`
	DSN      string        `json:"dsn"`
	Schema   string        `json:"schema"` // idempg's schema
	Table    string        `json:"table"`  // the bare SELECT's table, schema-qualified
	Stored   int           `json:"stored"` // keys 0 … Stored-1 are done
	Callers  int           `json:"callers"`
	Ops      int           `json:"ops"`
	Warmup   int           `json:"warmup"`
	Max      time.Duration `json:"max"`
	PoolSize int           `json:"pool_size"`
	// Draw numbers the sequence of keys replayed: two processes of
	// different draws replay different keys (but for the few a uniform
	// pick repeats), so that the second does not find the pages the first
	// read in the server's cache.
	Draw int `json:"draw"`
}

// childResult is what a second process prints: every timed operation's
// latency, and the wall-clock time of the timed operations.
type childResult struct {
	Elapsed   time.Duration   `json:"elapsed"`
	Latencies []time.Duration `json:"latencies"`
}

// secondProcess is a contender whose records a second process can replay:
// its server, and the kinds of replay and their targets.
type secondProcess interface {
	replaySpecs() []childSpec
}

// SecondProcessReplayWorkload replays stored done keys, picked uniformly
// ("cold"), from a second OS process with callers concurrent callers, for
// the contenders that live in a server (postgres, idempg). The postgres row
// is the bare SELECT of the response by key on its table; the idempg row is
// idempg's Do in a fresh engine, and its note and metrics give the bare
// SELECT on idempg's own table from the same kind of process, measured just
// after. Nothing of the parent's caches can help: the second process starts
// empty.
func SecondProcessReplayWorkload(stored, callers int, load benchkit.Load) benchkit.Workload {
	return benchkit.Workload{
		Name:       fmt.Sprintf("replay-2nd-process/keys=%s/cold/callers=%d", benchkit.Count(stored), callers),
		Fixture:    benchkit.FixtureSpec{Stored: stored},
		Callers:    callers,
		Load:       load,
		Bytes:      benchkit.ResponseSize,
		Contenders: []string{"postgres", "idempg"},
		Run: func(ctx context.Context, f *benchkit.Fixture, load benchkit.Load) (*benchkit.Result, error) {
			sp, ok := f.D.(secondProcess)
			if !ok {
				return nil, fmt.Errorf("%w: %s has no second process", benchkit.ErrSkipped, f.D.Name())
			}
			var results []*benchkit.Result
			for _, spec := range sp.replaySpecs() {
				spec.Stored, spec.Callers = f.Spec.Stored, callers
				spec.Ops, spec.Warmup, spec.Max = max(load.Ops, 1), load.Warmup, load.Max
				spec.PoolSize = postgresPoolSize
				r, err := runChild(ctx, spec)
				if err != nil {
					return nil, fmt.Errorf("second process (%s): %w", spec.Kind, err)
				}
				results = append(results, r)
			}
			r := results[0]
			r.Note = fmt.Sprintf("%d ops in %.2fs, %s", r.Ops, r.Elapsed.Seconds(), sp.replaySpecs()[0].Kind)
			if len(results) > 1 {
				s := results[1]
				r.Note += fmt.Sprintf("; bare SELECT on the same table: %.0f ops/s, p50 %s, p99 %s", s.OpsPerSec(),
					benchkit.FormatDuration(s.Latency.Quantile(0.5)), benchkit.FormatDuration(s.Latency.Quantile(0.99)))
				r.Metrics = append(r.Metrics,
					benchkit.Metric{Value: s.OpsPerSec(), Unit: "select-ops/s"},
					benchkit.Metric{Value: float64(s.Latency.Quantile(0.5)) / 1e3, Unit: "select-p50-us"})
			}
			return r, nil
		},
	}
}

// Workloads lists benchkit's workloads at sizes s, with the flush counts
// of Do and DoTx at one caller after the ceilings (SyncsWorkload: as many
// calls as four times the first rows' warm-up, at least 200), then the cold replays
// from a second process (the largest replay store, each replay caller
// count). Only the replay rows ("replay/...") run the OtelContenders.
func Workloads(s benchkit.Sizes) []benchkit.Workload {
	syncs := []benchkit.Workload{
		SyncsWorkload("first", s.FirstStored, max(s.First.Warmup*4, 200), max(s.First.Warmup/10, 5)),
		SyncsWorkload("dotx", s.FirstStored, max(s.First.Warmup*4, 200), max(s.First.Warmup/10, 5)),
	}
	base := benchkit.Workloads(s)
	at := len(base)
	for i, w := range base {
		if strings.HasPrefix(w.Name, "ceiling/") {
			at = i + 1
		}
	}
	ws := slices.Concat(base[:at], syncs, base[at:])
	stored := 0
	for _, n := range s.ReplayStored {
		stored = max(stored, n)
	}
	for _, c := range s.ReplayCallers {
		ws = append(ws, SecondProcessReplayWorkload(stored, c, s.Replay))
	}
	// The OtelContenders measure the hooks' cost on the replay rows only.
	var others []string
	for _, c := range Contenders() {
		others = append(others, c.Name)
	}
	for i := range ws {
		if ws[i].Contenders == nil && !strings.HasPrefix(ws[i].Name, "replay/") {
			ws[i].Contenders = others
		}
	}
	return ws
}

// runChild runs spec in a second process (this executable again) and
// returns what it measured.
func runChild(ctx context.Context, spec childSpec) (*benchkit.Result, error) {
	cmd, err := selfCommand(ctx, childEnv, spec)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var cr childResult
	if err := json.Unmarshal(out, &cr); err != nil {
		return nil, fmt.Errorf("its answer: %w", err)
	}
	h := new(benchkit.Histogram)
	for _, d := range cr.Latencies {
		h.Record(d)
	}
	return &benchkit.Result{Ops: h.Count(), Elapsed: cr.Elapsed, Latency: h,
		Score: float64(h.Count()) / cr.Elapsed.Seconds(), ScoreUnit: "ops/s"}, nil
}

// selfCommand is the command that runs this executable again with spec,
// in JSON, in the environment variable env.
func selfCommand(ctx context.Context, env string, spec any) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), env+"="+string(js))
	return cmd, nil
}

// ChildMain runs this process as a second process if childEnv asks it to,
// and then exits; else it returns at once. The compare command and the
// bench tests call it first thing.
func ChildMain() {
	syncsChild() // a flush count's process, which exits
	js := os.Getenv(childEnv)
	if js == "" {
		return
	}
	var spec childSpec
	err := json.Unmarshal([]byte(js), &spec)
	var cr *childResult
	if err == nil {
		cr, err = runReplays(context.Background(), spec)
	}
	if err == nil {
		err = json.NewEncoder(os.Stdout).Encode(cr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: second process:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runReplays is the second process's work: spec.Warmup untimed replays,
// then spec.Ops timed ones (or until spec.Max), by spec.Callers callers in a
// closed loop.
func runReplays(ctx context.Context, spec childSpec) (*childResult, error) {
	var (
		hook func(context.Context, *pgx.Conn) error
		err  error
	)
	if spec.Kind == childIdemPG {
		if hook, err = idempg.AfterConnect(nil); err != nil {
			return nil, err
		}
	}
	pool, _, err := openBenchPool(ctx, spec.DSN, spec.Kind, hook)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	var op func(ctx context.Context, k int) error
	switch spec.Kind {
	case childIdemPG:
		e, err := idempg.Open(ctx, pool, &idempg.Options{Schema: spec.Schema}, &idem.Options{PruneInterval: -1})
		if err != nil {
			return nil, err
		}
		defer e.Close()
		op = func(ctx context.Context, k int) error {
			res, err := e.Do(ctx, benchkit.Key(k), benchkit.Fingerprint(k), func(context.Context) ([]byte, error) {
				return nil, errors.New("bench: fn ran for a done key")
			})
			return checkReplay(res.Response, res.Replayed, err)
		}
	case childSelect:
		q := `SELECT response FROM ` + spec.Table + ` WHERE key = $1`
		op = func(ctx context.Context, k int) error {
			var resp []byte
			err := pool.QueryRow(ctx, q, benchkit.Key(k)).Scan(&resp)
			return checkReplay(resp, true, err)
		}
	default:
		return nil, fmt.Errorf("unknown kind %q", spec.Kind)
	}
	// Keys picked uniformly over the stored ones (splitmix64 of the
	// operation's number in the draw).
	pick := func(i int) int {
		z := (uint64(i)+uint64(spec.Draw)<<40)*0x9e3779b97f4a7c15 + 0x2545f4914f6cdd1d
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		return int((z ^ (z >> 31)) % uint64(spec.Stored))
	}
	var next atomic.Int64
	phase := func(end int64, limit time.Duration) ([]time.Duration, error) {
		var (
			mu    sync.Mutex
			all   []time.Duration
			first error
			wg    sync.WaitGroup
		)
		start := time.Now()
		for range max(spec.Callers, 1) {
			wg.Go(func() {
				var mine []time.Duration
				for {
					i := next.Add(1) - 1
					if i >= end || (limit > 0 && time.Since(start) > limit) {
						break
					}
					t0 := time.Now()
					err := op(ctx, pick(int(i)))
					mine = append(mine, time.Since(t0))
					if err != nil {
						mu.Lock()
						first = cmp(first, fmt.Errorf("operation %d: %w", i, err))
						mu.Unlock()
						break
					}
				}
				mu.Lock()
				all = append(all, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
		return all, first
	}
	if _, err := phase(int64(spec.Warmup), 0); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	next.Store(int64(spec.Warmup))
	start := time.Now()
	lat, err := phase(int64(spec.Warmup+spec.Ops), spec.Max)
	elapsed := time.Since(start)
	if err != nil {
		return nil, err
	}
	return &childResult{Elapsed: elapsed, Latencies: lat}, nil
}

// cmp keeps the first error.
func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// checkReplay checks a replay's answer.
func checkReplay(resp []byte, replayed bool, err error) error {
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return errors.New("bench: a done key is not stored")
	case err != nil:
		return err
	case !replayed:
		return errors.New("bench: a done key was not replayed")
	case len(resp) != benchkit.ResponseSize:
		return fmt.Errorf("bench: replayed %d bytes, want %d", len(resp), benchkit.ResponseSize)
	}
	return nil
}
