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

// TestBreakerBatchChainEndThenError: in a DoTx transaction shared by three
// calls, the third's fn ends the transaction with SQL (tx.go says such a fn
// is detected after it returns) and then returns an error, as a fn whose
// later statement failed would. The first two calls are well-behaved: what
// each is told must be what is stored, an answer with its record and
// effect committed, or an error with neither.
func TestBreakerBatchChainEndThenError(t *testing.T) {
	for _, end := range []string{"COMMIT", "COMMIT AND CHAIN", "ROLLBACK AND CHAIN"} {
		t.Run(end, func(t *testing.T) {
			ctx := context.Background()
			e, pool := breakerHooked(t, pgtest.Env, Options{}, 4)
			schema := e.b.s.Schema
			if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".effects (key text PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			e.b.commitAvg.Store(int64(time.Hour)) // one transaction per batch
			q := &e.b.dotx
			gate2 := make(chan struct{})
			var wg sync.WaitGroup
			release := holdDoTxSlots(t, ctx, e)
			const n = 3
			errs := make([]error, n)
			for i := range n {
				key := fmt.Sprintf("b%d", i)
				wg.Go(func() {
					_, errs[i] = e.DoTx(ctx, key, nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
						<-gate2
						if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".effects (key) VALUES ($1)", key); err != nil {
							return nil, err
						}
						if i == n-1 {
							_, _ = tx.Exec(ctx, end)
							return nil, errors.New("a later step failed")
						}
						return []byte("ok " + key), nil
					})
				})
				q.waitFor(func() bool { return len(q.queue) == i+1 }) // queued in this order: b0, b1, b2
			}
			release()
			close(gate2)
			wg.Wait()
			for i := range n - 1 {
				key := fmt.Sprintf("b%d", i)
				var effect bool
				if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+schema+".effects WHERE key = $1)", key).Scan(&effect); err != nil {
					t.Fatal(err)
				}
				rec, gerr := e.Get(key)
				stored := gerr == nil && rec.State == idemcore.StateDone
				if (errs[i] == nil) != (stored && effect) || (errs[i] != nil && (stored || effect)) {
					t.Errorf("%s (well-behaved, sharing the transaction): told %v; effect committed %v; record %+v (%v): the answer must be what is stored",
						key, errs[i], effect, rec, gerr)
				}
			}
		})
	}
}

// TestBreakerAloneChainEndThenError: a lone DoTx call whose fn sends COMMIT
// AND CHAIN (its writes and its started claim commit) and then returns an
// error. tx.go promises such a fn is detected after it returns: the call
// fails with ErrTxEnded and no outcome is stored for it (as
// TestDoTxFnEndingItsTransaction has it for a fn that returns nil).
func TestBreakerAloneChainEndThenError(t *testing.T) {
	ctx := context.Background()
	e, pool := breakerHooked(t, pgtest.Env, Options{}, 0)
	schema := e.b.s.Schema
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".effects (key text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	_, err := e.DoTx(ctx, "k", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".effects (key) VALUES ('k')"); err != nil {
			return nil, err
		}
		_, _ = tx.Exec(ctx, "COMMIT AND CHAIN")
		return nil, errors.New("a later step failed")
	})
	rec, gerr := e.Get("k")
	if !errors.Is(err, ErrTxEnded) || (gerr == nil && rec.State == idemcore.StateDone) {
		t.Errorf("DoTx whose fn sent COMMIT AND CHAIN, then failed: %v; record %+v (%v); want ErrTxEnded and no outcome stored", err, rec, gerr)
	}
}

// holdDoTxSlots starts one DoTx call per slot of e's DoTx batcher, each
// waiting in its fn, and returns once they all run: the calls made after it
// queue, and go in the batches that follow. release lets the holders end
// and waits for them.
func holdDoTxSlots(t *testing.T, ctx context.Context, e *Engine) (release func()) {
	t.Helper()
	q := &e.b.dotx
	gate := make(chan struct{})
	var holders sync.WaitGroup
	for i := range q.max {
		holders.Go(func() {
			if _, err := e.DoTx(ctx, fmt.Sprintf("holder-%d", i), nil, func(context.Context, pgx.Tx) ([]byte, error) {
				<-gate
				return []byte("held"), nil
			}); err != nil {
				t.Errorf("holder %d: %v", i, err)
			}
		})
	}
	q.waitFor(func() bool { return q.running == q.max })
	return func() {
		close(gate)
		holders.Wait()
	}
}
