package idem_test

// One test per outcome of a call: the rows of the README's table ("What it
// promises") as Do's documentation spells them out, each test named after
// its case. Process kills are in crash_test.go.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

var bg = context.Background()

// leaderWithWaiters starts a leader whose fn blocks until release is closed,
// then n waiters on the same key, and returns once all n are waiting. The
// outcomes arrive on the returned channels.
type run struct {
	res      idem.Result
	err      error
	panicked any
}

func leaderWithWaiters(t *testing.T, e *idem.Engine, key string, n int, fn func(context.Context) ([]byte, error)) (release chan struct{}, leader chan run, waiters chan run) {
	t.Helper()
	return leaderWithWaitersCtx(t, e, bg, key, n, fn)
}

// leaderWithWaitersCtx is leaderWithWaiters with the leader's context.
func leaderWithWaitersCtx(t *testing.T, e *idem.Engine, ctx context.Context, key string, n int, fn func(context.Context) ([]byte, error)) (release chan struct{}, leader chan run, waiters chan run) {
	t.Helper()
	release = make(chan struct{})
	entered := make(chan struct{})
	leader, waiters = make(chan run, 1), make(chan run, n)
	go func() {
		var r run
		defer func() {
			r.panicked = recover()
			leader <- r
		}()
		r.res, r.err = e.Do(ctx, key, []byte("fp"), func(ctx context.Context) ([]byte, error) {
			close(entered)
			<-release
			return fn(ctx)
		})
	}()
	<-entered
	waitersIn(t, n, func() {
		for range n {
			go func() {
				res, err := e.Do(bg, key, []byte("fp"), func(context.Context) ([]byte, error) {
					return nil, errors.New("a waiter must not run fn")
				})
				waiters <- run{res: res, err: err}
			}()
		}
	})
	return release, leader, waiters
}

// waitersIn runs start and returns once n calls are waiting on a key. For
// n > 0 it counts them at the do-wait failpoint: the test must run in a
// build with failpoints (testkit.Failpoints).
func waitersIn(t *testing.T, n int, start func()) {
	t.Helper()
	if n == 0 {
		start()
		return
	}
	if !fault.Enabled {
		t.Fatalf("waitersIn counts waiters at a failpoint: begin %s with `if !testkit.Failpoints(t) { return }`", t.Name())
	}
	var waiting atomic.Int32
	all := make(chan struct{})
	unset := fault.Set("do-wait", func() error {
		if waiting.Add(1) == int32(n) {
			close(all)
		}
		return nil
	})
	defer unset()
	start()
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatalf("only %d of %d waiters arrived", waiting.Load(), n)
	}
}

func record(t *testing.T, e *idem.Engine, key string) *idem.Record {
	t.Helper()
	r, err := e.Get(key)
	if errors.Is(err, idem.ErrNotFound) {
		return nil
	}
	require.NoError(t, err)
	return r
}

func TestOutcome_FnReturnsResponse(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	e, _ := boltkit.Open(t, nil)
	release, leader, waiters := leaderWithWaiters(t, e, "k", 3, func(context.Context) ([]byte, error) {
		return []byte("order-1"), nil
	})
	close(release)
	l := <-leader
	require.NoError(t, l.err)
	require.Equal(t, "order-1", string(l.res.Response))
	require.False(t, l.res.Replayed)
	for range 3 {
		w := <-waiters
		require.NoError(t, w.err)
		require.Equal(t, "order-1", string(w.res.Response))
	}
	r := record(t, e, "k")
	require.Equal(t, idem.StateDone, r.State)
	require.Equal(t, "order-1", string(r.Response))
	require.Nil(t, r.Err)
}

var errDeclined = errors.New("card declined")

func TestOutcome_FnReturnsPermanentError(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	e, path := boltkit.Open(t, nil)
	release, leader, waiters := leaderWithWaiters(t, e, "k", 2, func(context.Context) ([]byte, error) {
		return nil, idem.WithCode(fmt.Errorf("charge: %w", errDeclined), "card_declined")
	})
	close(release)
	l := <-leader
	var ie *idem.Error
	require.ErrorAs(t, l.err, &ie)
	require.Equal(t, "card_declined", ie.Code)
	require.Equal(t, "charge: card declined", ie.Message)
	require.ErrorIs(t, l.err, errDeclined, "the first call wraps fn's error")
	require.False(t, ie.Replayed)
	for range 2 {
		w := <-waiters
		var we *idem.Error
		require.ErrorAs(t, w.err, &we)
		require.NotSame(t, ie, we, "each caller gets its own *Error")
		require.Equal(t, ie.Code, we.Code)
		require.Equal(t, ie.Message, we.Message)
		require.ErrorIs(t, w.err, errDeclined, "a waiter's error wraps fn's too")
		require.True(t, we.Replayed && w.res.Replayed, "fn did not run in the waiter's call")
	}

	replayed := func(e *idem.Engine) {
		res, err := e.Do(bg, "k", []byte("fp"), mustNotRun(t))
		var re *idem.Error
		require.ErrorAs(t, err, &re)
		require.Equal(t, "card_declined", re.Code)
		require.Equal(t, "charge: card declined", re.Message)
		require.True(t, re.Replayed)
		require.True(t, res.Replayed)
	}
	replayed(e)
	require.NoError(t, e.Close())
	e2, err := idem.Open(path, nil)
	require.NoError(t, err)
	defer e2.Close()
	replayed(e2)
}

func TestOutcome_FnReturnsResponseAndError(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	e, _ := boltkit.Open(t, nil)
	release, leader, waiters := leaderWithWaiters(t, e, "k", 1, func(context.Context) ([]byte, error) {
		return []byte("partial"), errors.New("half done")
	})
	close(release)
	for _, r := range []run{<-leader, <-waiters} {
		require.Equal(t, "partial", string(r.res.Response))
		require.EqualError(t, r.err, "half done")
	}
	res, err := e.Do(bg, "k", []byte("fp"), mustNotRun(t))
	require.True(t, res.Replayed)
	require.Equal(t, "partial", string(res.Response))
	require.EqualError(t, err, "half done")
}

func TestOutcome_FnReturnsRetryable(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	e, _ := boltkit.Open(t, nil)
	errBusy := errors.New("gateway busy")
	release, leader, waiters := leaderWithWaiters(t, e, "k", 2, func(context.Context) ([]byte, error) {
		return nil, idem.Retryable(errBusy)
	})
	close(release)
	for _, r := range []run{<-leader, <-waiters, <-waiters} {
		require.ErrorIs(t, r.err, idem.ErrRetryable)
		require.ErrorIs(t, r.err, errBusy)
	}
	require.Nil(t, record(t, e, "k"), "the key is free")
	res, err := e.Do(bg, "k", []byte("fp"), okFn("second"))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 1, res.Attempt)
}

func TestOutcome_FnReturnsAnErrorAfterItsContextEnded(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	e, _ := boltkit.Open(t, nil)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	release, leader, waiters := leaderWithWaitersCtx(t, e, ctx, "k", 2, func(ctx context.Context) ([]byte, error) {
		cancel() // the caller gives up while fn runs
		return nil, fmt.Errorf("upstream: %w", ctx.Err())
	})
	close(release)
	l := <-leader
	require.ErrorIs(t, l.err, context.Canceled)
	for range 2 {
		require.ErrorIs(t, (<-waiters).err, idem.ErrIncomplete)
	}
	r := record(t, e, "k")
	require.Equal(t, idem.StateStarted, r.State, "unknown outcome: stays started")

	// The default policy re-executes, telling fn it recovers attempt 1.
	var got idem.Call
	res, err := e.Do(bg, "k", []byte("fp"), func(ctx context.Context) ([]byte, error) {
		got, _ = idem.CallFrom(ctx)
		return []byte("ok"), nil
	})
	require.NoError(t, err)
	require.Equal(t, idem.Call{Key: "k", Attempt: 2, Recovered: true}, got)
	require.Equal(t, 2, res.Attempt)
}

func TestOutcome_FnReturnsAContextErrorOfItsOwnMaking(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	e, _ := boltkit.Open(t, nil)
	release, leader, waiters := leaderWithWaiters(t, e, "k", 2, func(context.Context) ([]byte, error) {
		return nil, idem.WithCode(fmt.Errorf("gateway: %w", context.DeadlineExceeded), "downstream_timeout")
	})
	close(release)
	l := <-leader
	require.ErrorIs(t, l.err, context.DeadlineExceeded)
	for _, r := range []run{l, <-waiters, <-waiters} {
		var ie *idem.Error
		require.ErrorAs(t, r.err, &ie)
		require.Equal(t, "downstream_timeout", ie.Code)
	}
	r := record(t, e, "k")
	require.Equal(t, idem.StateDone, r.State, "an outcome: stored")
	require.Equal(t, "downstream_timeout", r.Err.Code)
}

func TestOutcome_FnPanics(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	e, _ := boltkit.Open(t, nil)
	release, leader, waiters := leaderWithWaiters(t, e, "k", 2, func(context.Context) ([]byte, error) {
		panic("boom")
	})
	close(release)
	require.Equal(t, "boom", (<-leader).panicked, "the caller gets the panic")
	for range 2 {
		require.ErrorIs(t, (<-waiters).err, idem.ErrIncomplete)
	}
	require.Equal(t, idem.StateStarted, record(t, e, "k").State, "stays started, as after a crash")
}

func TestOutcome_ResponseLargerThanLimit(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	e, path := boltkit.Open(t, &idem.Options{MaxResponseSize: 8})
	release, leader, waiters := leaderWithWaiters(t, e, "k", 1, func(context.Context) ([]byte, error) {
		return []byte("123456789"), nil
	})
	close(release)
	for _, r := range []run{<-leader, <-waiters} {
		require.ErrorIs(t, r.err, idem.ErrResponseTooLarge)
		require.Nil(t, r.res.Response, "never truncated")
	}
	r := record(t, e, "k")
	require.Equal(t, idem.StateDone, r.State)
	require.Nil(t, r.Response)
	require.ErrorIs(t, r.Err, idem.ErrResponseTooLarge)

	require.NoError(t, e.Close())
	e2, err := idem.Open(path, &idem.Options{MaxResponseSize: 8})
	require.NoError(t, err)
	defer e2.Close()
	res, err := e2.Do(bg, "k", []byte("fp"), mustNotRun(t))
	require.ErrorIs(t, err, idem.ErrResponseTooLarge, "replayed, also after a restart")
	require.True(t, res.Replayed)
}

func TestOutcome_CallerContextCancelledBeforeStartedCommit(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	_, err := e.Do(ctx, "k", []byte("fp"), mustNotRun(t))
	require.ErrorIs(t, err, context.Canceled)
	require.Nil(t, record(t, e, "k"), "nothing stored")
}

func TestOutcome_CallerContextCancelledAfterStartedCommitBeforeFnStarts(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	e, _ := boltkit.Open(t, nil)
	ctx, cancel := context.WithCancel(bg)
	var once sync.Once
	waiter := make(chan run, 1)
	unset := fault.Set("do-after-started", func() error {
		once.Do(func() {
			// A duplicate arrives and waits, then the leader's caller gives up.
			waitersIn(t, 1, func() {
				go func() {
					res, err := e.Do(bg, "k", []byte("fp"), okFn("from the waiter"))
					waiter <- run{res: res, err: err}
				}()
			})
			cancel()
		})
		return nil
	})
	defer unset()
	_, err := e.Do(ctx, "k", []byte("fp"), mustNotRun(t))
	require.ErrorIs(t, err, context.Canceled)
	w := <-waiter
	require.NoError(t, w.err, "the waiter became the new leader")
	require.Equal(t, "from the waiter", string(w.res.Response))
	require.Equal(t, 1, w.res.Attempt, "the cancelled leader's started record was deleted")
}

func TestOutcome_CallerContextCancelledAfterFnReturned(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	ctx, cancel := context.WithCancel(bg)
	res, err := e.Do(ctx, "k", []byte("fp"), func(context.Context) ([]byte, error) {
		cancel()
		return []byte("done anyway"), nil
	})
	require.NoError(t, err)
	require.Equal(t, "done anyway", string(res.Response))
	r := record(t, e, "k")
	require.Equal(t, idem.StateDone, r.State)
}

func TestOutcome_WaiterContextCancelledWhileWaiting(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	e, _ := boltkit.Open(t, nil)
	release, leader, waiters := leaderWithWaiters(t, e, "k", 1, okFn("v"))
	ctx, cancel := context.WithCancel(bg)
	mine := make(chan error, 1)
	waitersIn(t, 1, func() {
		go func() {
			_, err := e.Do(ctx, "k", []byte("fp"), mustNotRun(t))
			mine <- err
		}()
	})
	cancel()
	require.ErrorIs(t, <-mine, context.Canceled)
	close(release)
	require.NoError(t, (<-leader).err, "the leader is unaffected")
	require.NoError(t, (<-waiters).err, "the other waiter is unaffected")
	require.Equal(t, idem.StateDone, record(t, e, "k").State)
}

func TestPanicReachesCaller(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	v := func() (v any) {
		defer func() { v = recover() }()
		_, _ = e.Do(bg, "k", []byte("fp"), func(context.Context) ([]byte, error) { panic("boom") })
		return nil
	}()
	require.Equal(t, "boom", v, "the panic value reaches the caller unchanged")
	r := record(t, e, "k")
	require.Equal(t, idem.StateStarted, r.State, "no done record")
	// The lock is released: the next call leads and recovers.
	res, err := e.Do(bg, "k", []byte("fp"), okFn("ok"))
	require.NoError(t, err)
	require.Equal(t, 2, res.Attempt)
}

// interrupt calls Do with a fn whose own context ends while it runs (its
// caller gives up): fn's error is an interruption, and the key is left with an
// interrupted execution. It returns Do's answer (context.Canceled).
func interrupt(e *idem.Engine, key string, fingerprint []byte) (idem.Result, error) {
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	return e.Do(ctx, key, fingerprint, func(ctx context.Context) ([]byte, error) {
		cancel()
		return nil, ctx.Err()
	})
}

func mustNotRun(t *testing.T) func(context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) {
		t.Error("fn ran but must not")
		return nil, errors.New("must not run")
	}
}

func okFn(s string) func(context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) { return []byte(s), nil }
}

// TestOutcome_FailedCallCarriesNoResponse: a call that fails after fn ran
// (its done commit failed, or its answer was lost) returns no
// Result.Response: fn's bytes are an outcome the caller cannot rely on
// (never stored, or not known to be), for Do, DoJSON and DoTx, and for the
// waiter of the failed call. The file's MaxSize makes a real commit fail
// (ErrFileFull); the failpoints stand for a failed commit and for one whose
// answer is lost.
func TestOutcome_FailedCallCarriesNoResponse(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	big := []byte(strings.Repeat("x", 2<<20))
	fullFile, full := &idem.BoltOptions{MaxSize: 1 << 20}, &idem.Options{MaxResponseSize: 8 << 20, PruneInterval: -1}
	noResponse := func(t *testing.T, res idem.Result, msg string, args ...any) {
		t.Helper()
		assert.True(t, res.Response == nil, "%s: the failed call returned %d bytes of response", fmt.Sprintf(msg, args...), len(res.Response))
	}

	t.Run("Do: the done commit fails, with a waiter", func(t *testing.T) {
		e, _ := boltkit.OpenFile(t, fullFile, full)
		release, leader, waiters := leaderWithWaiters(t, e, "k", 1, func(context.Context) ([]byte, error) { return big, nil })
		close(release)
		for i, r := range []run{<-leader, <-waiters} {
			require.Error(t, r.err)
			noResponse(t, r.res, "call %d (0: the caller, 1: its waiter)", i)
		}
	})

	t.Run("DoJSON: the done commit fails", func(t *testing.T) {
		e, _ := boltkit.OpenFile(t, fullFile, full)
		v, res, err := idem.DoJSON(bg, e, "k", "args", func(context.Context) (string, error) { return string(big), nil })
		require.ErrorIs(t, err, idem.ErrFileFull)
		noResponse(t, res, "DoJSON")
		assert.True(t, v == "", "DoJSON returned a value of %d bytes beside its error: it was never stored", len(v))
	})

	t.Run("DoTx: the commit fails", func(t *testing.T) {
		e, _ := boltkit.OpenFile(t, fullFile, full)
		res, err := e.DoTx(bg, "k", []byte("fp"), func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
			b, err := tx.Bucket([]byte("orders"))
			if err != nil {
				return nil, err
			}
			return []byte("booked"), b.Put([]byte("order-1"), big)
		})
		require.ErrorIs(t, err, idem.ErrFileFull)
		noResponse(t, res, "DoTx")
		require.Nil(t, record(t, e, "k"), "nothing committed")
	})

	for _, point := range []string{"do-after-fn", "do-after-done", "dotx-before-commit", "dotx-after-commit"} {
		t.Run(point+" fails", func(t *testing.T) {
			e, _ := boltkit.Open(t, nil)
			unset := fault.Set(point, func() error { return fault.ErrInjected })
			defer unset()
			var res idem.Result
			var err error
			if strings.HasPrefix(point, "dotx-") {
				res, err = e.DoTx(bg, "k", []byte("fp"), func(context.Context, *idem.Tx) ([]byte, error) { return []byte("booked"), nil })
			} else {
				res, err = e.Do(bg, "k", []byte("fp"), okFn("paid"))
			}
			require.ErrorIs(t, err, fault.ErrInjected)
			noResponse(t, res, "%s", point)
		})
	}
}
