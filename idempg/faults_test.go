package idempg_test

// Faults of the server and of the pooler, each on a private cluster the test
// starts (pgtest.NewCluster), never on the shared one: the server restarted
// (killed, or shut down fast) and PgBouncer killed and restarted while Do and
// DoTx calls are in flight. ROBUSTNESS.md's Postgres section lists them.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
	"github.com/idemkit/idem/internal/testkit"
)

// faultPool opens a pool on dsn for the fault tests; pollOnly for PgBouncer
// in transaction pooling mode.
func faultPool(t *testing.T, dsn string, pollOnly bool) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if pollOnly {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	cfg.MaxConns = 16
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// faultEngine opens an engine on schema through pool, without a replay
// cache (every replay reads the server) and without the pruner.
func faultEngine(t *testing.T, pool *pgxpool.Pool, schema string, pollOnly bool) *idempg.Engine {
	t.Helper()
	e, err := idempg.Open(context.Background(), pool,
		&idempg.Options{Schema: schema, PollOnly: pollOnly, Lease: 5 * time.Second, PollInterval: 20 * time.Millisecond},
		&idemcore.Options{PruneInterval: -1, ReplayCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// faultSchema migrates a new schema on the server pool reaches (directly:
// not through PgBouncer) and creates its effects table (key, n): n counts
// the committed DoTx effects of a key.
func faultSchema(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := idempg.Migrate(ctx, pool, &idempg.Options{Schema: name}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+name+".effects (key text PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
}

// faultLog records, per key, every execution of fn (its Call) and every
// call's answer or error.
type faultLog struct {
	clock   atomic.Int64 // orders the calls' starts and ends, for porcupine
	mu      sync.Mutex
	tx      map[string]bool // the key's calls are DoTx
	runs    map[string][]idemcore.Call
	answers map[string][]string
	errs    map[string][]error
	history []porcupine.Operation
}

func newFaultLog() *faultLog {
	return &faultLog{tx: map[string]bool{}, runs: map[string][]idemcore.Call{}, answers: map[string][]string{}, errs: map[string][]error{}}
}

// call makes one Do or DoTx call of key on e; fn records its execution, adds
// the key's effect (DoTx: a row of schema.effects, in fn's transaction),
// waits for hold if not nil, and answers "key/attempt N".
func (l *faultLog) call(e *idempg.Engine, schema, key string, tx bool, hold <-chan struct{}, started chan<- string) error {
	l.mu.Lock()
	l.tx[key] = tx
	l.mu.Unlock()
	var returned string // the response fn returned, if it did
	ran := func(ctx context.Context) []byte {
		c, _ := idemcore.CallFrom(ctx)
		l.mu.Lock()
		l.runs[key] = append(l.runs[key], c)
		l.mu.Unlock()
		return fmt.Appendf(nil, "%s/attempt %d", key, c.Attempt)
	}
	block := func() {
		if started != nil {
			started <- key
		}
		if hold != nil {
			<-hold
		}
	}
	var (
		res idemcore.Result
		err error
		ctx = context.Background()
	)
	begin := l.clock.Add(1)
	if tx {
		res, err = e.DoTx(ctx, key, []byte("fp"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			resp := ran(ctx)
			if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".effects (key, n) VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = effects.n + 1", key); err != nil {
				return nil, err
			}
			block()
			returned = string(resp)
			return resp, nil
		})
	} else {
		res, err = e.Do(ctx, key, []byte("fp"), func(ctx context.Context) ([]byte, error) {
			resp := ran(ctx)
			block()
			returned = string(resp)
			return resp, nil
		})
	}
	end := l.clock.Add(1)
	in := testkit.HistIn{Key: key, Op: "exec", Resp: string(res.Response)}
	switch {
	case err != nil:
		in.Op, in.Resp = "unknown", returned
	case res.Replayed:
		in.Op = "replay"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errs[key] = append(l.errs[key], err)
	} else {
		l.answers[key] = append(l.answers[key], string(res.Response))
	}
	l.history = append(l.history, porcupine.Operation{Input: in, Call: begin, Return: end})
	return err
}

// faultStats are the figures of one run through a fault.
type faultStats struct {
	keys, calls, errors, answeredBefore, reexecuted, history int
}

// throughFault runs Do and DoTx traffic on engine e (opened by open on
// schema) and applies fault while some calls' fns are running (their
// started record committed, or their DoTx transaction open) and other calls
// keep arriving. Then every call must have ended (with an answer or an
// error); every key is called again until it answers; and the checks hold:
// every answer a key gave, before the fault or after, is the same; a fresh
// engine reads it back as the key's done record; a Do fn ran a second time
// only as a recovery (Recovered, the next attempt); every DoTx key's effect
// committed exactly once; every in-flight DoTx failed (the server rolled its
// transaction back); and the history of every call, with its start and end,
// is linearizable per key against testkit.ContractModel (porcupine).
func throughFault(t *testing.T, e *idempg.Engine, open func() *idempg.Engine, schema string, check *pgxpool.Pool, fault func()) faultStats {
	t.Helper()
	l := newFaultLog()
	var keys []string
	var st faultStats

	// Before: calls that answer, and must replay after.
	for i := range 10 {
		for _, tx := range []bool{false, true} {
			key := fmt.Sprintf("before-%v-%d", tx, i)
			keys = append(keys, key)
			if err := l.call(e, schema, key, tx, nil, nil); err != nil {
				t.Fatalf("%s before the fault: %v", key, err)
			}
			st.answeredBefore++
		}
	}

	// In flight: fns running when the fault comes.
	hold := make(chan struct{})
	started := make(chan string, 16)
	var flying sync.WaitGroup
	flyErrs := map[string]*error{}
	for i := range 6 {
		for _, tx := range []bool{false, true} {
			key := fmt.Sprintf("inflight-%v-%d", tx, i)
			keys = append(keys, key)
			var err error
			flyErrs[key] = &err
			flying.Go(func() { err = l.call(e, schema, key, tx, hold, started) })
		}
	}
	for range 12 {
		select {
		case <-started:
		case <-time.After(60 * time.Second): // a bound on a hang, not a timing claim
			t.Fatal("the in-flight calls' fns did not start")
		}
	}

	// Meanwhile: callers that keep coming on new keys, through the fault
	// and for 10 calls each after it.
	var (
		bg     sync.WaitGroup
		after  atomic.Bool
		bgMu   sync.Mutex
		bgKeys []string
	)
	for w := range 4 {
		bg.Go(func() {
			for i, n := 0, 0; n < 10; i++ {
				key := fmt.Sprintf("during-%d-%d", w, i)
				bgMu.Lock()
				bgKeys = append(bgKeys, key)
				bgMu.Unlock()
				if err := l.call(e, schema, key, i%2 == 1, nil, nil); err != nil {
					time.Sleep(5 * time.Millisecond) // pacing while the server is away
				}
				if after.Load() {
					n++
				}
			}
		})
	}
	fault()
	after.Store(true)
	close(hold)
	ended := make(chan struct{})
	go func() { flying.Wait(); bg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(120 * time.Second): // a bound on a hang, not a timing claim
		t.Fatal("calls still running two minutes after the fault: a hang")
	}
	keys = append(keys, bgKeys...)
	for key, err := range flyErrs {
		if strings.Contains(key, "true") && *err == nil {
			t.Errorf("%s: a DoTx whose transaction was open through the fault answered; its transaction must have died", key)
		}
		if errors.Is(*err, idemcore.ErrFenced) {
			t.Errorf("%s: %v; no other owner exists", key, *err)
		}
	}

	// Retries: every key until it answers (the server is back).
	for _, key := range keys {
		l.mu.Lock()
		tx := l.tx[key]
		l.mu.Unlock()
		var err error
		for try := 0; try < 50; try++ {
			if err = l.call(e, schema, key, tx, nil, nil); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("%s: no answer after 50 retries: %v", key, err)
		}
	}

	// Checks, through a fresh engine.
	fresh := open()
	ctx := context.Background()
	effects := map[string]int{}
	rows, err := check.Query(ctx, "SELECT key, n FROM "+schema+".effects")
	if err != nil {
		t.Fatal(err)
	}
	var (
		k string
		n int
	)
	if _, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error { effects[k] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, key := range keys {
		st.keys++
		st.calls += len(l.answers[key]) + len(l.errs[key])
		st.errors += len(l.errs[key])
		answers := l.answers[key]
		if len(answers) == 0 {
			continue // reported above
		}
		for _, a := range answers[1:] {
			if a != answers[0] {
				t.Errorf("%s answered %q, then %q", key, answers[0], a)
			}
		}
		rec, err := fresh.Get(key)
		if err != nil || rec.State != idemcore.StateDone || string(rec.Response) != answers[0] {
			t.Errorf("%s: stored %+v, %v; want done with %q", key, rec, err, answers[0])
		}
		runs := l.runs[key]
		if l.tx[key] {
			if effects[key] != 1 {
				t.Errorf("%s: the DoTx effect committed %d times, want once", key, effects[key])
			}
			continue
		}
		for i, c := range runs {
			if i > 0 && (!c.Recovered || c.Attempt != i+1) {
				t.Errorf("%s: execution %d of fn saw %+v; a second execution must recover the first (Recovered, attempt %d)", key, i+1, c, i+1)
			}
		}
		if len(runs) > 1 {
			st.reexecuted++
		}
		if len(runs) == 0 {
			t.Errorf("%s answered %q and fn never ran", key, answers[0])
		}
	}
	for key, n := range effects {
		if !l.tx[key] {
			t.Errorf("an effect row for %s, which no DoTx called (%d)", key, n)
		}
	}
	if st.errors == 0 {
		t.Error("no call failed: the fault did not reach the calls")
	}
	// The whole history, per key, against the contract's model: every
	// failed call an unknown outcome (it took effect or not), no double
	// execution, no wrong replay.
	for i := range l.history {
		l.history[i].ClientId = i // every call is a client of its own
	}
	if res := porcupine.CheckOperationsTimeout(testkit.ContractModel, l.history, time.Minute); res != porcupine.Ok {
		t.Errorf("the history of %d calls through the fault is not linearizable against the contract: %v", len(l.history), res)
	}
	st.history = len(l.history)
	return st
}

// TestServerRestartMidTransaction restarts a private server while Do fns
// run (their started records committed) and DoTx transactions are open,
// with calls arriving throughout: killed (immediate: every session dies,
// the server recovers from its WAL) and shut down fast (open transactions
// rolled back). See throughFault for what is checked.
func TestServerRestartMidTransaction(t *testing.T) {
	c := pgtest.NewCluster(t)
	for _, mode := range []string{"immediate", "fast"} {
		t.Run(mode, func(t *testing.T) {
			pool := faultPool(t, c.DSN(), false)
			schema := "restart_" + mode
			faultSchema(t, pool, schema)
			e := faultEngine(t, pool, schema, false)
			st := throughFault(t, e, func() *idempg.Engine {
				return faultEngine(t, faultPool(t, c.DSN(), false), schema, false)
			}, schema, pool, func() { c.Restart(mode) })
			t.Logf("restart -m %s: %d keys, %d calls, %d failed and were retried, %d answered before it, %d Do keys re-executed (all recovered), %d calls checked with porcupine",
				mode, st.keys, st.calls, st.errors, st.answeredBefore, st.reexecuted, st.history)
		})
	}
}

// TestPgBouncerRestart kills a private PgBouncer (transaction pooling, the
// engine in PollOnly mode) while calls are in flight and starts it again:
// every client connection dies, and the server rolls back the transactions
// of the server connections PgBouncer held. See throughFault.
func TestPgBouncerRestart(t *testing.T) {
	c := pgtest.NewCluster(t)
	bdsn := c.StartBouncer()
	direct := faultPool(t, c.DSN(), false)
	const schema = "bouncer_restart"
	faultSchema(t, direct, schema)
	e := faultEngine(t, faultPool(t, bdsn, true), schema, true)
	st := throughFault(t, e, func() *idempg.Engine {
		return faultEngine(t, faultPool(t, bdsn, true), schema, true)
	}, schema, direct, func() {
		c.KillBouncer()
		c.StartBouncer()
	})
	t.Logf("PgBouncer killed and restarted: %d keys, %d calls, %d failed and were retried, %d answered before it, %d Do keys re-executed (all recovered), %d calls checked with porcupine",
		st.keys, st.calls, st.errors, st.answeredBefore, st.reexecuted, st.history)
}
