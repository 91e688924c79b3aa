package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"go.uber.org/goleak"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

func TestMain(m *testing.M) {
	idemtest.ChildMain()
	code := testkit.Main(m, crashChildren)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// The basic promises: the same key twice gives one side effect and the same
// answer; the same key with other arguments is refused, in every state.

func TestSameKeyTwiceGivesSameOrderAndOneSideEffect(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	var charges atomic.Int32
	createOrder := func(context.Context) ([]byte, error) {
		n := charges.Add(1)
		return fmt.Appendf(nil, `{"order":"ord_%d","charged":true}`, n), nil
	}
	first, err := e.Do(bg, "order-7f3a", []byte(`{"sku":"A1","qty":2}`), createOrder)
	require.NoError(t, err)
	second, err := e.Do(bg, "order-7f3a", []byte(`{"sku":"A1","qty":2}`), createOrder)
	require.NoError(t, err)
	require.Equal(t, first.Response, second.Response)
	require.True(t, second.Replayed)
	require.EqualValues(t, 1, charges.Load())
}

func TestSameKeyWithDifferentArgumentsIsRejected(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	_, err := e.Do(bg, "order-7f3a", []byte(`{"sku":"A1","qty":2}`), okFn("ord_1"))
	require.NoError(t, err)
	_, err = e.Do(bg, "order-7f3a", []byte(`{"sku":"A1","qty":3}`), mustNotRun(t))
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	require.Equal(t, "ord_1", string(record(t, e, "order-7f3a").Response), "the record is untouched")
}

// The third, a crash between the side effect and the log write, is
// TestCrashAfterSideEffectIsRecovered in crash_test.go.

func TestFingerprintMismatchInEveryState(t *testing.T) {
	t.Run("done", func(t *testing.T) {
		e, _ := boltkit.Open(t, nil)
		_, err := e.Do(bg, "k", []byte("a"), okFn("v"))
		require.NoError(t, err)
		_, err = e.Do(bg, "k", []byte("b"), mustNotRun(t))
		require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	})
	t.Run("done with a stored error", func(t *testing.T) {
		e, _ := boltkit.Open(t, nil)
		_, err := e.Do(bg, "k", []byte("a"), func(context.Context) ([]byte, error) { return nil, errors.New("no") })
		require.Error(t, err)
		_, err = e.Do(bg, "k", []byte("b"), mustNotRun(t))
		require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	})
	t.Run("in progress", func(t *testing.T) {
		e, _ := boltkit.Open(t, nil)
		release, leader, _ := leaderWithWaiters(t, e, "k", 0, okFn("v"))
		_, err := e.Do(bg, "k", []byte("other"), mustNotRun(t))
		require.ErrorIs(t, err, idem.ErrFingerprintMismatch, "even while the first call runs")
		close(release)
		require.NoError(t, (<-leader).err)
	})
	t.Run("interrupted", func(t *testing.T) {
		e, _ := boltkit.Open(t, nil)
		_, err := interrupt(e, "k", []byte("a"))
		require.ErrorIs(t, err, context.Canceled)
		_, err = e.Do(bg, "k", []byte("b"), mustNotRun(t))
		require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
		r := record(t, e, "k")
		require.Equal(t, idem.StateStarted, r.State)
		require.Equal(t, 1, r.Attempt, "the record is untouched")
	})
	t.Run("dotx done", func(t *testing.T) {
		e, _ := boltkit.Open(t, nil)
		_, err := e.DoTx(bg, "k", []byte("a"), func(context.Context, *idem.Tx) ([]byte, error) { return []byte("v"), nil })
		require.NoError(t, err)
		_, err = e.DoTx(bg, "k", []byte("b"), func(context.Context, *idem.Tx) ([]byte, error) { return nil, nil })
		require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	})
}

func TestInvalidKeys(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	for _, tc := range []struct {
		name, key string
	}{
		{"empty", ""},
		{"256 bytes", strings.Repeat("k", 256)},
		{"255 bytes of which the last rune is cut", strings.Repeat("k", 254) + "\xc3"},
		{"invalid UTF-8", "order-\xff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Do(bg, tc.key, nil, mustNotRun(t))
			require.ErrorIs(t, err, idem.ErrInvalidKey)
			_, err = e.DoTx(bg, tc.key, nil, func(context.Context, *idem.Tx) ([]byte, error) { return nil, nil })
			require.ErrorIs(t, err, idem.ErrInvalidKey)
		})
	}
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Zero(t, st.Started+st.Done, "nothing stored")

	t.Run("255 bytes is accepted", func(t *testing.T) {
		key := strings.Repeat("é", 127) + "k" // 255 bytes
		require.Len(t, key, 255)
		_, err := e.Do(bg, key, nil, okFn("v"))
		require.NoError(t, err)
	})
}

func TestThousandCallersOneKeyRunFnOnce(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	var runs atomic.Int32
	fn := func(context.Context) ([]byte, error) {
		runs.Add(1)
		return bytes.Repeat([]byte("x"), 300), nil
	}
	const n = 1000
	got := make([][]byte, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := e.Do(bg, "one", []byte("fp"), fn)
			assert.NoError(t, err)
			got[i] = res.Response
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, runs.Load())
	for i := range got {
		require.Equal(t, got[0], got[i])
	}
	got[0][0] = 'y' // each caller owns its bytes
	require.NotEqual(t, got[0], got[1])
}

func TestThousandKeysAreNotSerialised(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	const n = 1000
	var inside atomic.Int32
	all := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := e.Do(bg, fmt.Sprintf("key-%d", i), nil, func(context.Context) ([]byte, error) {
				// Every fn waits until all n are running at once: if calls on
				// different keys were serialised, none could return.
				if inside.Add(1) == n {
					close(all)
				}
				select {
				case <-all:
					return nil, nil
				case <-time.After(30 * time.Second):
					return nil, errors.New("calls on distinct keys were serialised")
				}
			})
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	require.EqualValues(t, n, inside.Load())
}

func TestInFlightFailReturnsErrInProgress(t *testing.T) {
	e, _ := boltkit.Open(t, &idem.Options{InFlight: idem.InFlightFail})
	release, leader, _ := leaderWithWaiters(t, e, "k", 0, okFn("v"))
	_, err := e.Do(bg, "k", []byte("fp"), mustNotRun(t))
	require.ErrorIs(t, err, idem.ErrInProgress)
	close(release)
	require.NoError(t, (<-leader).err)
	res, err := e.Do(bg, "k", []byte("fp"), mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed)
}

func TestRecoverRefuseUntilResolved(t *testing.T) {
	e, path := boltkit.Open(t, &idem.Options{Recovery: idem.RecoverRefuse})
	_, err := interrupt(e, "k", []byte("fp"))
	require.ErrorIs(t, err, context.Canceled)
	_, err = e.Do(bg, "k", []byte("fp"), mustNotRun(t))
	require.ErrorIs(t, err, idem.ErrIncomplete)

	require.ErrorIs(t, e.Resolve("missing", nil, nil), idem.ErrNotFound)
	require.NoError(t, e.Resolve("k", []byte("settled by hand"), nil))
	require.ErrorIs(t, e.Resolve("k", nil, nil), idem.ErrState)
	res, err := e.Do(bg, "k", []byte("fp"), mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, "settled by hand", string(res.Response))
	_ = path
}

func TestResolveWithStoredError(t *testing.T) {
	e, _ := boltkit.Open(t, &idem.Options{Recovery: idem.RecoverRefuse})
	_, _ = interrupt(e, "k", nil)
	require.NoError(t, e.Resolve("k", nil, &idem.Error{Code: "refunded", Message: "the charge was refunded by hand"}))
	_, err := e.Do(bg, "k", nil, mustNotRun(t))
	var ie *idem.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "refunded", ie.Code)
}

func TestForget(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	_, err := e.Do(bg, "k", []byte("a"), okFn("v1"))
	require.NoError(t, err)
	require.NoError(t, e.Forget("k"))
	require.ErrorIs(t, e.Forget("k"), idem.ErrNotFound)
	res, err := e.Do(bg, "k", []byte("b"), okFn("v2"))
	require.NoError(t, err, "a forgotten key is new, whatever the fingerprint")
	require.False(t, res.Replayed)

	release, leader, _ := leaderWithWaiters(t, e, "busy", 0, okFn("v"))
	require.ErrorIs(t, e.Forget("busy"), idem.ErrInProgress)
	close(release)
	require.NoError(t, (<-leader).err)
}

func TestGetHasNoSideEffects(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	_, err := e.Get("k")
	require.ErrorIs(t, err, idem.ErrNotFound)
	_, err = interrupt(e, "k", []byte("fp"))
	require.ErrorIs(t, err, context.Canceled)
	for range 2 {
		r, err := e.Get("k")
		require.NoError(t, err)
		require.Equal(t, idem.StateStarted, r.State)
		require.Equal(t, 1, r.Attempt, "Get does not recover")
	}
}

func TestNilAndEmptyResponsesDiffer(t *testing.T) {
	e, path := boltkit.Open(t, nil)
	_, err := e.Do(bg, "nil", nil, func(context.Context) ([]byte, error) { return nil, nil })
	require.NoError(t, err)
	_, err = e.Do(bg, "empty", nil, func(context.Context) ([]byte, error) { return []byte{}, nil })
	require.NoError(t, err)
	require.NoError(t, e.Close())
	e2, err := idem.Open(path, nil)
	require.NoError(t, err)
	defer e2.Close()
	r, err := e2.Do(bg, "nil", nil, mustNotRun(t))
	require.NoError(t, err)
	require.Nil(t, r.Response)
	r, err = e2.Do(bg, "empty", nil, mustNotRun(t))
	require.NoError(t, err)
	require.NotNil(t, r.Response)
	require.Empty(t, r.Response)
}

func TestSecondOpenTimesOut(t *testing.T) {
	e, path := boltkit.OpenFile(t, &idem.BoltOptions{LockTimeout: 50 * time.Millisecond}, nil)
	_ = e
	_, err := idem.OpenFile(path, &idem.BoltOptions{LockTimeout: 50 * time.Millisecond}, nil)
	require.ErrorIs(t, err, bolterrors.ErrTimeout)
	require.Contains(t, err.Error(), "in use")
}

func TestOpenRefusesFutureFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "future.db")
	e, err := idem.Open(path, nil)
	require.NoError(t, err)
	require.NoError(t, e.Close())
	db, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("idem")).Bucket([]byte("meta")).Put([]byte("version"), []byte{0, 0, 0, 9})
	}))
	require.NoError(t, db.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	_, err = idem.Open(path, nil)
	require.ErrorIs(t, err, idem.ErrFormat)
	require.Contains(t, err.Error(), "version 9")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, before, after, "the file is left as it was")
}

func TestClose(t *testing.T) {
	t.Run("is idempotent and Do after it fails", func(t *testing.T) {
		e, _ := boltkit.Open(t, nil)
		require.NoError(t, e.Close())
		require.NoError(t, e.Close())
		_, err := e.Do(bg, "k", nil, mustNotRun(t))
		require.ErrorIs(t, err, idem.ErrClosed)
		_, err = e.Get("k")
		require.ErrorIs(t, err, idem.ErrClosed)
	})
	t.Run("cancels running fns and waits for them", func(t *testing.T) {
		e, _ := boltkit.Open(t, nil)
		entered := make(chan struct{})
		var fnReturned atomic.Bool
		out := make(chan error, 1)
		go func() {
			_, err := e.Do(bg, "k", nil, func(ctx context.Context) ([]byte, error) {
				close(entered)
				<-ctx.Done()
				fnReturned.Store(true)
				return nil, ctx.Err()
			})
			out <- err
		}()
		<-entered
		require.NoError(t, e.Close())
		require.True(t, fnReturned.Load(), "Close returned before the running fn")
		require.ErrorIs(t, <-out, context.Canceled)
	})
	t.Run("shutdown bounds the wait", func(t *testing.T) {
		e, _ := boltkit.Open(t, nil)
		entered, release := make(chan struct{}), make(chan struct{})
		go func() {
			_, _ = e.Do(bg, "k", nil, func(ctx context.Context) ([]byte, error) {
				close(entered)
				<-release // ignores its context
				return nil, nil
			})
		}()
		<-entered
		ctx, cancel := context.WithCancel(bg)
		cancel()
		require.ErrorIs(t, e.Shutdown(ctx), context.Canceled)
		close(release)
		require.NoError(t, e.Close(), "the engine finishes closing once the call returns")
	})
}

func TestStatsCountsRecordsAndWork(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	_, _ = e.Do(bg, "a", []byte("1"), okFn("v"))
	_, _ = e.Do(bg, "a", []byte("1"), okFn("v"))
	_, _ = e.Do(bg, "a", []byte("2"), okFn("v"))
	_, _ = interrupt(e, "b", nil)
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 1, st.Done)
	require.Equal(t, 1, st.Started)
	require.EqualValues(t, 2, e.Stats().Executions)
	require.EqualValues(t, 1, e.Stats().Replays)
	require.EqualValues(t, 1, e.Stats().Conflicts)
	require.Positive(t, st.FileSize)
}

func TestBackupIsAConsistentCopy(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	_, err := e.Do(bg, "k", []byte("fp"), okFn("v"))
	require.NoError(t, err)
	dst := filepath.Join(t.TempDir(), "backup.db")
	require.NoError(t, e.BackupFile(dst))
	boltkit.Check(t, dst)
	b, err := idem.Open(dst, nil)
	require.NoError(t, err)
	defer b.Close()
	res, err := b.Do(bg, "k", []byte("fp"), mustNotRun(t))
	require.NoError(t, err)
	require.Equal(t, "v", string(res.Response))
}

func TestReentrantCallsFail(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	_, err := e.DoTx(bg, "outer", nil, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		_, err := e.Do(ctx, "inner", nil, okFn("v"))
		return nil, err
	})
	require.ErrorIs(t, err, idem.ErrReentrant)
	_, err = e.Do(bg, "self", nil, func(ctx context.Context) ([]byte, error) {
		_, err := e.Do(ctx, "self", nil, okFn("v"))
		return nil, err
	})
	require.ErrorIs(t, err, idem.ErrReentrant)
	res, err := e.Do(bg, "outer2", nil, func(ctx context.Context) ([]byte, error) {
		r, err := e.Do(ctx, "inner2", nil, okFn("nested"))
		return r.Response, err
	})
	require.NoError(t, err, "Do from Do's fn with another key is fine")
	require.Equal(t, "nested", string(res.Response))
}

func TestFingerprintIsCanonical(t *testing.T) {
	a, err := idem.Fingerprint(map[string]any{"b": 1, "a": []any{"x", map[string]any{"z": 1, "y": 2}}})
	require.NoError(t, err)
	b, err := idem.Fingerprint(map[string]any{"a": []any{"x", map[string]any{"y": 2, "z": 1}}, "b": 1})
	require.NoError(t, err)
	require.Equal(t, a, b)
	type args struct {
		B int    `json:"b"`
		A []any  `json:"a"`
		C string `json:"c,omitempty"`
	}
	c, err := idem.Fingerprint(args{B: 1, A: []any{"x", map[string]int{"z": 1, "y": 2}}})
	require.NoError(t, err)
	require.Equal(t, a, c, "a struct and a map with the same JSON give the same bytes")
	d, err := idem.Fingerprint(map[string]any{"b": 2, "a": []any{"x"}})
	require.NoError(t, err)
	require.NotEqual(t, a, d)
	_, err = idem.Fingerprint(make(chan int))
	require.Error(t, err)
}

func TestDoJSON(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	type order struct {
		ID    string  `json:"id"`
		Total float64 `json:"total"`
	}
	runs := 0
	place := func(context.Context) (order, error) { runs++; return order{"ord_1", 12.5}, nil }
	args := map[string]any{"sku": "A1", "qty": 2}
	o1, r1, err := idem.DoJSON(bg, e, "k", args, place)
	require.NoError(t, err)
	o2, r2, err := idem.DoJSON(bg, e, "k", map[string]any{"qty": 2, "sku": "A1"}, place)
	require.NoError(t, err)
	require.Equal(t, o1, o2)
	require.False(t, r1.Replayed)
	require.True(t, r2.Replayed)
	require.Equal(t, 1, runs)
	_, _, err = idem.DoJSON(bg, e, "k", map[string]any{"qty": 3, "sku": "A1"}, place)
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
}

func TestReadOnlyOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	e, err := idem.Open(path, nil)
	require.NoError(t, err)
	_, err = e.Do(bg, "k", []byte("fp"), okFn("v"))
	require.NoError(t, err)
	require.NoError(t, e.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	ro, err := idem.OpenFile(path, &idem.BoltOptions{ReadOnly: true}, nil)
	require.NoError(t, err)
	ro2, err := idem.OpenFile(path, &idem.BoltOptions{ReadOnly: true}, nil)
	require.NoError(t, err, "read-only opens share the file")
	require.NoError(t, ro2.Close())
	res, err := ro.Do(bg, "k", []byte("fp"), mustNotRun(t))
	require.NoError(t, err, "a replay needs no write")
	require.True(t, res.Replayed)
	_, err = ro.Do(bg, "new", nil, mustNotRun(t))
	require.ErrorIs(t, err, bolterrors.ErrDatabaseReadOnly)
	st, err := ro.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 1, st.Done)
	require.NoError(t, ro.Close())
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, before, after, "a read-only open changes nothing")

	_, err = idem.OpenFile(filepath.Join(t.TempDir(), "missing.db"), &idem.BoltOptions{ReadOnly: true}, nil)
	require.ErrorIs(t, err, os.ErrNotExist, "a read-only open creates nothing")
}

func TestCallerOwnsItsResponseBytes(t *testing.T) {
	for _, size := range []int{-1, 0} { // replay cache off, on
		t.Run(fmt.Sprintf("replay cache size %d", size), func(t *testing.T) {
			e, _ := boltkit.Open(t, &idem.Options{ReplayCacheBytes: size})
			buf := []byte("original")
			first, err := e.Do(bg, "k", nil, func(context.Context) ([]byte, error) { return buf, nil })
			require.NoError(t, err)
			copy(first.Response, "CHANGED!")
			copy(buf, "CHANGED!")
			second, err := e.Do(bg, "k", nil, mustNotRun(t))
			require.NoError(t, err)
			require.Equal(t, "original", string(second.Response))
			copy(second.Response, "CHANGED!")
			third, err := e.Do(bg, "k", nil, mustNotRun(t))
			require.NoError(t, err)
			require.Equal(t, "original", string(third.Response))
		})
	}
}

// Engine calls from inside a DoTx fn (which holds the single writer) fail
// with ErrReentrant instead of waiting for themselves, whatever context they
// are given.
func TestEngineCallsFromInsideDoTxAreReentrant(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	_, err := e.Do(bg, "done", nil, okFn("v"))
	require.NoError(t, err)
	calls := map[string]func() error{
		"Do with a fresh context": func() error {
			_, err := e.Do(context.Background(), "other", nil, okFn("v"))
			return err
		},
		"Forget":    func() error { return e.Forget("done") },
		"Resolve":   func() error { return e.Resolve("done", nil, nil) },
		"Prune":     func() error { _, err := e.Prune(context.Background()); return err },
		"ScanFile":  func() error { _, err := e.ScanFile(); return err },
		"RetryDead": func() error { return e.RetryDead(1) },
		"DropDead":  func() error { return e.DropDead(1) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			var inner error
			_, err := e.DoTx(bg, "outer "+name, nil, func(context.Context, *idem.Tx) ([]byte, error) {
				inner = call()
				return nil, nil
			})
			require.NoError(t, err)
			require.ErrorIs(t, inner, idem.ErrReentrant)
		})
	}
	res, err := e.Do(bg, "done", nil, mustNotRun(t))
	require.NoError(t, err, "the engine still works")
	require.True(t, res.Replayed)
}

func TestGoexitInsideDoTxLeavesTheEngineWorking(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_, _ = e.DoTx(bg, "k", nil, func(context.Context, *idem.Tx) ([]byte, error) {
			runtime.Goexit() // what t.FailNow and require do
			return nil, nil
		})
	}()
	<-exited
	res, err := e.Do(bg, "other", nil, okFn("v"))
	require.NoError(t, err)
	require.Equal(t, "v", string(res.Response))
	_, err = e.DoTx(bg, "k", nil, func(context.Context, *idem.Tx) ([]byte, error) { return []byte("again"), nil })
	require.NoError(t, err, "nothing was committed for the exited call: the key is free")
}

func TestInProgressErrorCarriesRetryAfter(t *testing.T) {
	e, _ := boltkit.Open(t, &idem.Options{InFlight: idem.InFlightFail, RetryAfter: 3 * time.Second})
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), "k", nil, func(context.Context) ([]byte, error) {
			close(entered)
			<-release
			return []byte("ok"), nil
		})
		done <- err
	}()
	<-entered
	_, err := e.Do(context.Background(), "k", nil, func(context.Context) ([]byte, error) { return nil, nil })
	close(release)
	var ip *idem.InProgressError
	if !errors.As(err, &ip) || !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("duplicate: %v, want an *InProgressError matching ErrInProgress", err)
	}
	if ip.RetryAfter != 3*time.Second || ip.StartedAt.IsZero() {
		t.Fatalf("InProgressError = %+v, want RetryAfter 3s and a start time", ip)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
