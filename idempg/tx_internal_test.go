package idempg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestDoTxBatchSavepoints: concurrent DoTx calls share one transaction,
// each fn under a savepoint of its own. A fn that fails (an error, or a
// statement error it swallowed, which aborts the transaction) is rolled back
// to its savepoint: its writes and its claim are gone, and the other calls
// of its transaction commit without running their fns again (each fn runs
// exactly once).
func TestDoTxBatchSavepoints(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		t.Run(env, func(t *testing.T) {
			ctx := context.Background()
			pool := pgtest.Pool(t, env)
			o := &Options{Schema: pgtest.Schema(t, pool), PollOnly: env == pgtest.BouncerEnv}
			if _, err := Migrate(ctx, pool, o); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, "CREATE TABLE "+o.Schema+".effects (key text PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			e, err := Open(ctx, pool, o, &idemcore.Options{PruneInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Close() })
			q := &e.b.dotx
			// Each batch is one transaction, however long its fns take
			// (TestDoTxSlowFnHoldsNoAnswer tests the commits in between).
			e.b.commitAvg.Store(int64(time.Hour))

			// Every fn waits at the gate, so that the calls beyond the
			// transactions allowed at once queue for a shared one.
			const n = 20
			gate := make(chan struct{})
			var (
				mu   sync.Mutex
				runs = map[string]int{}
				txid = map[string]int64{}
			)
			fail := func(i int) string {
				switch {
				case i == n-1:
					return "swallow" // a statement error fn ignores
				case i%3 == 2:
					return "error"
				}
				return ""
			}
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				key := fmt.Sprintf("k%02d", i)
				wg.Go(func() {
					_, errs[i] = e.DoTx(ctx, key, nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
						<-gate
						var id int64
						if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&id); err != nil {
							return nil, err
						}
						mu.Lock()
						runs[key]++
						txid[key] = id
						mu.Unlock()
						if _, err := tx.Exec(ctx, "INSERT INTO "+o.Schema+".effects (key) VALUES ($1)", key); err != nil {
							return nil, err
						}
						switch fail(i) {
						case "swallow":
							_, _ = tx.Exec(ctx, "SELECT 1/0")
						case "error":
							return nil, errors.New("fn failed")
						}
						return []byte("ok " + key), nil
					})
				})
			}
			// Wait for the event: every call beyond the running
			// transactions is queued.
			q.waitFor(func() bool { return len(q.queue) == n-q.max })
			close(gate)
			wg.Wait()

			shared := map[int64][]string{}
			for key, id := range txid {
				shared[id] = append(shared[id], key)
			}
			mixed := false
			for i := range n {
				key := fmt.Sprintf("k%02d", i)
				if runs[key] != 1 {
					t.Errorf("%s: fn ran %d times, want once", key, runs[key])
				}
				var effect bool
				if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+o.Schema+".effects WHERE key = $1)", key).Scan(&effect); err != nil {
					t.Fatal(err)
				}
				rec, gerr := e.Get(key)
				if fail(i) != "" {
					if errs[i] == nil {
						t.Errorf("%s (%s): no error", key, fail(i))
					}
					if effect || !errors.Is(gerr, idemcore.ErrNotFound) && fail(i) == "swallow" {
						t.Errorf("%s (%s): effect %v, record %+v (%v): want its writes rolled back to its savepoint", key, fail(i), effect, rec, gerr)
					}
					for _, other := range shared[txid[key]] {
						var j int
						if _, err := fmt.Sscanf(other, "k%d", &j); err == nil && fail(j) == "" {
							mixed = true
						}
					}
					continue
				}
				if errs[i] != nil || !effect || gerr != nil || rec.State != idemcore.StateDone || string(rec.Response) != "ok "+key {
					t.Errorf("%s: %v; effect %v; record %+v (%v): want it committed", key, errs[i], effect, rec, gerr)
				}
			}
			biggest := 0
			for _, keys := range shared {
				biggest = max(biggest, len(keys))
			}
			if biggest < n-2*q.max {
				t.Errorf("the most calls sharing a transaction: %d, want at least %d (txids %v)", biggest, n-2*q.max, shared)
			}
			if !mixed {
				t.Errorf("no failed call shared a transaction with a committed one (txids %v)", shared)
			}
		})
	}
}

// TestDoTxSlowFnHoldsNoAnswer: in a batch of DoTx calls, a call stored
// before a fn that runs longer than a commit takes is committed and
// answered without waiting for that fn: the slow fn here waits for the
// answer of the call before it in its batch, which it would never get if
// the batch held it to one COMMIT.
func TestDoTxSlowFnHoldsNoAnswer(t *testing.T) {
	ctx := context.Background()
	e := testEngine(t)
	q := &e.b.dotx
	e.b.commitAvg.Store(1) // every fn is slower than a commit
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range q.max {
		wg.Go(func() {
			_, _ = e.DoTx(ctx, fmt.Sprintf("block%d", i), nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				<-gate
				// Rolled back, not committed: a COMMIT's time would move
				// the average, and on a loaded machine a slow one let the
				// batch below hold the fast answer for one COMMIT.
				return nil, idemcore.Retryable(errors.New("the blocker stores nothing"))
			})
		})
	}
	queued := func(n int) {
		for {
			q.mu.Lock()
			ok := q.running == q.max && len(q.queue) == n
			q.mu.Unlock()
			if ok {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	queued(0)
	fastDone := make(chan error, 1)
	go func() {
		_, err := e.DoTx(ctx, "fast", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) { return []byte("fast"), nil })
		fastDone <- err
	}()
	queued(1)
	sawFast := make(chan bool, 1)
	slowDone := make(chan error, 1)
	go func() {
		_, err := e.DoTx(ctx, "slow", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			select {
			case err := <-fastDone:
				sawFast <- err == nil
			case <-time.After(time.Minute): // the fast call's answer is held behind this fn
				sawFast <- false
			}
			return []byte("slow"), nil
		})
		slowDone <- err
	}()
	queued(2)
	close(gate)
	if !<-sawFast {
		t.Error("the slow fn did not see the fast call of its batch answered (held behind it, or failed)")
	}
	if err := <-slowDone; err != nil {
		t.Error(err)
	}
	wg.Wait()
	for _, key := range []string{"fast", "slow"} {
		if rec, err := e.Get(key); err != nil || rec.State != idemcore.StateDone {
			t.Errorf("%s: %+v, %v: want it done", key, rec, err)
		}
	}
}
