package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

var txDumps atomic.Uint64

// txDump reads user buckets through a DoTx of its own (a fresh key each
// time) and returns their contents by bucket name.
func txDump(t testing.TB, e *idem.Engine, names ...string) map[string]map[string]string {
	t.Helper()
	key := fmt.Sprintf("dump-%d", txDumps.Add(1))
	res, err := e.DoTx(context.Background(), key, nil, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		out := map[string]map[string]string{}
		for _, name := range names {
			b, err := tx.Bucket([]byte(name))
			if err != nil {
				return nil, err
			}
			m := map[string]string{}
			if err := b.ForEach(func(k, v []byte) error { m[string(k)] = string(v); return nil }); err != nil {
				return nil, err
			}
			out[name] = m
		}
		return json.Marshal(out)
	})
	require.NoError(t, err)
	var out map[string]map[string]string
	require.NoError(t, json.Unmarshal(res.Response, &out))
	require.NoError(t, e.Forget(key))
	return out
}

func TestDoTxWritesCommitWithTheRecord(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	runs := 0
	fn := func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		runs++
		orders, err := tx.Bucket([]byte("orders"))
		if err != nil {
			return nil, err
		}
		n, _ := orders.NextSequence()
		id := fmt.Sprintf("order-%d", n)
		if c, _ := idem.CallFrom(ctx); c.Key != "create-1" {
			return nil, fmt.Errorf("CallFrom(ctx).Key = %q", c.Key)
		}
		return []byte(id), orders.Put([]byte(id), []byte("A1"))
	}
	first, err := e.DoTx(context.Background(), "create-1", []byte("A1"), fn)
	require.NoError(t, err)
	require.Equal(t, "order-1", string(first.Response))
	require.False(t, first.Replayed)

	again, err := e.DoTx(context.Background(), "create-1", []byte("A1"), fn)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, "order-1", string(again.Response))
	require.Equal(t, 1, runs)
	require.Equal(t, map[string]string{"order-1": "A1"}, txDump(t, e, "orders")["orders"])
}

func TestDoTxRefusesTheReservedBucket(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	for _, name := range []string{"idem"} {
		t.Run(name, func(t *testing.T) {
			_, err := e.DoTx(context.Background(), "k-"+name, nil, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
				_, err := tx.Bucket([]byte(name))
				return nil, err
			})
			require.ErrorIs(t, err, idem.ErrReservedBucket)
			require.Contains(t, err.Error(), "belongs to the engine")
		})
	}
	// Names that only look like it are the user's.
	for _, name := range []string{"idem/outbox", "idem2", "IDEM", "outbox", "dead"} {
		_, err := e.DoTx(context.Background(), "ok-"+name, nil, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
			_, err := tx.Bucket([]byte(name))
			return nil, err
		})
		require.NoError(t, err, name)
	}
}

func TestDoTxPanicCommitsNothingAndReachesTheCaller(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	boom := errors.New("boom")
	fn := func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		b, err := tx.Bucket([]byte("orders"))
		if err != nil {
			return nil, err
		}
		if err := b.Put([]byte("order-1"), []byte("x")); err != nil {
			return nil, err
		}
		if err := tx.Enqueue("charge", []byte("1200")); err != nil {
			return nil, err
		}
		panic(boom)
	}
	var got any
	func() {
		defer func() { got = recover() }()
		_, _ = e.DoTx(context.Background(), "create-1", nil, fn)
	}()
	var pe *idem.PanicError
	require.ErrorAs(t, got.(error), &pe, "the caller sees the panic as a *idem.PanicError")
	require.Equal(t, boom, pe.Value)
	require.Contains(t, string(pe.Stack), "dotx_test.go", "with the stack where fn panicked")

	require.Empty(t, txDump(t, e, "orders")["orders"], "nothing of fn's committed")
	require.Empty(t, obMessages(t, e))
	_, err := e.Get("create-1")
	require.ErrorIs(t, err, idem.ErrNotFound, "no record: DoTx stores no started record")

	res, err := e.DoTx(context.Background(), "create-1", nil, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		return []byte("ran again"), nil
	})
	require.NoError(t, err)
	require.Equal(t, "ran again", string(res.Response), "the key is free")
}

func TestDoTxPermanentErrorIsRecordedWithoutFnsWrites(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	declined := errors.New("card declined")
	runs := 0
	fn := func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		runs++
		b, err := tx.Bucket([]byte("orders"))
		if err != nil {
			return nil, err
		}
		if err := b.Put([]byte("order-1"), []byte("x")); err != nil {
			return nil, err
		}
		return nil, idem.WithCode(declined, "card_declined")
	}
	_, err := e.DoTx(context.Background(), "create-1", nil, fn)
	var ie *idem.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "card_declined", ie.Code)
	require.ErrorIs(t, err, declined, "the first answer wraps fn's error")

	_, err = e.DoTx(context.Background(), "create-1", nil, fn)
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "card_declined", ie.Code, "replayed")
	require.Equal(t, 1, runs)
	require.Empty(t, txDump(t, e, "orders")["orders"])
}

func TestDoTxRetryableFreesTheKey(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	_, err := e.DoTx(context.Background(), "create-1", nil, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		b, _ := tx.Bucket([]byte("orders"))
		_ = b.Put([]byte("order-1"), []byte("x"))
		return nil, idem.Retryable(errors.New("stock service busy"))
	})
	require.ErrorIs(t, err, idem.ErrRetryable)
	require.Empty(t, txDump(t, e, "orders")["orders"])
	res, err := e.DoTx(context.Background(), "create-1", nil, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		return []byte("ok"), nil
	})
	require.NoError(t, err)
	require.False(t, res.Replayed)
}

// shareCommits runs call(i) for each i below callers, each on a goroutine of
// its own, while a DoTx of key blocker holds the writer, so that the calls'
// DoTx calls queue behind it and share the next commits; it returns once
// every call has returned.
func shareCommits(t *testing.T, e *idem.Engine, blocker string, callers int, call func(i int)) {
	t.Helper()
	release, holding := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.DoTx(context.Background(), blocker, nil, func(context.Context, *idem.Tx) ([]byte, error) {
			select { // fn may run again in a new transaction
			case <-holding:
			default:
				close(holding)
			}
			<-release
			return nil, nil
		})
		done <- err
	}()
	<-holding
	var wg, started sync.WaitGroup
	started.Add(callers)
	for i := range callers {
		wg.Go(func() {
			started.Done()
			call(i)
		})
	}
	started.Wait()
	for range 100 {
		runtime.Gosched() // let the callers reach the pipeline's queue
	}
	close(release)
	wg.Wait()
	require.NoError(t, <-done)
}

// TestDoTxSharedCommits runs many concurrent DoTx calls that share commits:
// a third succeed, a third fail, a third panic, each after writing. Every
// successful call's writes (a log entry under a bucket sequence, a data key,
// an outbox message) commit exactly once; every failing or panicking call's
// never. The rounds repeat until the pipeline has re-run functions, so the
// rollback-and-rerun path is known to be exercised.
func TestDoTxSharedCommits(t *testing.T) {
	const callers = 300
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	errFail := errors.New("fn failed")

	var fnRuns, rounds int
	for round := 0; round < 10; round++ {
		rounds++
		var runs atomic.Int64 // instrumentation only: fn must not share memory
		fn := func(i int, key string) func(context.Context, *idem.Tx) ([]byte, error) {
			return func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
				runs.Add(1)
				log, err := tx.Bucket([]byte("log"))
				if err != nil {
					return nil, err
				}
				seq, _ := log.NextSequence()
				if err := log.Put(fmt.Appendf(nil, "%08d", seq), []byte(key)); err != nil {
					return nil, err
				}
				data, err := tx.Bucket([]byte("data"))
				if err != nil {
					return nil, err
				}
				if err := data.Put([]byte(key), []byte("written")); err != nil {
					return nil, err
				}
				if err := tx.Enqueue("t", []byte(key)); err != nil {
					return nil, err
				}
				switch i % 3 {
				case 1:
					return nil, errFail
				case 2:
					panic("fn panicked: " + key)
				}
				return []byte(key), nil
			}
		}

		shareCommits(t, e, fmt.Sprintf("r%d-blocker", round), callers, func(i int) {
			key := fmt.Sprintf("r%d-k%03d", round, i)
			defer func() {
				v := recover()
				if i%3 == 2 {
					var pe *idem.PanicError
					if err, ok := v.(error); !ok || !errors.As(err, &pe) || pe.Value != "fn panicked: "+key {
						t.Errorf("%s: recovered %v, want its own *idem.PanicError", key, v)
					}
				} else if v != nil {
					t.Errorf("%s: unexpected panic %v", key, v)
				}
			}()
			res, err := e.DoTx(context.Background(), key, nil, fn(i, key))
			switch i % 3 {
			case 0:
				if err != nil || string(res.Response) != key {
					t.Errorf("%s: got %q, %v; want its own response", key, res.Response, err)
				}
			case 1:
				if !errors.Is(err, errFail) {
					t.Errorf("%s: err = %v, want errFail", key, err)
				}
			}
		})

		dump := txDump(t, e, "log", "data")
		logged := map[string]int{}
		for _, key := range dump["log"] {
			logged[key]++
		}
		msgs := map[string]int{}
		for _, m := range obMessages(t, e) {
			msgs[string(m.Payload)]++
		}
		for i := range callers {
			key := fmt.Sprintf("r%d-k%03d", round, i)
			want := 0
			if i%3 == 0 {
				want = 1
			}
			require.Equal(t, want, logged[key], "log entries of %s", key)
			require.Equal(t, want, msgs[key], "outbox messages of %s", key)
			_, inData := dump["data"][key]
			require.Equal(t, want == 1, inData, "data of %s", key)
			rec, err := e.Get(key)
			if i%3 == 2 {
				require.ErrorIs(t, err, idem.ErrNotFound, "%s panicked: no record", key)
			} else {
				require.NoError(t, err)
				require.Equal(t, idem.StateDone, rec.State)
				require.Equal(t, i%3 == 1, rec.Err != nil, "%s: stored error", key)
			}
		}
		fnRuns = int(runs.Load())
		if fnRuns > callers {
			break // some fns ran more than once: batches were rolled back and re-run
		}
	}
	s := e.Stats()
	t.Logf("%d round(s); last round %d fn runs for %d calls; %d commits for %d writes", rounds, fnRuns, callers, s.Commits, s.Writes)
	require.Greater(t, fnRuns, callers, "no shared commit was rolled back and re-run in %d rounds", rounds)
}

// A DoTx fn naturally returns what it read ("the new balance"): bytes that
// point into the transaction's memory. The answer and the record must be
// copies, on success and with a permanent error, while other calls write.
func TestDoTxMayReturnBytesReadFromItsTransaction(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	_, err := e.DoTx(bg, "seed", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		b, err := tx.Bucket([]byte("acct"))
		if err != nil {
			return nil, err
		}
		return nil, b.Put([]byte("balance"), []byte("100.00"))
	})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			res, err := e.DoTx(bg, fmt.Sprintf("k%d", i), nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
				b, err := tx.Bucket([]byte("acct"))
				if err != nil {
					return nil, err
				}
				if err := b.Put(fmt.Appendf(nil, "noise-%d", i), make([]byte, 512)); err != nil {
					return nil, err
				}
				if i%2 == 1 {
					return b.Get([]byte("balance")), idem.WithCode(errors.New("insufficient funds"), "insufficient_funds")
				}
				return b.Get([]byte("balance")), nil
			})
			if i%2 == 1 {
				assert.Error(t, err)
			} else {
				assert.NoError(t, err)
			}
			assert.Equal(t, "100.00", string(res.Response))
		})
	}
	wg.Wait()
	for i := range 200 {
		r, err := e.Get(fmt.Sprintf("k%d", i))
		require.NoError(t, err)
		require.Equal(t, "100.00", string(r.Response))
	}
}
