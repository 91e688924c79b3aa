package idemtest

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idem/idemcore"
)

var bg = context.Background()

// fp is the fingerprint of the suite's calls, unless a case says otherwise.
var fp = []byte(`{"sku":"A1","qty":2}`)

// fnTx is a call's fn in either form: for Do, tx is T's zero value.
type fnTx[T any] func(ctx context.Context, tx T) ([]byte, error)

// via names the engine method a case calls.
type via bool

const (
	viaDo   via = false
	viaDoTx via = true
)

func (v via) String() string {
	if v == viaDoTx {
		return "DoTx"
	}
	return "Do"
}

// call calls e.Do or e.DoTx with fn.
func call[T any](ctx context.Context, e Engine[T], v via, key string, fingerprint []byte, fn fnTx[T]) (idemcore.Result, error) {
	if v == viaDoTx {
		return e.DoTx(ctx, key, fingerprint, fn)
	}
	return e.Do(ctx, key, fingerprint, func(ctx context.Context) ([]byte, error) {
		var zero T
		return fn(ctx, zero)
	})
}

// outcome is what one call returned, or the value it panicked with.
type outcome struct {
	res      idemcore.Result
	err      error
	panicked any
}

// callRecovering is call, with a panic caught into the outcome.
func callRecovering[T any](ctx context.Context, e Engine[T], v via, key string, fingerprint []byte, fn fnTx[T]) (o outcome) {
	defer func() { o.panicked = recover() }()
	o.res, o.err = call(ctx, e, v, key, fingerprint, fn)
	return o
}

// ok is a fn that returns resp.
func ok[T any](resp string) fnTx[T] {
	return func(context.Context, T) ([]byte, error) { return []byte(resp), nil }
}

// errMustNotRun is what a fn that must not run returns if it runs.
var errMustNotRun = errors.New("idemtest: this fn must not run")

// mustNotRun is a fn that fails the test if it runs.
func mustNotRun[T any](t testing.TB) fnTx[T] {
	return func(context.Context, T) ([]byte, error) {
		t.Error("fn ran but must not")
		return nil, errMustNotRun
	}
}

// leaderWithWaiters starts a leader on key whose fn blocks until release is
// closed and then runs fn, and n waiters on the same key (their fn is waiter,
// or one that must not run); it returns once all n wait. The outcomes arrive
// on the returned channels.
func (s *suite[T]) leaderWithWaiters(t testing.TB, e Engine[T], v via, key string, n int, fn, waiter fnTx[T]) (release chan struct{}, leader, waiters chan outcome) {
	t.Helper()
	return s.leaderWithWaitersCtx(bg, t, e, v, key, n, fn, waiter)
}

// leaderWithWaitersCtx is leaderWithWaiters with the leader's ctx.
func (s *suite[T]) leaderWithWaitersCtx(ctx context.Context, t testing.TB, e Engine[T], v via, key string, n int, fn, waiter fnTx[T]) (release chan struct{}, leader, waiters chan outcome) {
	t.Helper()
	if waiter == nil {
		waiter = mustNotRun[T](t)
	}
	release = make(chan struct{})
	entered := make(chan struct{})
	leader, waiters = make(chan outcome, 1), make(chan outcome, n)
	var once bool
	go func() {
		leader <- callRecovering(ctx, e, v, key, fp, func(ctx context.Context, tx T) ([]byte, error) {
			if !once { // a DoTx fn may run again: block only the first time
				once = true
				close(entered)
				<-release
			}
			return fn(ctx, tx)
		})
	}()
	select {
	case <-entered:
	case o := <-leader:
		t.Fatalf("the leader returned before its fn ran: %v (panic %v)", o.err, o.panicked)
	}
	s.waitersIn(t, n, func() {
		for range n {
			go func() { waiters <- callRecovering(bg, e, v, key, fp, waiter) }()
		}
	})
	return release, leader, waiters
}

// record returns key's live record, nil if it has none.
func record[T any](t testing.TB, e Engine[T], key string) *idemcore.Record {
	t.Helper()
	r, err := e.Get(key)
	if errors.Is(err, idemcore.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return r
}

// callFrom reads the Call of fn's context, failing the test if it has none.
func callFrom(t testing.TB, ctx context.Context) idemcore.Call {
	c, ok := idemcore.CallFrom(ctx)
	if !ok {
		t.Error("fn's context carries no idemcore.Call")
	}
	return c
}

// records returns every live record of e, by key.
func records[T any](t testing.TB, e Engine[T]) map[string]*idemcore.Record {
	t.Helper()
	m := map[string]*idemcore.Record{}
	if err := e.Records(func(r *idemcore.Record, err error) error {
		if err != nil {
			return err
		}
		m[r.Key] = r
		return nil
	}); err != nil {
		t.Fatalf("records: %v", err)
	}
	return m
}

// wantCall checks the Call of fn's context. It may run on any goroutine (a
// DoTx fn runs on the committer's): it reports with t.Errorf, never FailNow.
func wantCall(t testing.TB, ctx context.Context, want idemcore.Call, msg ...any) {
	t.Helper()
	if got := callFrom(t, ctx); got != want {
		t.Errorf("fn's Call = %+v, want %+v %v", got, want, msg)
	}
}
