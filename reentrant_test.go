package idem_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// returns runs call on a goroutine of its own and gives its error, or fails
// the test if it is still waiting after 10 s (a self-deadlock would wait
// forever).
func returns(t *testing.T, call func() error) error {
	t.Helper()
	out := make(chan error, 1)
	go func() { out <- call() }()
	select {
	case err := <-out:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the call deadlocked")
		return nil
	}
}

// A call with fn's own key from the goroutine running fn would wait for
// itself: whatever context it passes, it returns ErrReentrant.
func TestCallWithItsOwnKeyFromFnIsReentrant(t *testing.T) {
	fresh := map[string]func(ctx context.Context) context.Context{
		"fn's context":                    func(ctx context.Context) context.Context { return ctx },
		"context.Background()":            func(context.Context) context.Context { return context.Background() },
		"a detached copy of fn's context": context.WithoutCancel,
	}
	for _, policy := range []idem.InFlightPolicy{idem.InFlightWait, idem.InFlightFail} {
		for ctxName, ctxOf := range fresh {
			for _, outer := range doers {
				for _, inner := range doers {
					name := outer.name + " calls " + inner.name + " with " + ctxName
					if policy == idem.InFlightFail {
						name += " under InFlightFail"
					}
					t.Run(name, func(t *testing.T) {
						e, _ := boltkit.Open(t, &idem.Options{InFlight: policy})
						var innerErr error
						err := returns(t, func() error {
							_, err := outer.call(e, bg, "k", func(ctx context.Context) ([]byte, error) {
								_, innerErr = inner.call(e, ctxOf(ctx), "k", okFn("inner"))
								return []byte("outer"), nil
							})
							return err
						})
						require.NoError(t, err)
						require.ErrorIs(t, innerErr, idem.ErrReentrant)
						res, err := e.Do(bg, "k", []byte("fp"), mustNotRun(t))
						require.NoError(t, err)
						require.Equal(t, "outer", string(res.Response), "the outer call's outcome is the key's")
					})
				}
			}
		}
	}
	t.Run("through another key's fn on the same goroutine", func(t *testing.T) {
		e, _ := boltkit.Open(t, nil)
		var innerErr error
		err := returns(t, func() error {
			_, err := e.Do(bg, "a", nil, func(context.Context) ([]byte, error) {
				_, err := e.Do(context.Background(), "b", nil, func(context.Context) ([]byte, error) {
					_, innerErr = e.Do(context.Background(), "a", nil, okFn("inner"))
					return nil, nil
				})
				return nil, err
			})
			return err
		})
		require.NoError(t, err)
		require.ErrorIs(t, innerErr, idem.ErrReentrant)
	})
}

// ErrReentrant says which re-entrance it met: a Do calling itself is not
// "inside DoTx".
func TestReentrantErrorsSayWhy(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	var self, inTx error
	_, err := e.Do(bg, "self", nil, func(ctx context.Context) ([]byte, error) {
		_, self = e.Do(ctx, "self", nil, okFn("v"))
		return nil, nil
	})
	require.NoError(t, err)
	require.ErrorIs(t, self, idem.ErrReentrant)
	require.Contains(t, self.Error(), "its own key")
	require.NotContains(t, self.Error(), "DoTx")

	_, err = e.DoTx(bg, "tx", nil, func(ctx context.Context, _ *idem.Tx) ([]byte, error) {
		_, inTx = e.Do(ctx, "other", nil, okFn("v"))
		return nil, nil
	})
	require.NoError(t, err)
	require.ErrorIs(t, inTx, idem.ErrReentrant)
	require.Contains(t, inTx.Error(), "DoTx")
	require.Equal(t, 1, strings.Count(inTx.Error(), "DoTx"), "said once: %v", inTx)
}

// After a DoTx fn panics, or its commit fails, on a new key nothing is
// stored and the key is free: its waiters lead again rather than being told
// to resolve the key. Only when the call recovered an interrupted execution
// does a record stay that calls for ErrIncomplete.
func TestWaitersAfterADoTxEndsWithoutAnOutcome(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	ends := map[string]func(release <-chan struct{}) (fn func(context.Context, *idem.Tx) ([]byte, error), unset func()){
		"panic": func(release <-chan struct{}) (func(context.Context, *idem.Tx) ([]byte, error), func()) {
			return func(context.Context, *idem.Tx) ([]byte, error) { <-release; panic("boom") }, func() {}
		},
		"failed commit": func(release <-chan struct{}) (func(context.Context, *idem.Tx) ([]byte, error), func()) {
			var once atomic.Bool
			unset := fault.Set("dotx-before-commit", func() error {
				if once.CompareAndSwap(false, true) {
					panic("disk failed") // fails the leader's commit only
				}
				return nil
			})
			return func(context.Context, *idem.Tx) ([]byte, error) { <-release; return []byte("lost"), nil }, unset
		},
	}
	for endName, end := range ends {
		for _, recovering := range []bool{false, true} {
			name := endName + map[bool]string{false: " on a new key", true: " recovering an interrupted execution"}[recovering]
			t.Run(name, func(t *testing.T) {
				e, _ := boltkit.Open(t, nil)
				if recovering {
					_, err := interrupt(e, "k", []byte("fp"))
					require.ErrorIs(t, err, context.Canceled)
				}
				entered, release := make(chan struct{}), make(chan struct{})
				fn, unset := end(release)
				defer unset()
				leader := make(chan error, 1)
				go func() {
					var err error
					defer func() {
						if v := recover(); v != nil {
							err = fmt.Errorf("panicked: %v", v)
						}
						leader <- err
					}()
					_, err = e.DoTx(bg, "k", []byte("fp"), func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
						close(entered)
						return fn(ctx, tx)
					})
				}()
				<-entered
				const n = 3
				type answer struct {
					res idem.Result
					err error
					ran bool
				}
				answers := make(chan answer, n)
				waitersIn(t, n, func() {
					for range n {
						go func() {
							var a answer
							a.res, a.err = e.DoTx(bg, "k", []byte("fp"), func(context.Context, *idem.Tx) ([]byte, error) {
								a.ran = true
								return []byte("from a waiter"), nil
							})
							answers <- a
						}()
					}
				})
				close(release)
				require.Error(t, <-leader, "the leader's caller gets the panic or the failed commit")
				ran := 0
				for range n {
					a := <-answers
					if recovering {
						require.ErrorIs(t, a.err, idem.ErrIncomplete)
						continue
					}
					require.NoError(t, a.err)
					require.Equal(t, "from a waiter", string(a.res.Response))
					if a.ran {
						ran++
					}
				}
				if !recovering {
					require.Equal(t, 1, ran, "one waiter led again, the others replayed its answer")
				}
			})
		}
	}
}
