package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// concurrency holds contract 3: concurrent duplicates run fn once (per-key
// singleflight) and answer from its outcome, or fail fast under
// InFlightFail with an *idem.InProgressError; calls on other keys do not
// wait; a call from fn with its own key is refused, never a deadlock.
func (s *suite[T]) concurrency(t *testing.T) {
	t.Run("singleflight: 200 callers, fn runs once", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, _ := s.fresh(t, Options{})
			var runs atomic.Int32
			release, leader, waiters := s.leaderWithWaiters(t, e, v, "k", 199, func(context.Context, T) ([]byte, error) {
				runs.Add(1)
				return []byte("order-1"), nil
			}, nil)
			close(release)
			l := <-leader
			require.NoError(t, l.err)
			require.False(t, l.res.Replayed)
			for range 199 {
				w := <-waiters
				require.NoError(t, w.err)
				require.Equal(t, "order-1", string(w.res.Response))
				require.True(t, w.res.Replayed)
			}
			require.EqualValues(t, 1, runs.Load())
		})
	})

	t.Run("histories are linearizable", func(t *testing.T) {
		both(t, s.linearizable)
	})

	t.Run("many keys, many callers each, no coordination", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, _ := s.fresh(t, Options{})
			const keys, callers = 50, 4
			var runs [keys]atomic.Int32
			type answer struct {
				key   int
				resp  string
				fresh bool
				err   error
			}
			answers := make(chan answer, keys*callers)
			var wg sync.WaitGroup
			for k := range keys {
				for range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						res, err := call(bg, e, v, fmt.Sprintf("k%02d", k), fp, func(context.Context, T) ([]byte, error) {
							n := runs[k].Add(1)
							return fmt.Appendf(nil, "k%02d run %d", k, n), nil
						})
						answers <- answer{k, string(res.Response), !res.Replayed, err}
					}()
				}
			}
			wg.Wait()
			close(answers)
			fresh := map[int]int{}
			for a := range answers {
				require.NoError(t, a.err)
				require.Equal(t, fmt.Sprintf("k%02d run 1", a.key), a.resp, "every caller gets the one execution's answer")
				if a.fresh {
					fresh[a.key]++
				}
			}
			for k := range keys {
				require.EqualValues(t, 1, runs[k].Load(), "key %d", k)
				require.Equal(t, 1, fresh[k], "one caller per key ran fn")
			}
		})
	})

	t.Run("other keys do not wait", func(t *testing.T) {
		// Do only: a running DoTx fn holds the single writer by design.
		e, _ := s.fresh(t, Options{})
		release, leader, _ := s.leaderWithWaiters(t, e, viaDo, "a", 0, ok[T]("a"), nil)
		done := make(chan outcome, 1)
		go func() { done <- callRecovering(bg, e, viaDo, "b", fp, ok[T]("b")) }()
		select {
		case o := <-done:
			require.NoError(t, o.err)
			require.Equal(t, "b", string(o.res.Response))
		case <-time.After(30 * time.Second): // a bound on a hang
			t.Fatal("a call on key b waited for the running call on key a")
		}
		close(release)
		require.NoError(t, (<-leader).err)
	})

	t.Run("InFlightFail: *InProgressError", func(t *testing.T) {
		for _, retryAfter := range []time.Duration{0, 7 * time.Second} {
			t.Run(fmt.Sprint(retryAfter), func(t *testing.T) {
				both(t, func(t *testing.T, v via) {
					c := newClock()
					e, _ := s.fresh(t, Options{InFlight: idemcore.InFlightFail, RetryAfter: retryAfter, Now: c.Now})
					release, leader, _ := s.leaderWithWaiters(t, e, v, "k", 0, ok[T]("order-1"), nil)
					c.Advance(3 * time.Second)
					_, err := call(bg, e, v, "k", fp, mustNotRun[T](t))
					require.ErrorIs(t, err, idemcore.ErrInProgress)
					var ipe *idemcore.InProgressError
					require.ErrorAs(t, err, &ipe)
					require.Equal(t, start, ipe.StartedAt.UTC(), "when the running call took the key")
					want := retryAfter
					if want == 0 {
						want = idemcore.DefaultRetryAfter
					}
					require.Equal(t, want, ipe.RetryAfter)
					_, err = call(bg, e, v, "k", other, mustNotRun[T](t))
					require.ErrorIs(t, err, idemcore.ErrFingerprintMismatch, "another request conflicts, not in progress")
					close(release)
					require.NoError(t, (<-leader).err, "the running call is unaffected")
					res, err := call(bg, e, v, "k", fp, mustNotRun[T](t))
					require.NoError(t, err)
					require.True(t, res.Replayed, "afterwards: a replay")
				})
			})
		}
	})

	t.Run("operator calls while a call runs", func(t *testing.T) {
		e, _ := s.fresh(t, Options{})
		release, leader, _ := s.leaderWithWaiters(t, e, viaDo, "k", 0, ok[T]("v"), nil)
		require.ErrorIs(t, e.Forget("k"), idemcore.ErrInProgress)
		require.ErrorIs(t, e.Resolve("k", []byte("x"), nil), idemcore.ErrInProgress)
		close(release)
		l := <-leader
		require.NoError(t, l.err)
		require.Equal(t, "v", string(record(t, e, "k").Response), "untouched by the refused operator calls")
	})

	t.Run("fn calls the engine", func(t *testing.T) {
		t.Run("with another key", func(t *testing.T) {
			e, _ := s.fresh(t, Options{})
			res, err := e.Do(bg, "outer", fp, func(ctx context.Context) ([]byte, error) {
				inner, err := e.Do(ctx, "inner", fp, func(context.Context) ([]byte, error) { return []byte("in"), nil })
				return append([]byte("out+"), inner.Response...), err
			})
			require.NoError(t, err)
			require.Equal(t, "out+in", string(res.Response))
			require.Equal(t, "in", string(record(t, e, "inner").Response))
		})
		// With fn's ctx, and with a fresh one (a bound, so that the
		// deadlock this refuses fails the test).
		for name, inner := range map[string]func(ctx context.Context) (context.Context, context.CancelFunc){
			"with its own key and its ctx": func(ctx context.Context) (context.Context, context.CancelFunc) { return ctx, func() {} },
			"with its own key and a fresh ctx": func(context.Context) (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 10*time.Second)
			},
		} {
			t.Run(name, func(t *testing.T) {
				e, _ := s.fresh(t, Options{})
				res, err := e.Do(bg, "k", fp, func(ctx context.Context) ([]byte, error) {
					ctx, cancel := inner(ctx)
					defer cancel()
					_, err := e.Do(ctx, "k", fp, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
					if !errors.Is(err, idemcore.ErrReentrant) {
						return nil, fmt.Errorf("inner call: %v, want ErrReentrant", err)
					}
					return []byte("ok"), nil
				})
				require.NoError(t, err)
				require.Equal(t, "ok", string(res.Response))
			})
		}
		t.Run("the refusal of its own key says so", func(t *testing.T) {
			e, _ := s.fresh(t, Options{})
			var inner error
			_, err := e.Do(bg, "k", fp, func(ctx context.Context) ([]byte, error) {
				_, inner = e.Do(ctx, "k", fp, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
				return []byte("ok"), nil
			})
			require.NoError(t, err)
			require.ErrorIs(t, inner, idemcore.ErrReentrant)
			require.NotContains(t, inner.Error(), "DoTx", "Do calling itself is not a call from inside DoTx")
		})
	})
}
